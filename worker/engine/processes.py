"""The long-running commands of ``aidawork``: migrate, worker, beat, flower, api, webhooks.

Each writes only JSON log lines (``worker.ops.logging``): the CLI configures logging before
any of these runs, Celery is told to leave logging alone (``setup_logging`` has a
receiver) and to print no banner (``--quiet``; the banner's facts are in the
``worker_started`` line instead), and Tornado (Flower) is told not to add its own handler
(``--logging=none``; Flower's own banner is log lines, kept). A refusal to start is a
JSON ``start_refused`` line (``refuse_start``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import TYPE_CHECKING, Annotated, Protocol

import structlog
import typer

from schema.store.compat import SchemaIncompatible
from worker.ops.settings import Settings, get_settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

log = structlog.get_logger("aidawork.cli")


def refuse_start(command: str, message: str, code: int) -> int:
    """A long-running command that will not start says why in one JSON line; ``code`` is
    its exit code."""
    log.error("start_refused", command=command, error=message, exit_code=code)
    return code


def aidawork_version() -> str:
    """The installed package's version (``aidawork --version``)."""
    try:
        return package_version("aidawork")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


def _celery_keeps_our_logging() -> None:
    # Celery configures logging only when no receiver of setup_logging is connected; this
    # receiver does nothing, so worker.ops.logging's JSON handler stays the only one.
    from celery.signals import setup_logging

    setup_logging.connect(_leave_logging_alone, weak=False)


def _leave_logging_alone(**_: object) -> None:
    return None


def _celery_says_json() -> None:
    # The worker's shutdown notices ("worker: Warm shutdown (MainProcess)") and its SIGUSR1
    # stack dump bypass logging: celery.apps.worker.safe_say writes plain text straight to
    # a file descriptor, from a signal handler. Ours writes one JSON line the same way
    # (os.write, no logging lock taken inside a signal handler).
    import celery.apps.worker as celery_worker

    celery_worker.safe_say = _say_as_json


def _say_as_json(msg: str, f: object = None) -> None:
    line = {
        "event": msg.strip(),
        "logger": "celery.apps.worker",
        "level": "warning",
        "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    with contextlib.suppress(OSError):  # as Celery's: losing the notice must not stop the shutdown
        os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, (json.dumps(line) + "\n").encode())


# The cyclic garbage collector of a worker process, set once its consumer is ready. A
# worker at a high concurrency holds hundreds of rounds at once, each alive for its model
# call: with Python's default first threshold (700 net allocations) a collection came every
# few rounds and walked objects that were nearly all still alive. In a run of 512 x 3
# rounds at 1 s turns that cost 0.40-0.72 s of the worker's CPU after it was ready (0.26-0.47
# ms per round), with two full collections of 130-190 ms that stop every thread. The
# start-up objects (imports, Celery, the pools) are moved out of the collector's sight
# (gc.freeze) and it runs after 10,000 net allocations: 0.04-0.24 s, no full collection.
GC_THRESHOLDS = (10_000, 20, 10)
# How long the pool's threads may take to start, all of them (512: about 0.14 s).
POOL_START_TIMEOUT_S = 30.0


def _when_ready() -> None:
    from celery.signals import worker_ready

    worker_ready.connect(_on_ready, weak=False)


class _Pool(Protocol):  # what is used of Celery's worker pool
    limit: int

    @property
    def info(self) -> Mapping[str, object]: ...


class _Consumer(Protocol):  # what is used of the worker's consumer
    pool: _Pool


def _on_ready(sender: _Consumer, **_: object) -> None:  # sender: the worker's consumer
    _start_pool_threads(sender.pool)
    _tune_gc()


def _start_pool_threads(pool: _Pool) -> None:
    """Every thread of the threads pool started now, before the first message. Celery's
    pool (a ThreadPoolExecutor) starts a thread only when a task finds none idle, on the
    consumer's own thread, and each start waits until the new thread has run: a worker
    started into a backlog paid for its threads one by one in its first burst of rounds,
    competing with them for the GIL. Here each thread runs one task that waits until all
    have started (512 threads: about 0.14 s, before the worker takes a message)."""
    executor = getattr(pool, "executor", None)
    if executor is None:  # not the threads pool
        return
    started = time.monotonic()
    barrier = threading.Barrier(pool.limit + 1)
    for _ in range(pool.limit):
        executor.submit(barrier.wait, POOL_START_TIMEOUT_S)
    try:
        barrier.wait(POOL_START_TIMEOUT_S)
    except threading.BrokenBarrierError:  # the rest start as Celery starts them
        log.warning("pool_threads_not_started", timeout_s=POOL_START_TIMEOUT_S)
        return
    log.info("pool_threads_started", threads=pool.info["threads"], took_s=round(time.monotonic() - started, 3))


def _tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.info("gc_tuned", frozen_objects=gc.get_freeze_count(), thresholds=list(GC_THRESHOLDS))


def cmd_migrate(
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="apply a migration that breaks live workers of an older code level (they stop claiming)"
        ),
    ] = False,
) -> int:
    from schema.migrate import ensure_database, upgrade_head

    settings = get_settings()
    url = settings.database_url
    created = ensure_database(url)
    # A worker is live while it heartbeats: one that said nothing for a lease has died.
    upgrade_head(url, force=force, live_s=settings.lease_s)
    log.info("database_migrated", created=created, revision="head", forced=force)
    return 0


def worker_node_name(name: str) -> str:
    """``AIDAWORK_WORKER_NAME`` with Celery's ``%h`` (and ``%n``, ``%d``) expanded."""
    from celery.utils.nodenames import default_nodename, host_format

    return str(host_format(default_nodename(name)))


def cmd_worker(concurrency: int | None = None) -> int:
    """``concurrency``: threads (default ``AIDAWORK_WORKER_CONCURRENCY``)."""
    from worker.engine.bootstrap import get_context, serve_metrics, set_process_threads
    from worker.ops.celery_app import get_app, round_queues

    settings = get_settings()
    concurrency = concurrency or settings.worker_concurrency
    set_process_threads(concurrency)
    node = worker_node_name(settings.worker_name)
    # In the workers registry from the start, so a death even before its first round is
    # seen (schema.store.workers); a warm shutdown says it stopped on purpose. With the
    # database unavailable the worker starts all the same and registers at its first claim.
    leases = get_context().leases
    try:
        leases.register()
    except SchemaIncompatible:
        raise  # a worker older than the schema does not start: main() says why (start_refused)
    except Exception as exc:
        log.warning("worker_registration_deferred", error=type(exc).__name__)
    # Should a breaking migration be applied under it (--force), it stops as on SIGTERM.
    leases.on_incompatible(_shut_down_warm)
    serve_metrics(get_context())  # before Celery starts: a port in use fails the start, loudly
    _celery_keeps_our_logging()
    _celery_says_json()
    _when_ready()
    queues = round_queues(settings)
    log.info("worker_started", node=node, concurrency=concurrency, queues=len(queues), version=aidawork_version())
    try:
        get_app().start(
            [
                "--quiet",  # no ASCII banner on stdout: its facts are in worker_started
                "worker",
                "--pool=threads",
                f"--concurrency={concurrency}",
                f"--queues={','.join(queues)}",
                f"--hostname={node}",
                f"--loglevel={settings.log_level}",
                # No --task-events: Flower turns them on (enable_events, worker.ops.celery_app).
                "--without-mingle",
                "--without-gossip",
            ]
        )
    finally:
        leases.stop()
    return 0


def _shut_down_warm() -> None:
    # Celery's warm shutdown: the rounds in flight finish, the messages held go back.
    os.kill(os.getpid(), signal.SIGTERM)


def cmd_beat() -> int:
    from worker.client.context import build_client_context
    from worker.engine.reconcile import reconcile_periodically

    # The reconciler needs the store and the broker, not the MCP servers a worker talks to.
    settings = get_settings().model_copy(update={"mcp_servers": {}})
    ctx = build_client_context(settings, threads=1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "beat_started", reconcile_interval_s=settings.reconcile_interval_s,
        worker_dead_after_s=settings.worker_dead_after_s, version=aidawork_version(),
    )
    pruner = _start_retention(ctx.engine, settings, stop)
    passes = reconcile_periodically(ctx, stop)
    if pruner is not None:
        pruner.join(timeout=30)  # a batch in flight is one transaction: let it commit
    log.info("beat_stopped", passes=passes)
    ctx.engine.dispose()
    return 0


def _start_retention(engine: Engine, settings: Settings, stop: threading.Event) -> threading.Thread | None:
    """Beat's retention passes (AIDAWORK_RETENTION_DAYS), in a thread beside the reconciler."""
    from worker.ops.retention import prune_periodically

    if settings.retention_days is None:
        return None
    thread = threading.Thread(
        target=prune_periodically,
        kwargs={
            "engine": engine,
            "older_than_days": settings.retention_days,
            "batch_runs": settings.retention_batch_runs,
            "interval_s": settings.retention_interval_s,
            "stop": stop,
        },
        name="retention",
        daemon=True,
    )
    thread.start()
    log.info(
        "retention_scheduled",
        retention_days=settings.retention_days,
        interval_s=settings.retention_interval_s,
        batch_runs=settings.retention_batch_runs,
    )
    return thread


def cmd_flower(port: int, address: str) -> int:
    from worker.ops.celery_app import get_app

    settings = get_settings()
    # Flower's banner is log lines (JSON here), so it is kept, unlike Celery's printed ones.
    argv = ["flower", f"--port={port}", f"--address={address}", "--logging=none"]
    if settings.flower_basic_auth is not None:
        # In-process: the credentials never appear on a command line (ps) or in a log.
        argv.append(f"--basic-auth={settings.flower_basic_auth.get_secret_value()}")
    log.info(
        "flower_started",
        address=address,
        port=port,
        basic_auth=settings.flower_basic_auth is not None,
        version=aidawork_version(),
    )
    get_app().start(argv)
    return 0


def cmd_webhooks() -> int:
    from schema.store.tx import make_engine
    from worker.ops.webhooks.deliverer import Deliverer

    settings = get_settings()
    if settings.webhook_secret is None:
        return refuse_start(
            "webhooks", "AIDAWORK_WEBHOOK_SECRET is not set: deliveries are signed with it (16+ characters)", 2
        )
    stop = threading.Event()
    # A stop finishes the attempts in flight (each bounded by its timeout), then exits.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # One connection per delivery thread, one for claims and one that LISTENs.
    engine = make_engine(
        settings.database_url,
        pool_size=settings.webhook_concurrency + 2,
        prepared_statements=not settings.database_pgbouncer,
    )
    try:
        Deliverer(engine, settings).run(stop)
    finally:
        engine.dispose()
    return 0

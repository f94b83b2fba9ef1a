"""The Celery app and its delivery semantics, decided once, here.

- The broker is only the doorbell: PostgreSQL holds every run, and the reconciler
  re-sends what a lost message or a crashed worker left behind.
- ``task_acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only
  after its round committed (or was dropped as stale). Redelivery is harmless: a claim at
  a boundary that has moved on, or while another holder's lease is live, changes nothing
  and is dropped.
- No ack emulation in Redis (the transport's ``ack_emulation`` off): the messages a
  worker has taken and not acknowledged are kept in its memory only, not copied to
  kombu's ``unacked`` hash with one MULTI/EXEC on every delivery and another on every
  ack (two Redis round trips per round, about a tenth of a worker's CPU per round,
  py-spy). A worker that stops (SIGTERM, a lost broker connection) puts them back in
  their queue, as before. A worker that is killed loses them: the broker would have
  restored them only after its visibility timeout (an hour), long after the reconciler
  re-sent the run (its lease expired, or the dispatch grace passed), so nothing is lost
  that PostgreSQL does not hold.
- Prefetch multiplier 1: a worker reserves one message per free thread, so a slow
  round never holds a backlog hostage.
- JSON only, and task arguments are ids only (run id, boundary), so Flower never shows
  prompts, file bodies or secrets.
- Task events only while a monitor asks for them: off by default
  (``worker_send_task_events``), so a round publishes none. Flower turns them on at every
  worker with the ``enable_events`` broadcast, every 5 s while it runs, the first 5 s
  after it starts (its ``--enable_events`` option, on by default), so workers started
  later get it too; from then on Flower sees every task from received to succeeded or failed. They stay on in a
  worker until it restarts or is sent ``disable_events`` (``celery -b <broker>
  control disable_events``; ``enable_events`` turns them on without Flower). The worker's
  heartbeat (Celery's ``worker-heartbeat`` event, every 2 s, not per round) keeps its event
  dispatcher open, which is what lets the broadcast turn task events on. No
  ``task-sent`` event (``task_send_sent_event`` off): it would cost every round one more
  event publish (about 4 % of a worker's CPU per round) to say what ``task-received``
  says a moment later; a task Flower lists is one a worker took. When on, the worker
  sends its task events in batches, every 0.1 s (``worker.engine.consumer``), not one
  message per event. The only tasks are rounds (run and resume): the reconciler is no
  task, it runs inside ``aidawork beat`` on its timer (``worker.engine.reconcile``), so
  Flower lists work, not ticks.
- No result backend: outcomes live in PostgreSQL.
- Fair share and priorities (``runtime.shares``): AIDAWORK_ROUND_QUEUES round queues
  (``aidawork.rounds.0`` ...), all consumed by every worker, served one message per turn
  in rotation (``worker.engine.broker``); a run's rounds go to its owner's queues, each send
  with the run's priority (10 priority steps: one per ``runs.priority``).
- A task is published once, without retries, on a producer taken from the app's pool
  (``Dispatcher._send``: Celery's own message, ``create_task_message`` and
  ``send_task_message``, without ``send_task``'s per-call work a round has no use for:
  routing, the result object, options merging; about a third of a round's publishing
  CPU, measured alone). If that fails, the same task goes through ``send_task``, which
  retries for a few seconds while the broker is unreachable (``PUBLISH_RETRY_POLICY``; a
  first try that did reach the broker makes a duplicate, which its claim drops); past
  that, ``send_or_defer`` marks the run due for the reconciler's next pass, so a run moves
  again seconds after the broker is back, not after the dispatch grace.
- A round waiting for its provider rate limit (``worker.ops.rate_limits``) is given back and
  re-sent with a ``countdown`` (``Dispatcher.round``). On the Redis transport a countdown
  is no delayed queue: the message is delivered at once, and the worker that gets it holds
  it unacknowledged in memory, on its timer, until the eta (Celery raises the prefetch
  count for each such message, so it holds no thread and blocks no other message). If that
  worker dies, the message dies with it; the run's ``dispatched_at`` was set to the eta
  when the claim was given back, so the reconciler re-sends it after the eta plus the
  dispatch grace. Countdowns are capped (``worker.ops.rate_limits.MAX_COUNTDOWN_S``), so a
  worker holds no message for long.
- Two fast paths override private methods of kombu and Celery: the Redis transport
  (``worker.engine.broker``) and the worker's consumer (``worker.engine.consumer``). They
  are used only with the versions they were tested with (``TESTED``, pinned the same in
  pyproject.toml); with any other installed version the stock classes are used, with a
  ``broker_overrides_disabled`` warning, and ``AIDAWORK_STOCK_BROKER`` selects the stock
  classes whatever the versions (``fast_paths``). CI runs the e2e suite once that way.
- A lost broker connection is retried every ``RECONNECT_MAX_S`` at most (``BrokerConnection``),
  not on kombu's backoff to 30 s between attempts, so a worker is back about a second
  after its Redis (or Sentinel's new master) is.
- No app is built at import time: ``create_app(settings)`` builds one from the settings it
  is given, ``app_for`` keeps one per broker per process (publishing reuses its
  connections), and ``get_app()`` is this process's, from the environment, on first use
  (``aidawork worker/beat/flower`` and ``worker.engine.tasks``). Code sends tasks through a
  context's ``Dispatcher`` (``worker.client.context``), bound to that context's broker.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from functools import partial
from importlib.metadata import version as package_version
from typing import TypedDict
from uuid import UUID, uuid4

import structlog
from celery import Celery
from celery.app.amqp import AMQP as CeleryAMQP
from kombu.connection import Connection

from runtime.shares import broker_priority, queue_index
from schema.store.leases import Due
from schema.store.port import StorePort
from schema.wire import OriginalToolRoundResume
from schema.wire.json import JsonValue
from schema.wire.route import MAX_PRIORITY, Route
from worker.ops.redis_clients import redis_url, sentinel_url
from worker.ops.settings import Settings, get_settings

log = structlog.get_logger("aidawork.dispatch")

ROUNDS_QUEUE = "aidawork.rounds"  # the prefix of the round queues' names
RUN_ROUND_TASK = "aidawork.run_round"
RESUME_ROUND_TASK = "aidawork.resume_round"

# kombu's publish retries on a lost broker connection: about 8 s in all, then the caller
# defers to the reconciler (a round thread is not held longer than that).
PUBLISH_RETRY_POLICY = {"max_retries": 10, "interval_start": 0, "interval_step": 0.5, "interval_max": 1.0}


# A lost broker connection is retried every second at most (kombu's own default waits 2 s,
# then 4, 6, ... up to 30 s between attempts: a worker whose Redis was gone a few seconds
# came back up to that much after it, 4 s after a 2 s outage, measured). An attempt at a
# Redis that is not there yet is one refused connection, or one question to each sentinel.
RECONNECT_START_S, RECONNECT_STEP_S, RECONNECT_MAX_S = 0.2, 0.2, 1.0


class BrokerConnection(Connection):
    """kombu's connection, reconnecting on ``RECONNECT_*`` unless told otherwise: every
    process's Celery app (the worker's consumer, beat's and the API's publishers) makes
    its broker connections with it (``AMQP``)."""

    def ensure_connection(
        self, errback: object = None, max_retries: int | None = None, interval_start: float = RECONNECT_START_S,
        interval_step: float = RECONNECT_STEP_S, interval_max: float = RECONNECT_MAX_S, **options: object,
    ) -> Connection:
        connection: Connection = super().ensure_connection(  # type: ignore[no-untyped-call]
            errback, max_retries, interval_start, interval_step, interval_max, **options
        )
        return connection


class AMQP(CeleryAMQP):  # type: ignore[misc]
    Connection = BrokerConnection
    BrokerConnection = BrokerConnection


# One broker priority step per run priority, so 0-9 all order (kombu's default has four).
PRIORITY_STEPS = list(range(MAX_PRIORITY + 1))


def round_queue(index: int) -> str:
    return f"{ROUNDS_QUEUE}.{index}"


def round_queues(settings: Settings) -> list[str]:
    """Every round queue, in index order: what a worker consumes."""
    return [round_queue(i) for i in range(settings.round_queues)]


def redis_broker(settings: Settings) -> bool:
    """Whether the broker is Redis, one server or behind Sentinel (``worker.ops.redis_clients``)."""
    return redis_url(settings.broker_url)


# The versions of the libraries whose private methods worker.engine.broker and
# worker.engine.consumer override, as tested: at least the first, below the second.
# pyproject.toml pins the same ranges.
TESTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "kombu": ((5, 7), (5, 8)),
    "celery": ((5, 7), (5, 8)),
}
STOCK_CONSUMER = "celery.worker.consumer:Consumer"  # Celery's default worker_consumer


def installed_version(package: str) -> str:
    return package_version(package)


def _release(version: str) -> tuple[int, ...]:
    """``5.7.0`` -> (5, 7, 0); a pre-release's leading numbers (``5.8.0rc1`` -> (5, 8, 0))."""
    leading = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in leading.group().split(".")) if leading else ()


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def untested_versions() -> dict[str, str]:
    """The installed kombu and Celery versions outside ``TESTED`` (name: version)."""
    found = {}
    for package, (lowest, below) in TESTED.items():
        version = installed_version(package)
        if not lowest <= _release(version) < below:
            found[package] = version
    return found


def fast_paths(settings: Settings) -> bool:
    """Whether this process uses aidawork's transport and consumer (see the docstring):
    not with ``AIDAWORK_STOCK_BROKER``, nor with untested kombu or Celery versions (then
    with a warning)."""
    if settings.stock_broker:
        return False
    untested = untested_versions()
    if untested:
        tested = {name: f">={_dotted(low)},<{_dotted(high)}" for name, (low, high) in TESTED.items()}
        log.warning("broker_overrides_disabled", installed=untested, tested=tested,
                    detail="kombu's stock Redis transport and Celery's stock consumer are used instead")
        return False
    return True


def broker_transport(settings: Settings, fast: bool) -> str | None:
    """Our Redis transport (``worker.engine.broker``), plain or over Sentinel, or None:
    the broker URL's stock transport (kombu's ``sentinel://`` one is its SentinelTransport)."""
    if not fast or not redis_broker(settings):
        return None
    sentinel = sentinel_url(settings.broker_url)
    return "worker.engine.broker:SentinelTransport" if sentinel else "worker.engine.broker:Transport"


def transport_options(settings: Settings) -> dict[str, object]:
    options: dict[str, object] = {
        # No unacked copies in Redis, so no visibility timeout (see the docstring).
        "ack_emulation": False,
        "priority_steps": PRIORITY_STEPS,
        "queue_order_strategy": "round_robin",
    }
    if sentinel_url(settings.broker_url):
        # The master's group; the sentinels asked with the same timeouts as every other
        # client of the process (worker.ops.redis_clients).
        timeout_s = settings.sentinel_timeout_s
        timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        options.update(master_name=settings.sentinel_master, sentinel_kwargs=timeouts)
    return options


def create_app(settings: Settings) -> Celery:
    """A Celery app on ``settings.broker_url``, with the delivery semantics above."""
    fast = fast_paths(settings)
    app = Celery("aidawork", set_as_current=False, amqp="worker.ops.celery_app:AMQP")
    app.conf.update(
        broker_url=settings.broker_url,
        # kombu's Redis transport, reusing one client per channel (worker/engine/broker.py);
        # None: the broker URL's stock transport.
        broker_transport=broker_transport(settings, fast),
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport_options(settings),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=False,  # until a monitor broadcasts enable_events (see above)
        # Task events flushed on a timer (worker/engine/consumer.py), or Celery's own.
        worker_consumer="worker.engine.consumer:Consumer" if fast else STOCK_CONSUMER,
        task_send_sent_event=False,  # see the module's docstring
        task_publish_retry=True,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=round_queue(0),
        # Logging is worker.ops.logging's (JSON lines); Celery leaves the root logger and
        # stdout alone.
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        include=["worker.engine.tasks"],
    )
    return app


_apps: dict[tuple[str, str | None], Celery] = {}
_apps_lock = threading.Lock()


def app_for(settings: Settings) -> Celery:
    """The app of this process for ``settings``' broker, built once."""
    key = (settings.broker_url, settings.sentinel_master)
    with _apps_lock:
        if key not in _apps:
            _apps[key] = create_app(settings)
        return _apps[key]


def get_app() -> Celery:
    """This process's app, from the environment (AIDAWORK_BROKER_URL), built on first use."""
    return app_for(get_settings())


def __getattr__(name: str) -> Celery:
    # ``from worker.ops.celery_app import app``: this process's app, built when first asked for, not
    # when the module is imported (worker.engine.tasks registers its tasks on it).
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



class _PublishOptions(TypedDict, total=False):
    declare: list[object]  # the entities to declare before the publish (none: [])


class Dispatcher:
    """Sends the round and resume tasks on one app's broker. Send only after the state a
    task depends on committed; ``send_or_defer`` covers a broker that stays down."""

    def __init__(self, app: Celery, queues: int, *, declare_queues: bool = True) -> None:
        self.app = app
        self.queues = queues  # AIDAWORK_ROUND_QUEUES
        # ``declare_queues=False`` on Redis (``redis_broker``): there a round is an LPUSH to
        # its queue's list (the anonymous exchange, no binding to look up), and declaring
        # the queue again before every publish, as Celery does unless told otherwise, only
        # costs CPU (about 2 % of a worker's per round). On another broker a queue must
        # exist to take a message: the declaration stays.
        self._round_options: _PublishOptions = {} if declare_queues else {"declare": []}

    def round(self, run_id: UUID, boundary_seq: int, route: Route, *, countdown_s: float | None = None) -> None:
        """Send the task for one round, to its owner's share at the run's priority
        (``countdown_s``: to run no sooner than that)."""
        queue = round_queue(queue_index(route, run_id, boundary_seq, self.queues))
        args: list[JsonValue] = [str(run_id), boundary_seq]
        # argsrepr: what Celery's saferepr would make of these two plain values (Flower
        # shows it), without its generic walk over them.
        self._send(
            RUN_ROUND_TASK, args, queue=queue, priority=broker_priority(route.priority), countdown=countdown_s,
            argsrepr=repr(args), **self._round_options,
        )
        if countdown_s is None:
            log.info("round_enqueued", next_run_id=str(run_id), next_boundary_seq=boundary_seq, queue=queue)
        else:
            log.info("round_enqueued", next_run_id=str(run_id), next_boundary_seq=boundary_seq, queue=queue,
                     countdown_s=round(countdown_s, 3))

    def _send(
        self, name: str, args: Sequence[JsonValue], *, countdown: float | None = None, argsrepr: str | None = None,
        **options: object,
    ) -> None:
        """Publish task ``name`` with ``options`` (queue, priority, declare): once, on a
        producer from the app's pool, in the message Celery's ``send_task`` builds (its
        parent and root the task sending it, for Flower); if that fails, through
        ``send_task`` itself, with its retries. A countdown goes through ``send_task`` at
        once (it sets the eta)."""
        if countdown is None:
            try:
                self._send_once(name, args, argsrepr, options)
                return
            except Exception as exc:
                log.warning("publish_retried", task=name, error=type(exc).__name__)
        self.app.send_task(name, args=args, countdown=countdown, argsrepr=argsrepr, kwargsrepr="{}", **options)

    def _send_once(
        self, name: str, args: Sequence[JsonValue], argsrepr: str | None, options: dict[str, object]
    ) -> None:
        app = self.app
        parent = app.current_worker_task
        request = parent.request if parent is not None else None
        message = app.amqp.create_task_message(
            str(uuid4()), name, args, {}, reply_to=app.thread_oid, argsrepr=argsrepr, kwargsrepr="{}",
            root_id=(request.root_id or request.id) if request else None, parent_id=request.id if request else None,
            ignore_result=None,
        )
        with app.producer_pool.acquire(block=True) as producer:
            app.amqp.send_task_message(producer, name, message, retry=False, **options)

    def resume(self, resumes: Sequence[OriginalToolRoundResume], route: Route) -> None:
        """Send the resume of a suspended round (its inputs are all stored), routed as
        its rounds are. The payload is the resume tokens: ids, digests and proofs, no
        file bodies."""
        first = resumes[0]
        queue = round_queue(queue_index(route, first.run_id, first.boundary_seq, self.queues))
        self._send(RESUME_ROUND_TASK, [[r.model_dump(mode="json") for r in resumes]], queue=queue,
                   priority=broker_priority(route.priority))
        log.info(
            "resume_enqueued",
            next_run_id=str(first.run_id),
            next_boundary_seq=first.boundary_seq,
            tool_call_ids=[r.tool_call_id for r in resumes],
            queue=queue,
        )


def send_or_defer(store: StorePort, run_id: UUID, send: Callable[[], None]) -> bool:
    """Send a task whose state is committed; if the broker stays unreachable past the
    publish retries, make the run due for the reconciler's next pass instead of failing
    (failing would only redo a round that is already committed)."""
    try:
        send()
        return True
    except Exception as exc:
        log.warning("dispatch_deferred", run_id=str(run_id), error=type(exc).__name__)
        store.dispatch_failed(run_id)
        return False


def send_due(store: StorePort, dispatch: Dispatcher, due: Due) -> None:
    """Send a run the task it is due: the resume of its suspended round whose inputs have
    all arrived, or the round at its boundary."""
    resumes = store.pending_resumes(due.run_id) if due.resume else []
    if resumes:
        send_or_defer(store, due.run_id, partial(dispatch.resume, resumes, due.route))
    else:
        send_or_defer(store, due.run_id, partial(dispatch.round, due.run_id, due.boundary_seq, due.route))


def send_next_runs(store: StorePort, dispatch: Dispatcher, run_ids: Sequence[UUID], owner: str | None = None) -> None:
    """Send each queued run a statement named as the next to start (its Root's turn came,
    or a slot of its owner's cap freed); each one's claim decides whether it may."""
    for run_id in run_ids:
        send_due(store, dispatch, store.due_of(run_id, owner))

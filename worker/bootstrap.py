"""The composition root: builds the Runtime, engine and lease keeper once per process."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog
from sqlalchemy import Engine

from runtime.deps import DEV_SECRET, Runtime, build_runtime
from runtime.models.keys import ModelKeys, NamedKey
from schema.store.tx import make_engine
from worker.leases import LeaseKeeper
from worker.logging import configure_logging
from worker.settings import Settings, get_settings


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    engine: Engine
    runtime: Runtime
    leases: LeaseKeeper


_context: WorkerContext | None = None
_threads: int | None = None
_lock = threading.Lock()


def set_process_threads(threads: int) -> None:
    """Called by ``aidawork worker`` before Celery starts: the context built later sizes
    its connection pool from the concurrency the worker really runs with."""
    global _threads
    _threads = threads


def pool_size_for(threads: int, cap: int) -> int:
    """Connections for a process running ``threads`` rounds at once: one each, plus the
    heartbeat and one spare, never more than ``cap`` (AIDAWORK_DATABASE_POOL_MAX). With
    N worker processes a deployment opens at most N x cap connections."""
    return max(1, min(threads + 2, cap))


def build_context(settings: Settings, threads: int | None = None) -> WorkerContext:
    """``threads``: how many rounds this process runs at once (a worker's --concurrency);
    AIDAWORK_WORKER_CONCURRENCY when not given."""
    engine = make_engine(
        settings.database_url,
        pool_size=pool_size_for(threads or settings.worker_concurrency, settings.database_pool_max),
        pool_timeout_s=settings.database_pool_timeout_s,
        prepared_statements=not settings.database_pgbouncer,
    )
    # Workers warn at start-up when the secret is unset (cli.cmd_worker); clients never sign.
    secret = DEV_SECRET if settings.secret_key is None else settings.secret_key.get_secret_value().encode()
    return WorkerContext(
        settings=settings,
        engine=engine,
        runtime=build_runtime(
            secret=secret,
            model_keys=ModelKeys(
                openai=settings.openai_api_key,
                anthropic=settings.anthropic_api_key,
                named={n: NamedKey(k, frozenset(o)) for n, (k, o) in settings.named_model_keys.items()},
                base_urls=tuple(settings.model_base_urls),
            ),
        ),
        leases=LeaseKeeper(engine, lease_s=settings.lease_s, interval_s=settings.heartbeat_interval_s),
    )


def get_context() -> WorkerContext:
    """This process's context, built on first use from the environment."""
    global _context
    if _context is None:
        with _lock:
            if _context is None:
                settings = get_settings()
                if not structlog.is_configured():  # the CLI configures its own, quieter
                    configure_logging(settings.log_level)
                _context = build_context(settings, _threads)
    return _context

"""The worker's composition root: a client context (``worker.client_context``) plus the
lease keeper, built once per worker process (``get_context``, used by ``worker.tasks``).
The HTTP API and the client library never build one."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog

from schema.store.store import Store
from worker.app import Dispatcher, app_for
from worker.client_context import ClientContext, engine_for, pool_size_for, runtime_for
from worker.leases import LeaseKeeper
from worker.logging import configure_logging
from worker.settings import Settings, get_settings

__all__ = ["WorkerContext", "build_context", "get_context", "pool_size_for", "set_process_threads"]


@dataclass(frozen=True)
class WorkerContext(ClientContext):
    """A client context that also claims rounds: its lease keeper heartbeats them and is
    the process's entry in the workers registry."""

    leases: LeaseKeeper


_context: WorkerContext | None = None
_threads: int | None = None
_lock = threading.Lock()


def set_process_threads(threads: int) -> None:
    """Called by ``aidawork worker`` before Celery starts: the context built later sizes
    its connection pool from the concurrency the worker really runs with."""
    global _threads
    _threads = threads


def build_context(settings: Settings, threads: int | None = None) -> WorkerContext:
    """``threads``: how many rounds this process runs at once (a worker's --concurrency);
    AIDAWORK_WORKER_CONCURRENCY when not given."""
    engine = engine_for(settings, threads)
    return WorkerContext(
        settings=settings,
        engine=engine,
        store=Store(engine),
        runtime=runtime_for(settings),
        dispatch=Dispatcher(app_for(settings)),
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

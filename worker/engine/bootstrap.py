"""The worker's composition root: a client context (``worker.client.context``) plus the
lease keeper, built once per worker process (``get_context``, used by ``worker.engine.tasks``).
The HTTP API and the client library never build one."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.client.context import ClientContext, ProcessContext, build_client_context, pool_size_for
from worker.engine.leases import LeaseKeeper
from worker.ops.deltas import DeltaSink, publisher_for
from worker.ops.observability.metrics import serve
from worker.ops.observability.rounds import Observability
from worker.ops.observability.tracing import process_tracing
from worker.ops.rate_limits import RateLimiter, limiter_for
from worker.ops.redis_clients import redis_target
from worker.ops.settings import Settings

__all__ = ["WorkerContext", "build_context", "get_context", "pool_size_for", "serve_metrics", "set_process_threads"]


@dataclass(frozen=True)
class WorkerContext(ClientContext):
    """A client context that also claims rounds: its lease keeper heartbeats them and is
    the process's entry in the workers registry."""

    leases: LeaseKeeper
    # Where the rounds' model deltas go (Redis pub/sub); None: the broker is not Redis,
    # and model calls do not stream.
    deltas: DeltaSink | None = None
    # The process's metrics (one registry for all its threads) and tracing.
    observe: Observability = field(default_factory=Observability.off)
    # The fleet's provider rate limits (AIDAWORK_MODEL_RATE_LIMITS); None: none are set.
    rate_limits: RateLimiter | None = None


_threads: int | None = None


def set_process_threads(threads: int) -> None:
    """Called by ``aidawork worker`` before Celery starts: the context built later sizes
    its connection pool from the concurrency the worker really runs with."""
    global _threads
    _threads = threads


def build_context(settings: Settings, threads: int | None = None) -> WorkerContext:
    """``threads``: how many rounds this process runs at once (a worker's --concurrency);
    AIDAWORK_WORKER_CONCURRENCY when not given."""
    client = build_client_context(settings, threads)
    leases = LeaseKeeper(
        client.engine, lease_s=settings.lease_s, interval_s=settings.worker_heartbeat_s, renew_s=settings.lease_renew_s
    )
    target = redis_target(settings)
    deltas = publisher_for(target) if target is not None else None
    observe = Observability.for_process(settings, client.runtime, process_tracing(settings, "aidawork-worker"))
    return WorkerContext(
        **vars(client), leases=leases, deltas=deltas, observe=observe, rate_limits=limiter_for(settings)
    )


def serve_metrics(ctx: WorkerContext) -> None:
    """Serve the process's registry on AIDAWORK_METRICS_PORT, when it is set."""
    if ctx.settings.metrics_port is not None:
        serve(ctx.observe.metrics.registry, ctx.settings.metrics_port, ctx.settings.metrics_host)


_worker_context = ProcessContext(lambda settings: build_context(settings, _threads))


def get_context() -> WorkerContext:
    """This process's context, built on first use from the environment."""
    return _worker_context.get()

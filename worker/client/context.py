"""The client's composition root: what ``worker.client`` (and so the HTTP API and the
CLI's client commands) needs, and nothing a worker needs besides.

A client validates a request, stores it and rings the doorbell: it needs an engine, the
checks a run's config must pass (``Runtime``: the providers with the deployment's keys
and base URLs, and the tool registry; pure, no threads, no sockets) and a
``Dispatcher`` on its own broker. It holds no lease keeper, registers no worker and
never signs a round (``worker.engine.bootstrap`` builds the worker's context on top of this).
Nothing is built at import time: ``build_client_context(settings)`` builds one from
the settings given; ``get_client_context()`` is this process's, from the environment,
on first use."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Generic, TypeVar
from uuid import UUID

import structlog
from sqlalchemy import Engine

from runtime.deps import DEV_SECRET, Runtime, build_runtime
from runtime.models.keys import ModelKeys, NamedKey
from runtime.plugins import process_plugins
from schema.store.port import StorePort
from schema.store.store import Store
from schema.store.tx import make_engine
from worker.ops.celery_app import Dispatcher, app_for, redis_broker, send_or_defer
from worker.ops.logging import configure_logging
from worker.ops.settings import Settings, get_settings

if TYPE_CHECKING:
    from runtime.toolsets.mcp_sessions import McpToolset


@dataclass(frozen=True)
class ClientContext:
    settings: Settings
    engine: Engine
    store: StorePort  # the store operations on ``engine`` (what the worker shell calls)
    runtime: Runtime
    dispatch: Dispatcher


def pool_size_for(threads: int, cap: int) -> int:
    """Connections for a process running ``threads`` rounds at once: one each, plus the
    heartbeat and one spare, never more than ``cap`` (AIDAWORK_DATABASE_POOL_MAX). With
    N worker processes a deployment opens at most N x cap connections."""
    return max(1, min(threads + 2, cap))


def engine_for(settings: Settings, threads: int | None = None) -> Engine:
    """``threads``: how many rounds (or requests) this process runs at once; a worker's
    --concurrency, AIDAWORK_WORKER_CONCURRENCY when not given."""
    return make_engine(
        settings.database_url,
        pool_size=pool_size_for(threads or settings.worker_concurrency, settings.database_pool_max),
        pool_timeout_s=settings.database_pool_timeout_s,
        prepared_statements=not settings.database_pgbouncer,
    )


def runtime_for(settings: Settings) -> Runtime:
    # Workers warn at start-up when the secret is unset (cli.main); clients never sign.
    secret = DEV_SECRET if settings.secret_key is None else settings.secret_key.get_secret_value().encode()
    toolset = mcp_toolset(settings)
    return build_runtime(
        secret=secret,
        model_keys=ModelKeys(
            openai=settings.openai_api_key,
            anthropic=settings.anthropic_api_key,
            named={n: NamedKey(k, frozenset(o)) for n, (k, o) in settings.named_model_keys.items()},
            base_urls=tuple(settings.model_base_urls),
        ),
        plugins=process_plugins(settings.plugin_names),
        toolsets=toolset.tools if toolset else (),
        resolvers=(toolset.resolve,) if toolset else (),
    )


def mcp_toolset(settings: Settings) -> McpToolset | None:
    """The servers of AIDAWORK_MCP_SERVERS, their tools listed now, so that a submission is
    checked against the tools it will run with. A server that cannot be reached now is
    logged (``mcp_server_unavailable``) and listed when a run first names one of its tools
    (until then such a run waits: TOOLSET_UNAVAILABLE is retried, never a failed run). The
    sessions stay open for the process's life and are closed when it exits normally
    (stopping stdio servers)."""
    if not settings.mcp_servers:
        return None
    from runtime.toolsets.mcp_sessions import McpToolset  # the MCP SDK: only where it is used

    toolset = McpToolset.start(settings.mcp_servers)
    atexit.register(toolset.close)
    return toolset


def build_client_context(settings: Settings, threads: int | None = None) -> ClientContext:
    """``threads``: how many requests (or, for a worker, rounds) this process runs at once."""
    engine = engine_for(settings, threads)
    return ClientContext(
        settings=settings,
        engine=engine,
        store=Store(engine),
        runtime=runtime_for(settings),
        dispatch=Dispatcher(app_for(settings), settings.round_queues, declare_queues=not redis_broker(settings)),
    )


C = TypeVar("C")


class ProcessContext(Generic[C]):
    """A context built once per process, on first use, from the environment's settings
    (logging is configured first unless the CLI already did, more quietly)."""

    def __init__(self, build: Callable[[Settings], C]) -> None:
        self._build = build
        self._context: C | None = None
        self._lock = threading.Lock()

    def get(self) -> C:
        if self._context is None:
            with self._lock:
                if self._context is None:
                    settings = get_settings()
                    if not structlog.is_configured():
                        configure_logging(settings.log_level, whole_process=False)
                    self._context = self._build(settings)
        return self._context


_client_context = ProcessContext(build_client_context)


def get_client_context() -> ClientContext:
    """This process's client context, built on first use from the environment."""
    return _client_context.get()


def send_woken(ctx: ClientContext, woken: list[tuple[UUID, int]]) -> None:
    """Send the round of each run woken from its budget wait (``schema.store.budgets``), to
    its owner's share (its route read once per wake, never per round)."""
    log = structlog.get_logger("aidawork.reconcile")
    for run_id, boundary_seq in woken:
        route = ctx.store.route_of(run_id)
        send_or_defer(ctx.store, run_id, partial(ctx.dispatch.round, run_id, boundary_seq, route))
        log.info("run_redispatched", run_id=str(run_id), boundary_seq=boundary_seq, resume=False, budget=True)

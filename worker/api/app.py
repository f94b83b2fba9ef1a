"""The HTTP API for upstream services (``aidawork api``): the Python client
(``worker.client``) over HTTP, plus each run's events as a server-sent event stream.

- Authentication: ``Authorization: Bearer <token>``; AIDAWORK_API_TOKENS maps each token
  to an owner. The owner of a submitted run is the token's owner; a token sees only its
  owner's runs and Roots, and anything else is reported as not found (404, never 403),
  so a caller cannot learn that another owner's run exists.
- Bodies above AIDAWORK_API_MAX_BODY_BYTES are refused with 413 before they are parsed;
  a body that arrives too slowly (AIDAWORK_API_BODY_TIMEOUT_S, _MIN_BYTES_PER_S) gets 408
  and its connection is closed. Header deadlines and the connection cap are in
  ``worker.api.server``.
- Every refusal is ``{"error": {"code", "message", "field"}}``; a refused request
  stores nothing (validation runs before the store's single transaction). JSON values
  are checked by ``runtime.canonical.json_problem`` (NaN, Infinity, NUL, unpaired
  surrogates, nesting, digits): 422 naming the field. Anything unexpected is a JSON 500
  ``INTERNAL_ERROR`` and one ``request_crashed`` log line (``worker.api.errors``).
- ``GET /v1/runs/{id}/events`` follows the durable ``run_events`` table: ``id`` is the
  event's seq, so a client that reconnects with ``Last-Event-ID`` gets exactly the
  events after it, in order. The stream ends after the run's terminal event. Streams
  are fed by one poller per process (``worker.api.streams``), at most
  AIDAWORK_API_MAX_STREAMS_PER_TOKEN open per token (429 past it). Between them go the
  live token deltas (``model_delta``, ``model_stream_restarted``) with no ``id``: they
  come from Redis pub/sub (``worker.api.deltas``), are never stored, and are not replayed.
- No redirects (a trailing slash is a 404, not a redirect built from ``Host``).
- ``GET /metrics`` for Prometheus, and request spans when tracing is on
  (``worker.api.observe``).
- ``/ui`` is the run inspector (``worker.api.ui``); a browser's event stream shows a
  stream token in ``?stream_token=`` (``worker.api.stream_tokens``). Browsers of other
  origins may call the API when AIDAWORK_API_CORS_ORIGINS names them (off when unset).
- ``/mcp`` is an MCP server (streamable HTTP, stateless): the token owner's saved agents
  as tools, a call as a durable run (``worker.api.mcp``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.metadata import version

import structlog
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.api import a2a, agents, errors, forks, inspection, openapi, ui
from worker.api.auth import TokenTable
from worker.api.deps import ApiState
from worker.api.errors import error_response
from worker.api.limits import BodyLimit
from worker.api.mcp import McpService
from worker.api.observe import RequestSpans, install_metrics
from worker.api.routes import router
from worker.client.context import ClientContext, get_client_context
from worker.ops.observability.tracing import process_tracing
from worker.ops.settings import Settings, get_settings

log = structlog.get_logger("aidawork.api")


class AccessLog:
    """One ``request_served`` line per request (method, path, status, duration), outside
    every other middleware, so it sees each refusal and each 500 as the client does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_at, status = time.monotonic(), [0]

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, logged_send)
        finally:
            log.info(
                "request_served",
                method=scope["method"],
                path=scope["path"],
                status=status[0],
                duration_ms=round((time.monotonic() - started_at) * 1000, 1),
            )


def create_app(settings: Settings | None = None, context: Callable[[], ClientContext] | None = None) -> FastAPI:
    """The ASGI app. ``context`` gives the engine, the request checks and the dispatcher
    (default: this process's client context, built from the environment on first use)."""
    settings = settings or get_settings()
    state = ApiState(settings, TokenTable(settings.api_token_owners), context or get_client_context)
    mcp = McpService(state)  # /mcp: the saved agents as MCP tools

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with mcp.running():  # the MCP session manager's task group
            yield
        await state.hub.close()
        await state.deltas.close()

    docs = settings.api_docs
    app = FastAPI(
        title="AIDAWORK",
        version=version("aidawork"),
        summary="Durable LLM agent runs: submit, follow, deliver inputs, cancel.",
        # A redirect would be built from the client's Host header; a wrong path is a 404.
        redirect_slashes=False,
        openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        lifespan=lifespan,
    )
    app.state.aidawork = state
    app.include_router(router)
    app.include_router(agents.router)
    app.include_router(forks.router)
    app.include_router(a2a.router)  # /a2a/{agent}: each saved agent's A2A server
    app.include_router(inspection.router)
    app.include_router(ui.router)
    app.router.routes.append(mcp.route())
    openapi.install(app, settings)
    errors.install(app)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.api_max_body_bytes,
        timeout_s=settings.api_body_timeout_s,
        min_bytes_per_s=settings.api_body_min_bytes_per_s,
        refuse=a2a.body_refusals(error_response),  # a JSON-RPC error for a JSON-RPC call
    )
    tracer = process_tracing(settings, "aidawork-api").tracer
    if tracer is not None:
        app.add_middleware(RequestSpans, tracer=tracer, context=state.context)
    if settings.cors_origins:
        # Outside the body limit, so a preflight (OPTIONS, no body) is answered here and
        # never reaches a route (which would say 405).
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            expose_headers=["Location"],
            max_age=600,
        )
    app.add_middleware(AccessLog)  # added last: the outermost
    install_metrics(app, state.context)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app

"""The API's metrics and request spans.

- ``GET /metrics`` (no token: aggregate counts only, no run or owner, every label a
  fixed set): the API's own registry, with ``aidawork_runs{status}`` read from the database on scrape, cached for
  ``RUNS_CACHE_S`` (``worker.ops.observability.metrics``). The round counters are the
  workers' (AIDAWORK_METRICS_PORT of each worker process).
- With tracing on, each request is a SERVER span named by the OpenTelemetry HTTP
  conventions: ``<METHOD> <route template>`` (``http.route``), only ``<METHOD>`` when no
  route matched, ``HTTP`` for a method outside the standard ones. Never the path a client
  sent: span names must stay few, and a path can hold anything. The span is a child
  of the caller's ``traceparent`` if it sent one. ``POST /v1/runs`` starts the run's trace
  under it (``worker.client.submit``); a request on a run (``/v1/runs/<id>/...``) links
  its span to the run's trace (one read of ``runs.trace_context``, only when tracing is on).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from uuid import UUID

from fastapi import FastAPI, Response
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schema.store import telemetry
from worker.client.context import ClientContext
from worker.ops.observability.metrics import RunsCollector
from worker.ops.observability.tracing import links_to

_RUN_PATH = re.compile(r"^/v1/runs/([0-9a-fA-F-]{36})(?:/|$)")
# The methods of HTTP's RFC 9110 and PATCH; any other is reported as _OTHER.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
_PROPAGATOR = TraceContextTextMapPropagator()


def install_metrics(app: FastAPI, context: Callable[[], ClientContext]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(RunsCollector(lambda: telemetry.count_runs_by_status(context().engine)))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return registry


class RequestSpans:
    """One SERVER span per HTTP request (only installed when tracing is on)."""

    def __init__(self, app: ASGIApp, *, tracer: Tracer, context: Callable[[], ClientContext]) -> None:
        self.app = app
        self._tracer = tracer
        self._context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in ("/metrics", "/healthz"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        parent = _PROPAGATOR.extract(headers)
        path: str = scope["path"]
        links = await self._run_links(path)
        method: str = scope["method"]
        known = method in KNOWN_METHODS
        # Named once the router has matched (it sets scope["route"]); until then, by method.
        with self._tracer.start_as_current_span(
            method if known else "HTTP", context=parent, kind=SpanKind.SERVER, links=links
        ) as span:
            span.set_attribute("http.request.method", method if known else "_OTHER")
            if not known:
                span.set_attribute("http.request.method_original", method)
            span.set_attribute("url.path", path)

            def name_by_route() -> None:
                route = _route_template(scope)
                if route is not None:
                    span.update_name(f"{method if known else 'HTTP'} {route}")
                    span.set_attribute("http.route", route)

            async def traced_send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            try:
                await self.app(scope, receive, traced_send)
            finally:
                name_by_route()

    async def _run_links(self, path: str) -> tuple[Link, ...]:
        match = _RUN_PATH.match(path)
        if match is None:
            return ()
        try:
            run_id = UUID(match.group(1))
            trace_context = await run_in_threadpool(telemetry.run_trace_context, self._context().engine, run_id)
        except Exception:  # a bad id or an unavailable database: the route answers for it
            return ()
        return tuple(links_to(trace_context))


def _route_template(scope: Scope) -> str | None:
    """The template of the route the router matched (``/v1/runs/{run_id}``), if any."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else None

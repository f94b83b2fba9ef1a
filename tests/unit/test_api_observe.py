"""The API's request spans (``worker.api.observe.RequestSpans``): one SERVER span per
request, a child of the caller's traceparent, linked to the
run's trace on a run's path; none for /metrics and /healthz."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker.api import observe

RUN_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


async def answer(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def request(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> None:
    scope = {"type": "http", "method": method, "path": path, "headers": headers}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        return None

    asyncio.run(app(scope, receive, send))


def test_a_request_on_a_run_is_a_server_span_linked_to_the_runs_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[UUID] = []

    def stored(engine: Any, run_id: UUID) -> str:
        asked.append(run_id)
        return f"00-{RUN_TRACE}-00f067aa0ba902b7-01"

    monkeypatch.setattr(observe.telemetry, "run_trace_context", stored)
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    context = type("Ctx", (), {"engine": None})
    app = observe.RequestSpans(answer, tracer=provider.get_tracer("t"), context=lambda: context)
    run_id = uuid4()
    caller = [(b"traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode())]

    request(app, "POST", f"/v1/runs/{run_id}/cancel", caller)
    request(app, "GET", "/metrics", [])
    request(app, "GET", "/healthz", [])
    request(app, "GET", "/v1/roots/nothing/runs", [])

    spans = exporter.get_finished_spans()
    # No router here, so no route template: by method only (tests/unit/test_trace_conventions.py
    # has the templates of the real app).
    assert [s.name for s in spans] == ["POST", "GET"]
    on_run = spans[0]
    assert f"{on_run.context.trace_id:032x}" == CALLER_TRACE
    assert on_run.parent is not None and f"{on_run.parent.span_id:016x}" == CALLER_SPAN
    assert [f"{link.context.trace_id:032x}" for link in on_run.links] == [RUN_TRACE]
    assert (on_run.attributes or {})["http.response.status_code"] == 204
    assert asked == [run_id]  # the run's path only
    assert spans[1].links == ()

"""Span names and attributes follow the OpenTelemetry conventions (issue 35, points 3, 4):
the API's request spans are named by their route template, never by the path a client
sent; chat, tool and agent spans carry the GenAI attributes. Read from the SDK's
in-memory exporter."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from schema.wire import RoundTask
from tests.support.api import TOKEN, no_store
from tests.support.observed import observed_shell, submit_openai
from worker.api import app as api_app
from worker.engine.round import execute_round
from worker.ops.observability.tracing import Tracing
from worker.ops.settings import Settings


def traced() -> tuple[Tracing, InMemorySpanExporter]:
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test")), exporter


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# --- point 3: request spans -------------------------------------------------------------


def test_request_spans_are_named_by_route_template_and_never_by_the_path_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing, exporter = traced()
    monkeypatch.setattr(api_app, "process_tracing", lambda settings, name: tracing)
    app = api_app.create_app(Settings(api_tokens=json.dumps({TOKEN: "team-a"})), no_store)
    run_id = uuid4()

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            sent = [("GET", f"/v1/runs/{run_id}"), ("POST", f"/v1/runs/{run_id}/cancel"),
                    ("GET", "/no/such/path/%01%1b[31m" + "x" * 50), ("BREW", "/v1/runs"), ("BREW", "/nothing")]
            return [(await http.request(method, url)).status_code for method, url in sent]

    statuses = anyio.run(go)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        "GET /v1/runs/{run_id}", "POST /v1/runs/{run_id}/cancel", "GET", "HTTP /v1/runs", "HTTP",
    ]
    routes = [attributes(s).get("http.route") for s in spans]
    assert routes == ["/v1/runs/{run_id}", "/v1/runs/{run_id}/cancel", None, "/v1/runs", None]
    assert [attributes(s)["http.response.status_code"] for s in spans] == statuses
    assert [attributes(s)["http.request.method"] for s in spans] == ["GET", "POST", "GET", "_OTHER", "_OTHER"]
    assert attributes(spans[3])["http.request.method_original"] == "BREW"
    assert "http.request.method_original" not in attributes(spans[0])


# --- point 4: GenAI spans ---------------------------------------------------------------


def test_a_chat_span_carries_the_genai_request_and_response_attributes() -> None:
    tracing, exporter = traced()
    s = observed_shell(tracing, metrics_models="gpt-4o-mini")
    submit_openai(s, {"name": "gpt-4o-mini", "base_url": "http://vllm.internal:8000/v1",
                      "max_completion_tokens": 300, "temperature": 0.5})
    (chat,) = [x for x in exporter.get_finished_spans() if attributes(x).get("gen_ai.operation.name") == "chat"]
    assert chat.name == "chat gpt-4o-mini"
    got = attributes(chat)
    assert {k: got.get(k) for k in (
        "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.id",
        "gen_ai.response.finish_reasons", "server.address", "server.port", "gen_ai.request.max_tokens",
        "gen_ai.request.temperature", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
    )} == {
        "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "served-model", "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop",), "server.address": "vllm.internal", "server.port": 8000,
        "gen_ai.request.max_tokens": 300, "gen_ai.request.temperature": 0.5,
        "gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 2,
    }
    assert "gen_ai.system" not in got  # deprecated: gen_ai.provider.name replaces it


def test_a_chat_span_leaves_out_what_the_run_did_not_set_and_names_an_unlisted_model_other() -> None:
    tracing, exporter = traced()
    s = observed_shell(tracing)
    submit_openai(s, {"name": "a-tenants-own-name"})
    (chat,) = [x for x in exporter.get_finished_spans() if attributes(x).get("gen_ai.operation.name") == "chat"]
    got = attributes(chat)
    assert chat.name == "chat other"  # a span name must stay bounded; the attribute keeps the name
    assert got["gen_ai.request.model"] == "a-tenants-own-name"
    assert (got["server.address"], got["server.port"]) == ("api.openai.com", 443)
    assert "gen_ai.request.temperature" not in got and "gen_ai.request.max_tokens" not in got


def test_tool_spans_say_their_type_and_round_spans_are_invoke_agent_spans() -> None:
    tracing, exporter = traced()
    s = observed_shell(tracing)
    turns = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}, {"name": "pick_colour", "args": {}}]},
             {"content": "done"}]
    run_id = s.submit(turns, tools=["add"], client_tools=[{"name": "pick_colour"}])
    execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    spans = exporter.get_finished_spans()
    tools = {attributes(x)["gen_ai.tool.name"]: (x.name, attributes(x)["gen_ai.tool.type"])
             for x in spans if attributes(x).get("gen_ai.operation.name") == "execute_tool"}
    # A server tool is an extension of the agent; a client tool is a function its caller runs.
    assert tools == {"add": ("execute_tool add", "extension"), "pick_colour": ("execute_tool other", "function")}
    (agent,) = [x for x in spans if attributes(x).get("gen_ai.operation.name") == "invoke_agent"]
    assert agent.name == "invoke_agent"
    got = attributes(agent)
    assert (got["gen_ai.conversation.id"], got["run_id"], got["gen_ai.provider.name"]) == (
        str(run_id), str(run_id), "scripted"
    )
    assert all(x.parent is not None and x.parent.span_id == agent.context.span_id
               for x in spans if x is not agent)


def test_both_parsers_keep_the_response_id_and_model_the_provider_sent() -> None:
    from runtime.models.anthropic import parse_messages_response

    answer = parse_messages_response({"id": "msg_1", "model": "claude-x-20250101", "stop_reason": "end_turn",
                                      "content": [{"type": "text", "text": "hi"}], "usage": {}})
    assert (answer.response_id, answer.response_model) == ("msg_1", "claude-x-20250101")
    assert "id" not in answer.to_json()  # not part of the digest: a replay need not match it

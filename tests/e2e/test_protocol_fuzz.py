"""The A2A and MCP endpoints against generated JSON-RPC (hypothesis, seeded): whatever a
client sends, well formed or not, the answer is never a 5xx, every refusal is in the
protocol's own shape (a JSON-RPC error object, or for HTTP-level refusals our error
body), and a refused request stores no run. Schemathesis covers the REST routes (the
OpenAPI document); these two protocols are not in that document, so this is their
equivalent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.api import A, ApiServer
from tests.support.db import rows
from tests.support.requests import scripted_request

A2A_METHODS = ["SendMessage", "SendStreamingMessage", "GetTask", "CancelTask", "SubscribeToTask",
               "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTasks",
               "message/send", "tasks/get", "tasks/cancel", "no/such/method"]
MCP_METHODS = ["initialize", "server/discover", "tools/list", "tools/call", "tasks/get", "tasks/result",
               "tasks/cancel", "ping", "no/such/method"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from(["id", "jsonrpc", "method", "params", "message", "taskId", "name", "arguments",
                        "parts", "role", "input", "root_id", "task", "messageId", "contextId"])


def envelope(methods: list[str]) -> st.SearchStrategy[Any]:
    params = st.dictionaries(KEYS, JSON, max_size=4) | JSON
    well_formed = st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "id": st.integers(0, 9) | st.text(max_size=4), "method": st.sampled_from(methods)},
        optional={"params": params},
    )
    return well_formed | st.dictionaries(KEYS, JSON, max_size=4) | JSON


def body_of(value: Any) -> bytes:
    return json.dumps(value).encode()


RAW = st.sampled_from([b"", b"{", b"[]", b"null", b'{"jsonrpc": "2.0"', b"\xff\xfe", b"[1, 2"])


def messages_of(answer: Any) -> list[Any]:
    """The JSON-RPC messages of an answer: its JSON body, or each ``data:`` of an SSE stream."""
    kind = answer.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        lines = answer.text.splitlines()
        return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]
    if kind.startswith("application/json"):
        data = answer.json()
        return data if isinstance(data, list) else [data]
    return []


def json_rpc_errors(answer: Any) -> int:
    """Checks the answer; how many JSON-RPC error objects it holds."""
    assert answer.status_code < 500, (answer.status_code, answer.text[:500])
    errors = 0
    for item in messages_of(answer):
        if answer.status_code != 200 and "jsonrpc" not in item:
            assert "error" in item, item  # an HTTP-level refusal in our error body
            continue
        assert item.get("jsonrpc") == "2.0", item
        if "error" in item:
            assert isinstance(item["error"].get("code"), int) and isinstance(item["error"].get("message"), str)
            errors += 1
        else:
            assert "result" in item or "method" in item, item  # an answer, or a notification
    return errors


def test_generated_json_rpc_never_gets_a_5xx_nor_stores_a_run(api: ApiServer, ctx) -> None:
    config = scripted_request([{"content": "hello"}])["config"]
    assert api.http.post("/v1/agents", json={"name": "fuzzed", "config": config}, headers=A).status_code == 201
    headers = {**A, "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "A2A-Version": "1.0"}
    sent = {"a2a": 0, "mcp": 0}
    refused = {"a2a": 0, "mcp": 0}

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(a2a=envelope(A2A_METHODS).map(body_of) | RAW, mcp=envelope(MCP_METHODS).map(body_of) | RAW)
    def fuzz(a2a: bytes, mcp: bytes) -> None:
        for path, body in (("/a2a/fuzzed", a2a), ("/mcp", mcp)):
            which = "a2a" if path.startswith("/a2a") else "mcp"
            with api.http.stream("POST", path, content=body, headers=headers, timeout=10) as answer:
                answer.read()
                refused[which] += json_rpc_errors(answer)
            sent[which] += 1

    fuzz()
    assert sent == {"a2a": 120, "mcp": 120}
    assert refused["a2a"] >= 60 and refused["mcp"] >= 60, refused  # each reached its JSON-RPC dispatcher
    # A generated call may start a run only through a well-formed message or tool call;
    # none of these carries one that validates, so nothing was stored.
    assert rows(ctx.engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0

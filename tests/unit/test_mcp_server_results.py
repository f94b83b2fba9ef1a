"""The MCP server's pure parts, without services: run statuses as task statuses and tool
results; each wait kind as a form elicitation, and each answer (accept, decline, cancel)
as the reply it stores; the tools' argument checks; and the endpoint refusing a request
without a valid bearer token before the SDK (or the store) sees it."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import pytest
from mcp_types import ElicitResult

from schema.store.owners import EventTail, TailKey
from schema.wire import EventKind, RunEvent, RunStatus, RunView, WaitingFor
from worker.api.a2a.answers import ReplyInvalid
from worker.api.auth import TokenTable
from worker.api.mcp import elicit, runs
from worker.api.mcp.endpoint import McpEndpoint
from worker.api.mcp.results import STATUS_OF, call_result, created_task, detailed_task, task_status
from worker.api.mcp.tools import AGENT_SCHEMA, AgentArgs, ArgumentsInvalid, StatusArgs, input_schema, parse
from worker.api.streams import EventHub

RUN, ROOT = uuid.uuid4(), uuid.uuid4()
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def wait(kind: str, call: str = "call_0_0", **fields: Any) -> WaitingFor:
    return WaitingFor(tool_call_id=call, tool_name="pick_color", kind=kind, delivered=False, **fields)


def view(status: RunStatus, *waits: WaitingFor, **fields: Any) -> RunView:
    base: dict[str, Any] = {
        "run_id": RUN, "root_id": ROOT, "owner": "team-a", "status": status, "rounds": 1, "model_calls": 1,
        "agent": "colors@1", "output": None, "error_code": None, "error_message": None, "created_at": NOW,
        "finished_at": NOW if status.terminal else None, "waiting_for": list(waits),
    }
    return RunView.model_validate({**base, **fields})


def test_every_run_status_has_a_task_status_and_a_failed_run_is_a_completed_task_with_an_error() -> None:
    assert set(STATUS_OF) == set(RunStatus)
    failed = view(RunStatus.FAILED, error_code="MODEL_ERROR", error_message="boom")
    assert task_status(failed) == "completed"
    result = call_result(failed)
    assert result.is_error and result.structured_content["error_code"] == "MODEL_ERROR"
    done = call_result(view(RunStatus.COMPLETED, output="5"))
    assert (done.is_error, done.content[0].text, done.structured_content["root_id"]) == (  # type: ignore[union-attr]
        False, "5", str(ROOT))
    # A run parked for its owner's budget waits for nobody's answer: it is working.
    budget = WaitingFor(kind="budget", delivered=False)
    assert task_status(view(RunStatus.SUSPENDED, budget)) == "working"
    assert task_status(view(RunStatus.SUSPENDED, wait("client_tool"))) == "input_required"


def test_a_task_carries_its_result_once_completed_and_its_input_requests_while_it_waits() -> None:
    created = created_task(view(RunStatus.QUEUED))
    assert (created["resultType"], created["taskId"], created["status"], created["ttlMs"]) == (
        "task", str(RUN), "working", None)
    waiting = view(RunStatus.SUSPENDED, wait("client_tool", args={"hint": "warm"}))
    task = detailed_task(waiting, elicit.wire_requests(waiting))
    request = task["inputRequests"]["call_0_0"]
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form"
    assert request["params"]["requestedSchema"]["required"] == ["result"]
    assert 'pick_color({"hint": "warm"})' in request["params"]["message"]
    done = detailed_task(view(RunStatus.COMPLETED, output="hi"), {})
    assert done["result"]["content"] == [{"type": "text", "text": "hi"}] and "inputRequests" not in done


@pytest.mark.parametrize(
    ("kind", "fields", "response", "stored"),
    [
        ("client_tool", {"args": {}}, {"action": "accept", "content": {"result": '{"color": "red"}'}},
         {"tool_call_id": "call_0_0", "result": {"color": "red"}}),
        ("client_tool", {"args": {}}, {"action": "accept", "content": {"result": "plain words"}},
         {"tool_call_id": "call_0_0", "result": "plain words"}),
        ("client_tool", {"args": {}}, {"action": "decline"},
         {"tool_call_id": "call_0_0", "result": {"error": elicit.DECLINED}, "is_error": True}),
        ("approval", {"args": {}}, {"action": "accept", "content": {"decision": "approve"}},
         {"tool_call_id": "call_0_0", "decision": "approve"}),
        ("approval", {"args": {}}, {"action": "decline"},
         {"tool_call_id": "call_0_0", "decision": "reject", "reason": elicit.DECLINED}),
        ("outcome_unknown", {"args": {}, "reason": "lost"}, {"action": "accept", "content": {"retry": True}},
         {"tool_call_id": "call_0_0", "retry": True}),
        ("local_read", {"paths": ["a.txt"]}, {"action": "accept", "content": {"a.txt": "text"}},
         {"tool_call_id": "call_0_0", "files": {"a.txt": "text"}}),
        ("prerequisite", {"key": "region"}, {"action": "accept", "content": {"value": '"eu"'}},
         {"key": "region", "value": "eu"}),
    ],
)
def test_each_wait_is_a_form_and_each_answer_the_reply_it_stores(
    kind: str, fields: dict[str, Any], response: dict[str, Any], stored: dict[str, Any]
) -> None:
    waiting = view(RunStatus.SUSPENDED, wait(kind, **fields))
    assert list(elicit.input_requests(waiting)) == ["call_0_0"]
    found = elicit.replies_of(waiting, {"call_0_0": ElicitResult.model_validate(response)}, "inputResponses")
    assert not found.dismissed
    (reply,) = found.replies
    assert dict(reply.body) == stored


def test_a_dismissed_form_answers_nothing_and_answers_to_no_open_wait_are_ignored() -> None:
    waiting = view(RunStatus.SUSPENDED, wait("local_read", paths=["a.txt"]))
    cancelled = elicit.replies_of(waiting, {"call_0_0": ElicitResult(action="cancel")}, "inputResponses")
    declined = elicit.replies_of(waiting, {"call_0_0": ElicitResult(action="decline")}, "inputResponses")
    assert (cancelled.replies, cancelled.dismissed, declined.replies, declined.dismissed) == ([], True, [], True)
    stray = elicit.replies_of(waiting, {"call_9_9": ElicitResult(action="accept", content={})}, "inputResponses")
    assert (stray.replies, stray.dismissed) == ([], False)
    with pytest.raises(ReplyInvalid) as refused:  # a NaN is no JSON value a tool may get
        bad = ElicitResult(action="accept", content={"result": "NaN"})
        elicit.replies_of(view(RunStatus.SUSPENDED, wait("client_tool", args={})), {"call_0_0": bad}, "inputResponses")
    assert refused.value.field.startswith("inputResponses.call_0_0.result"), refused.value.field


def test_arguments_are_checked_naming_the_argument() -> None:
    assert parse(AgentArgs, {"input": "hi"}) == AgentArgs(input="hi")
    for arguments, field in [({}, "arguments.input"), ({"input": "hi", "x": 1}, "arguments.x"),
                             ({"input": "hi", "root_id": "nope"}, "arguments.root_id"),
                             ({"input": ""}, "arguments.input")]:
        with pytest.raises(ArgumentsInvalid) as refused:
            parse(AgentArgs, arguments)
        assert refused.value.field == field, arguments
    with pytest.raises(ArgumentsInvalid, match=r"arguments\.wait_s"):
        parse(StatusArgs, {"run_id": str(RUN), "wait_s": 61})
    assert input_schema("any-agent") == AGENT_SCHEMA and input_schema("task.status") != AGENT_SCHEMA


class NoManager:
    """The session manager a refused request must never reach."""

    async def handle_request(self, scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request reached the MCP session manager")


@pytest.mark.parametrize(("headers", "message"), [
    ({}, "send Authorization: Bearer <token>"),
    ({"Authorization": "Bearer nope"}, "the bearer token is not valid"),
    ({"Authorization": "Basic dG9rZW4="}, "send Authorization: Bearer <token>"),
])
def test_a_request_without_a_valid_bearer_token_is_a_401_json_rpc_error(headers: dict[str, str], message: str) -> None:
    endpoint = McpEndpoint(TokenTable({"token-a": "team-a"}), NoManager())  # type: ignore[arg-type]

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=endpoint)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            return await http.post("/mcp", headers=headers, content=json.dumps({"jsonrpc": "2.0", "id": 1}))

    answer = anyio.run(go)
    assert (answer.status_code, answer.headers["www-authenticate"]) == (401, "Bearer")
    assert answer.json() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}


class FakeState:
    """The API state ``runs.settle`` reads: the event poller over a scripted tail."""

    def __init__(self, events: list[RunEvent]) -> None:
        self.events = events
        self.hub = EventHub(self.read, poll_s=0.01)

    def read(self, keys: Any) -> dict[TailKey, EventTail]:
        return {key: EventTail(events=[e for e in self.events if e.seq > key.after_seq], ended=False) for key in keys}


def test_a_wait_ends_when_the_run_asks_for_input_or_after_its_bound_with_each_event_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running, suspended = view(RunStatus.RUNNING), view(RunStatus.SUSPENDED, wait("client_tool", args={}))
    views = iter([running, suspended])
    monkeypatch.setattr(runs, "_last_seq", lambda state, run_id: 1)
    monkeypatch.setattr(runs, "_status", lambda state, owner, run_id: next(views))
    event = RunEvent(run_id=RUN, seq=2, kind=EventKind.RUN_SUSPENDED, data={"waiting_for": ["call_0_0"]},
                     created_at=NOW)
    reported: list[str] = []

    async def report(e: RunEvent) -> None:
        reported.append(runs.describe(e))

    async def asked() -> RunView:
        state = FakeState([event])
        try:
            return await runs.settle(state, "team-a", running, 5.0, report)  # type: ignore[arg-type]
        finally:
            await state.hub.close()

    assert anyio.run(asked) == suspended and reported == ["run_suspended"]

    monkeypatch.setattr(runs, "_status", lambda state, owner, run_id: running)

    async def bounded() -> tuple[RunView, float]:
        state = FakeState([])
        started = time.monotonic()
        try:
            return await runs.settle(state, "team-a", running, 0.3, None), time.monotonic() - started  # type: ignore[arg-type]
        finally:
            await state.hub.close()

    still, waited_s = anyio.run(bounded)
    assert still == running and 0.3 <= waited_s < 3, waited_s
    assert call_result(still).structured_content["status"] == "working"

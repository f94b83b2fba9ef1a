"""Messages (stored form, token estimate), tools (args checking, registry) and the CLI's
one-line event rendering."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from runtime.errors import ToolFailed
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.tools import BUILTIN_TOOLS, Tool, ToolArgsInvalid, ToolRegistry, builtin_registry
from runtime.tools.builtin import AddArgs
from schema.wire import RunEvent
from schema.wire.vocab import ToolDomain
from tests.support.tools import tool_context


def test_messages_round_trip_through_their_stored_form() -> None:
    call = ToolCall("call_0_0", "add", {"a": 1, "b": 2})
    messages = [
        user_message("hi"),
        Message(role="assistant", tool_calls=(call,)),
        tool_message(call, {"sum": 3}),
        Message(role="assistant", content="3"),
    ]
    for m in messages:
        assert Message.from_json(m.to_json()) == m
    assert messages[2].to_json() == {"role": "tool", "tool_call_id": "call_0_0", "name": "add", "result": {"sum": 3}}


def test_token_count_is_a_quarter_of_the_canonical_body_rounded_up() -> None:
    assert user_message("").token_count == 7  # {"content":"","role":"user"} is 28 chars
    assert user_message("abcd").token_count == 8  # 32 chars
    assert user_message("abcde").token_count == 9  # 33 chars, rounded up


def test_registry_refuses_a_tool_registered_twice() -> None:
    registry = builtin_registry()

    with pytest.raises(ValueError, match="'add'"):
        registry.register(BUILTIN_TOOLS[1])
    assert registry.names() == [
        "add",
        "await_prerequisite",
        "count_words",
        "echo",
        "local_echo",
        "read_files",
        "sleep",
        "text_blob",
    ]
    assert registry.get("missing") is None


def test_tool_spec_shows_the_args_schema() -> None:
    spec = builtin_registry().get("add").spec()  # type: ignore[union-attr]

    assert spec["name"] == "add"
    assert spec["domain"] == "sdk"
    assert set(spec["parameters"]["required"]) == {"a", "b"}


def test_a_tool_failed_from_the_handler_is_a_failed_result_with_its_code() -> None:
    def handler(args: AddArgs, inputs: object) -> dict[str, float]:
        raise ToolFailed("nope")

    tool = Tool.of_model("bad", "fails", AddArgs, ToolDomain.LOCAL, handler)
    assert ToolRegistry([tool]).get("bad") is tool
    outcome = tool.run(tool.parse_args({"a": 1, "b": 2}), tool_context())
    assert (outcome.status, outcome.result) == ("failed", {"error": {"code": "TOOL_FAILED", "message": "nope"}})


def test_add_at_run_time_is_lax_but_preparation_is_strict() -> None:
    add = builtin_registry().get("add")
    assert add is not None

    outcome = add.run(add.parse_args({"a": "2", "b": 3}), tool_context())
    assert (outcome.status, outcome.result) == ("completed", {"sum": 5.0})
    with pytest.raises(ToolArgsInvalid):
        add.parse_args({"a": "2", "b": 3}, strict=True)


def _event(seq: int, kind: str, data: dict) -> RunEvent:
    return RunEvent(run_id=uuid.uuid4(), seq=seq, kind=kind, data=data, created_at=datetime.now(UTC))


def test_format_event_renders_each_kind_on_one_line() -> None:
    from worker.cli.run_view import format_event

    calls = {
        "boundary_seq": 0,
        "content": None,
        "tool_calls": [{"id": "call_0_0", "name": "add", "args": {"a": 2, "b": 3}}],
    }
    expected = '#2 model_responded  round 0: calls add({"a": 2, "b": 3})'
    assert format_event(_event(2, "model_responded", calls)) == expected
    says = {"boundary_seq": 1, "content": "5", "tool_calls": []}
    assert format_event(_event(4, "model_responded", says)) == "#4 model_responded  round 1: says '5'"
    tool = {"tool_call_id": "call_0_0", "name": "add", "status": "completed", "result": {"sum": 5.0}}
    assert format_event(_event(3, "tool_completed", tool)) == '#3 tool_completed  add -> {"sum": 5.0}'
    assert format_event(_event(5, "run_completed", {"output": "5"})) == "#5 run_completed  output: '5'"
    failed = {"error_code": "MAX_ROUNDS_EXCEEDED", "message": "limit"}
    assert format_event(_event(6, "run_failed", failed)) == "#6 run_failed  MAX_ROUNDS_EXCEEDED: limit"
    assert format_event(_event(1, "run_queued", {"x": 1})) == '#1 run_queued  {"x": 1}'

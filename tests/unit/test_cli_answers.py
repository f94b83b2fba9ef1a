"""``aidawork tool-result`` / ``retry-tool`` / ``approve`` / ``reject`` refuse bad input
before any store is reached (exit 2, one ``aidawork: error:`` line naming the option or
field), and ``watch`` renders the new waits and answers on one line each."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from schema.wire import RunEvent
from worker.cli import main as cli
from worker.cli.run_view import format_event as fmt

RUN = str(uuid.UUID(int=1))


@pytest.fixture(autouse=True)
def no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any of these reaching the database is a failure: no engine can be built."""
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)

    def touched(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a refused answer reached the client context")

    monkeypatch.setattr("worker.client.get_client_context", touched)


CASES: list[Any] = [
    pytest.param(["tool-result", RUN, "call_0_0", "--json", "{bad"], "--json is not valid JSON", id="bad_json"),
    pytest.param(["tool-result", RUN, "call_0_0", "--json", "NaN"], "REQUEST_INVALID: result: NaN", id="nan"),
    pytest.param(["tool-result", RUN, "call_0_0", "--json", '{"a": "\\u0000"}'], "result.a: a NUL", id="nul"),
    pytest.param(["tool-result", RUN, "", "--json", "1"], "tool_call_id: must not be empty", id="empty_call_id"),
    pytest.param(["approve", RUN, "call_0_0", "--args", "[1]"], "--args must be a JSON object", id="args_a_list"),
    pytest.param(["approve", RUN, "call_0_0", "--args", "{"], "--args is not valid JSON", id="args_bad_json"),
    pytest.param(["approve", RUN, "call_0_0", "--args", '{"x": 1e400}'], "args.x: NaN or Infinity", id="args_1e400"),
    pytest.param(["reject", RUN, "call_0_0", "--reason", " "], "reason: must not be empty", id="blank_reason"),
    pytest.param(["reject", RUN, "call_0_0", "--reason", "r" * 2001], "over the limit of 2000", id="long_reason"),
    pytest.param(["retry-tool", RUN, ""], "tool_call_id: must not be empty", id="retry_empty_call_id"),
]


@pytest.mark.parametrize(("argv", "expected"), CASES)
def test_a_bad_answer_exits_2_naming_the_option_before_the_store(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_INPUT
    out, err = capsys.readouterr()
    assert err.startswith("aidawork: error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert out == ""


@pytest.mark.parametrize("argv", [["tool-result", RUN, "c"], ["reject", RUN, "c"], ["approve", "not-a-run", "c"]])
def test_a_missing_option_or_a_bad_run_id_is_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2


def _event(kind: str, data: dict[str, Any]) -> RunEvent:
    return RunEvent(run_id=uuid.uuid4(), seq=3, kind=kind, data=data, created_at=datetime.now(UTC))


def test_watch_renders_the_waits_and_answers_of_calls() -> None:
    args = {"path": "/tmp/out.txt", "text": "hi"}
    lines = [
        fmt(_event("tool_suspended", {"tool_call_id": "call_0_0", "name": "append_line",
                                                   "kind": "approval", "args": args})),
        fmt(_event("tool_suspended", {"tool_call_id": "call_0_0", "name": "pick", "kind": "client_tool",
                                                   "args": {"hint": "warm"}})),
        fmt(_event("tool_suspended", {"tool_call_id": "call_0_0", "name": "append_line",
                                                   "kind": "outcome_unknown", "args": args, "reason": "it crashed"})),
        fmt(_event("input_delivered", {"tool_call_id": "call_0_0", "kind": "approval",
                                                    "answer": "approve", "args": args, "resumable": True})),
        fmt(_event("input_delivered", {"tool_call_id": "call_0_0", "kind": "approval",
                                                    "answer": "reject", "reason": "not today", "resumable": True})),
        fmt(_event("tool_completed", {"tool_call_id": "call_0_0", "name": "append_line",
                                                   "status": "failed", "result": {"error": {"code": "TOOL_REJECTED"}},
                                                   "approval": {"decision": "reject", "reason": "not today"}})),
        fmt(_event("resume_ready", {"tool_call_ids": ["call_1_0"], "reason": "inputs already delivered",
                                                 "resumable": True})),
    ]
    assert lines == [
        '#3 tool_suspended  append_line (call_0_0) waits for approval of append_line({"path": "/tmp/out.txt", '
        '"text": "hi"})',
        '#3 tool_suspended  pick (call_0_0) waits for the client\'s result of pick({"hint": "warm"})',
        '#3 tool_suspended  append_line (call_0_0) waits for an operator\'s word on append_line({"path": '
        '"/tmp/out.txt", "text": "hi"}): its outcome is unknown (it crashed)',
        '#3 input_delivered  call_0_0 approved with edited args {"path": "/tmp/out.txt", "text": "hi"}; resuming',
        "#3 input_delivered  call_0_0 rejected: not today; resuming",
        '#3 tool_completed  append_line [rejected] -> {"error": {"code": "TOOL_REJECTED"}} (failed)',
        "#3 resume_ready  call_1_0: inputs already there; resuming",
    ]

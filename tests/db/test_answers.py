"""Answers to suspended calls (``worker.client.tool_result`` / ``retry_tool`` / ``approve`` /
``reject`` over ``schema.store.answers.answer_tool_call``): refused with nothing stored
unless the run waits for that kind of answer to that very call, idempotent when repeated,
and acted on by the resume exactly as answered.

Runs are suspended by real rounds in-process (``worker.engine.round.execute_round``) and driven by
``tests/support/suspensions.drive``; every refusal is checked against a snapshot of every
table the feature touches (tool_answers and tool_executions included).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import text as sql

from runtime.errors import RequestInvalid
from schema.store.answers import Answer, answer_tool_call
from schema.store.bodies import event_data_sql
from schema.store.errors import RunNotFound
from schema.store.suspensions import DeliveryRefused
from schema.wire.vocab import ToolAnswerKind
from tests.support.db import rows
from tests.support.requests import PICK_COLOR
from tests.support.suspensions import BODY, assert_unchanged, drive, run_row, snapshot, suspended_run
from worker import client

ASK_COLOR = [{"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]}, {"content": "picked"}]


def append(path: Path, text: str) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": "append_line", "args": {"path": str(path), "text": text}}]}, {"content": "done"}]


def lines(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def tool_row(ctx: Any, run_id: UUID, call: str = "call_0_0") -> dict[str, Any]:
    sql_text = "SELECT * FROM tool_invocations WHERE run_id = :id AND tool_call_id = :c"
    (row,) = rows(ctx.engine, sql_text, id=run_id, c=call)
    return row


def tool_message(ctx: Any, run_id: UUID, call: str = "call_0_0") -> dict[str, Any]:
    (row,) = rows(
        ctx.engine,
        f"SELECT {BODY} AS body FROM messages AS m WHERE run_id = :id AND role = 'tool' AND body->>'tool_call_id' = :c",
        id=run_id,
        c=call,
    )
    return row["body"]  # type: ignore[no-any-return]


def events_of(ctx: Any, run_id: UUID, kind: str) -> list[dict[str, Any]]:
    """The run's events of this kind, with tool results joined in (stored once elsewhere)."""
    found = rows(ctx.engine, f"SELECT {event_data_sql()} AS data FROM run_events AS e WHERE run_id = :id "
                 "AND kind = :k ORDER BY seq", id=run_id, k=kind)
    return [e["data"] for e in found]


def refused(ctx: Any, before: dict[str, Any], what: str, call: Any, match: str) -> None:
    with pytest.raises(DeliveryRefused, match=match):
        call()
    assert_unchanged(ctx, before, what)


def test_a_client_tools_result_is_refused_unless_waited_for_and_idempotent_once_given(ctx) -> None:
    run_id = suspended_run(ctx, ASK_COLOR, [], client_tools=[PICK_COLOR])
    (wait,) = client.status(run_id, ctx=ctx).waiting_for
    assert (wait.tool_call_id, wait.tool_name, wait.kind, wait.args, wait.delivered) == (
        "call_0_0", "pick_color", "client_tool", {"hint": "warm"}, False)

    before = snapshot(ctx)
    refused(ctx, before, "a result for another call", lambda: client.tool_result(run_id, "call_9_9", "red", ctx=ctx),
            "not waiting for tool call 'call_9_9'")
    refused(ctx, before, "an approval of a client tool", lambda: client.approve(run_id, "call_0_0", ctx=ctx),
            "waits for a client tool's result, not an approval")
    refused(ctx, before, "a retry of a client tool", lambda: client.retry_tool(run_id, "call_0_0", ctx=ctx),
            "not a retry")
    with pytest.raises(RunNotFound):
        client.tool_result(uuid4(), "call_0_0", "red", ctx=ctx)
    for value, is_error, field in [(math.nan, False, "result"), ({"a": ["x\x00"]}, False, "result.a[0]"),
                                   ("red", "yes", "is_error")]:
        with pytest.raises(RequestInvalid) as invalid:
            client.tool_result(run_id, "call_0_0", value, is_error=is_error, ctx=ctx)  # type: ignore[arg-type]
        assert invalid.value.field == field
    with pytest.raises(RequestInvalid, match="tool_call_id"):
        client.tool_result(run_id, "", "red", ctx=ctx)
    assert_unchanged(ctx, before, "results no store can hold")

    first = client.tool_result(run_id, "call_0_0", {"color": "red"}, ctx=ctx)
    assert first.stored and [r.tool_call_id for r in first.resumes] == ["call_0_0"]
    assert run_row(ctx, run_id)["status"] == "running"
    before = snapshot(ctx)
    again = client.tool_result(run_id, "call_0_0", {"color": "red"}, ctx=ctx)
    assert (again.stored, again.resumes) == (False, [])
    refused(ctx, before, "another result for the same call",
            lambda: client.tool_result(run_id, "call_0_0", {"color": "blue"}, ctx=ctx), "already answered otherwise")

    assert drive(ctx, run_id)["status"] == "completed"
    assert (tool_row(ctx, run_id)["status"], tool_row(ctx, run_id)["result"]) == ("completed", {"color": "red"})
    # The model was not asked again for round 0: one ledger row there.
    calls = rows(ctx.engine, "SELECT boundary_seq FROM model_calls WHERE run_id = :id ORDER BY id", id=run_id)
    assert [c["boundary_seq"] for c in calls] == [0, 1]
    before = snapshot(ctx)
    late = client.tool_result(run_id, "call_0_0", {"color": "red"}, ctx=ctx)  # a retried request, after the end
    assert (late.stored, late.resumes) == (False, [])
    refused(ctx, before, "a different result after the end",
            lambda: client.tool_result(run_id, "call_0_0", {"color": "blue"}, ctx=ctx), "the run has ended")


def test_a_failed_result_reaches_the_model_as_a_failed_tool_result(ctx) -> None:
    run_id = suspended_run(ctx, ASK_COLOR, [], client_tools=[PICK_COLOR])
    client.tool_result(run_id, "call_0_0", {"error": "the user closed the dialog"}, is_error=True, ctx=ctx)
    assert drive(ctx, run_id)["status"] == "completed"
    assert tool_row(ctx, run_id)["status"] == "failed"
    message = tool_message(ctx, run_id)
    assert (message["is_error"], message["result"]) == (True, {"error": "the user closed the dialog"})
    (completed,) = events_of(ctx, run_id, "tool_completed")
    assert completed["status"] == "failed"


def test_an_answer_to_a_cancelled_run_or_a_run_not_waiting_is_refused(ctx, tmp_path: Path) -> None:
    cancelled = suspended_run(ctx, ASK_COLOR, [], client_tools=[PICK_COLOR])
    assert client.cancel(cancelled, ctx=ctx)
    queued = client.submit(
        {"owner": "team-test", "input": "go", "config": {"model": {"provider": "scripted", "turns": ASK_COLOR},
                                                         "client_tools": [PICK_COLOR]}}, ctx=ctx).run_id
    before = snapshot(ctx)
    refused(ctx, before, "a result for a cancelled run",
            lambda: client.tool_result(cancelled, "call_0_0", "red", ctx=ctx), "the run has ended")
    refused(ctx, before, "a result for a run that has not run",
            lambda: client.tool_result(queued, "call_0_0", "red", ctx=ctx), "not waiting for tool call")
    refused(ctx, before, "an approval for a run that waits for nothing",
            lambda: client.approve(queued, "call_0_0", args={"path": "p", "text": "t"}, ctx=ctx), "not waiting")


def test_a_call_that_needs_approval_waits_before_it_runs_and_edited_args_are_checked(ctx, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    run_id = suspended_run(ctx, append(out, "proposed"), ["append_line"], require_approval=["append_line"])
    assert not out.exists()  # suspended before the handler ran
    (wait,) = client.status(run_id, ctx=ctx).waiting_for
    assert (wait.kind, wait.args) == ("approval", {"path": str(out), "text": "proposed"})
    assert rows(ctx.engine, "SELECT * FROM tool_executions") == []

    before = snapshot(ctx)
    for args, field in [({"path": str(out), "text": 5}, "args.text"), ({"text": "x"}, "args.path"),
                        ({"path": str(out), "text": "x", "extra": 1}, "args.extra"), ([1], "args")]:
        with pytest.raises(RequestInvalid) as invalid:
            client.approve(run_id, "call_0_0", args=args, ctx=ctx)  # type: ignore[arg-type]
        assert invalid.value.field == field, invalid.value.message
    for reason in ["", "   ", "x" * 2001]:
        with pytest.raises(RequestInvalid, match="reason"):
            client.reject(run_id, "call_0_0", reason=reason, ctx=ctx)
    assert_unchanged(ctx, before, "invalid approvals and rejections")
    refused(ctx, before, "a result for a call that waits for approval",
            lambda: client.tool_result(run_id, "call_0_0", {"appended": "x"}, ctx=ctx), "not a result")

    edited = {"path": str(out), "text": "edited"}
    receipt = client.approve(run_id, "call_0_0", args=edited, ctx=ctx)
    assert receipt.stored and receipt.resumes
    before = snapshot(ctx)
    assert client.approve(run_id, "call_0_0", args=edited, ctx=ctx).stored is False
    refused(ctx, before, "a rejection after the approval",
            lambda: client.reject(run_id, "call_0_0", reason="no", ctx=ctx), "already answered otherwise")
    refused(ctx, before, "an approval as proposed after an edited one",
            lambda: client.approve(run_id, "call_0_0", ctx=ctx), "already answered otherwise")

    assert drive(ctx, run_id)["status"] == "completed"
    assert [text for text, _ in lines(out)] == ["edited"]
    (completed,) = events_of(ctx, run_id, "tool_completed")
    assert completed["approval"] == {"decision": "approve", "args": edited}
    assert completed["result"] == {"appended": "edited"}
    (delivered,) = events_of(ctx, run_id, "input_delivered")
    assert (delivered["answer"], delivered["args"]) == ("approve", edited)


def test_a_rejected_call_never_runs_and_the_model_is_told_why(ctx, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    turns = [*append(out, "no")[:1], {"tool_calls": [{"name": "echo", "args": {"after": "rejection"}}]},
             {"content": "gave up"}]
    run_id = suspended_run(ctx, turns, ["append_line", "echo"], require_approval=["*"])
    client.reject(run_id, "call_0_0", reason="not on a Friday", ctx=ctx)
    row = drive(ctx, run_id)
    # The echo call of round 1 needs approval too ("*"): approve it as proposed.
    assert (row["status"], row["boundary_seq"]) == ("suspended", 1)
    client.approve(run_id, "call_1_0", ctx=ctx)
    assert drive(ctx, run_id)["status"] == "completed"
    assert not out.exists()
    message = tool_message(ctx, run_id)
    assert message["is_error"] is True
    assert message["result"]["error"]["code"] == "TOOL_REJECTED"
    assert "not on a Friday" in message["result"]["error"]["message"]
    assert tool_message(ctx, run_id, "call_1_0")["result"] == {"after": "rejection"}
    assert rows(ctx.engine, "SELECT * FROM tool_executions") == []


def test_an_unknown_outcome_is_answered_by_a_result_or_a_retry(ctx, tmp_path: Path) -> None:
    """An earlier start of the at_most_once call with no end recorded (what a worker that
    died inside it leaves): planted before round 0 runs."""
    out = tmp_path / "out.txt"
    unknown: list[UUID] = []
    for text in ("by-result", "by-retry"):
        run_id = client.submit(
            {"owner": "team-test", "input": "go",
             "config": {"model": {"provider": "scripted", "turns": append(out, text)}, "tools": ["append_line"]}},
            ctx=ctx).run_id
        with ctx.engine.begin() as conn:
            conn.execute(sql("INSERT INTO tool_executions (run_id, tool_call_id, boundary_seq, claim_fence) "
                             "VALUES (:id, 'call_0_0', 0, 0)"), {"id": run_id})
        assert drive(ctx, run_id)["status"] == "suspended"
        (wait,) = client.status(run_id, ctx=ctx).waiting_for
        assert (wait.kind, wait.args["text"]) == ("outcome_unknown", text)
        assert wait.reason and "never recorded its end" in wait.reason
        unknown.append(run_id)
    assert not out.exists()  # the handler was not started again

    by_result, by_retry = unknown
    before = snapshot(ctx)
    refused(ctx, before, "an approval of an unknown outcome", lambda: client.approve(by_result, "call_0_0", ctx=ctx),
            "not an approval")
    client.tool_result(by_result, "call_0_0", {"appended": "by-result"}, ctx=ctx)
    assert drive(ctx, by_result)["status"] == "completed"
    assert tool_row(ctx, by_result)["result"] == {"appended": "by-result"}
    assert not out.exists()

    client.retry_tool(by_retry, "call_0_0", ctx=ctx)
    assert client.retry_tool(by_retry, "call_0_0", ctx=ctx).stored is False
    assert drive(ctx, by_retry)["status"] == "completed"
    assert [text for text, _ in lines(out)] == ["by-retry"]  # exactly once
    (execution,) = rows(ctx.engine, "SELECT * FROM tool_executions WHERE run_id = :id", id=by_retry)
    assert (execution["executions"], execution["status"]) == (2, "completed")


def test_the_store_refuses_an_answer_of_the_wrong_kind_and_compares_repeats_exactly(ctx) -> None:
    run_id = suspended_run(ctx, ASK_COLOR, [], client_tools=[PICK_COLOR])
    before = snapshot(ctx)
    for answer in [Answer(ToolAnswerKind.APPROVE), Answer(ToolAnswerKind.REJECT, reason="r"),
                   Answer(ToolAnswerKind.RETRY)]:
        with pytest.raises(DeliveryRefused) as refusal:
            answer_tool_call(ctx.engine, run_id, "call_0_0", answer)
        assert refusal.value.field == "kind"
    assert_unchanged(ctx, before, "answers of the wrong kind")
    assert answer_tool_call(ctx.engine, run_id, "call_0_0", Answer(ToolAnswerKind.RESULT, [1, 2])).stored
    before = snapshot(ctx)
    for other in [Answer(ToolAnswerKind.RESULT, [1, 2], is_error=True), Answer(ToolAnswerKind.RESULT, [2, 1])]:
        with pytest.raises(DeliveryRefused, match="already answered otherwise"):
            answer_tool_call(ctx.engine, run_id, "call_0_0", other)
    assert answer_tool_call(ctx.engine, run_id, "call_0_0", Answer(ToolAnswerKind.RESULT, [1.0, 2])).stored is False
    assert_unchanged(ctx, before, "repeats of an answer")
    (answer,) = rows(ctx.engine, "SELECT kind, value, is_error, reason FROM tool_answers")
    assert answer == {"kind": "result", "value": [1, 2], "is_error": False, "reason": None}


def test_a_client_tool_approved_with_edited_args_asks_the_client_with_those_args(ctx) -> None:
    run_id = suspended_run(ctx, ASK_COLOR, [], client_tools=[PICK_COLOR], require_approval=["*"])
    (wait,) = client.status(run_id, ctx=ctx).waiting_for
    assert (wait.kind, wait.args) == ("approval", {"hint": "warm"})
    before = snapshot(ctx)
    with pytest.raises(RequestInvalid) as invalid:  # checked against the client tool's JSON schema
        client.approve(run_id, "call_0_0", args={"hint": 5}, ctx=ctx)
    assert invalid.value.field == "args.hint"
    assert_unchanged(ctx, before, "edited args that fail a client tool's schema")

    client.approve(run_id, "call_0_0", args={"hint": "cold"}, ctx=ctx)
    row = drive(ctx, run_id)
    assert (row["status"], row["boundary_seq"]) == ("suspended", 0)  # now waiting for the client's result
    (wait,) = client.status(run_id, ctx=ctx).waiting_for
    assert (wait.kind, wait.args) == ("client_tool", {"hint": "cold"})
    suspended = events_of(ctx, run_id, "tool_suspended")
    assert [(e["kind"], e["args"]) for e in suspended] == [("approval", {"hint": "warm"}),
                                                             ("client_tool", {"hint": "cold"})]
    client.tool_result(run_id, "call_0_0", {"color": "blue"}, ctx=ctx)
    assert drive(ctx, run_id)["status"] == "completed"
    assert tool_row(ctx, run_id)["result"] == {"color": "blue"}

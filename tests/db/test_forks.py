"""Forks against a real PostgreSQL, the rounds driven in-process the way workers would
(``tests.support.suspensions.drive``): a fork copies its parent's rounds and never runs
them again (no model call, no tool execution for them), goes on from the fork point with
its edit, and every refusal stores nothing and sends nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from runtime.errors import RequestInvalid
from schema.store.bodies import message_body_sql
from schema.store.errors import ForkRefused, RunNotFound
from schema.wire.claim import StoredRound
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.suspensions import TABLES, assert_unchanged, drive, snapshot
from worker import client

TOOLS = ["add", "echo", "append_line", "await_prerequisite"]


def four_rounds(path: Path) -> list[dict[str, Any]]:
    """Rounds 1-3 call a tool each (round 2 an at_most_once effect); round 4 answers."""
    return [
        {"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
        {"tool_calls": [{"name": "append_line", "args": {"path": str(path), "text": "effect"}}]},
        {"tool_calls": [{"name": "echo", "args": {"x": 1}}]},
        {"content": "done"},
    ]


def completed_parent(ctx: Any, path: Path) -> UUID:
    run_id = client.submit(scripted_request(four_rounds(path), tools=TOOLS), ctx=ctx).run_id
    assert drive(ctx, run_id)["status"] == "completed"
    return run_id


def boundaries(ctx: Any, table: str, run_id: UUID) -> list[int]:
    return [r["boundary_seq"] for r in rows(ctx.engine, f"SELECT boundary_seq FROM {table} WHERE run_id = :id "
                                            "ORDER BY boundary_seq", id=run_id)]


def lines(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def test_a_fork_copies_the_rounds_before_its_point_and_runs_only_those_after_it(ctx, broker, tmp_path: Path) -> None:
    effect = tmp_path / "effect.txt"
    parent = completed_parent(ctx, effect)

    forked = client.fork(parent, {"at_round": 2, "edit_input": "and once more"}, ctx=ctx)

    view = client.status(forked.run_id, ctx=ctx)
    assert (view.status, view.rounds, view.forked_from, view.forked_at_round) == ("queued", 2, parent, 2)
    assert view.root_id != client.status(parent, ctx=ctx).root_id and view.model_calls == 0
    # Copied, not recomputed: the rounds rows (fence 0, proofs signed for the fork), and
    # not one ledger, tool or execution row of the fork before its point.
    copied = rows(ctx.engine, "SELECT * FROM rounds WHERE run_id = :id ORDER BY boundary_seq", id=forked.run_id)
    originals = rows(ctx.engine, "SELECT * FROM rounds WHERE run_id = :id AND boundary_seq < 2 "
                     "ORDER BY boundary_seq", id=parent)
    digests = ("system_digest", "messages_digest", "tools_digest", "accepted_response_digest")
    assert [[r[d] for d in digests] for r in copied] == [[r[d] for d in digests] for r in originals]
    for row in copied:
        stored = StoredRound(row["claim_fence"], *(row[d] for d in digests), row["proof"])
        assert row["claim_fence"] == 0
        assert ctx.runtime.base.proofs.verifies_stored_round(forked.run_id, row["boundary_seq"], stored)
        assert not ctx.runtime.base.proofs.verifies_stored_round(parent, row["boundary_seq"], stored)
    assert broker.sent[-1].args == [str(forked.run_id), 2]  # queued at round 3 (boundary 2)

    assert drive(ctx, forked.run_id)["status"] == "completed"
    assert boundaries(ctx, "model_calls", forked.run_id) == [2, 3]
    assert boundaries(ctx, "tool_invocations", forked.run_id) == [2]
    assert boundaries(ctx, "tool_executions", forked.run_id) == []
    assert [text for text, _ in lines(effect)] == ["effect"]  # the effect of round 2 ran once, for the parent
    # The added message ends round 2 in the fork's history, after the copied tool result.
    history = rows(ctx.engine, f"SELECT boundary_seq, role, {message_body_sql()} AS body FROM messages AS m "
                   "WHERE run_id = :id ORDER BY position", id=forked.run_id)
    assert [(m["boundary_seq"], m["role"]) for m in history][:6] == [
        (0, "user"), (0, "assistant"), (0, "tool"), (1, "assistant"), (1, "tool"), (1, "user")]
    assert history[2]["body"]["result"] == {"sum": 3} and history[5]["body"]["content"] == "and once more"

    diff = client.diff(parent, forked.run_id, ctx=ctx)
    assert [(r.round, r.verdict) for r in diff.rounds] == [(1, "same"), (2, "same"), (3, "differs"), (4, "differs")]
    assert diff.rounds[2].differs == ["messages_digest"]


def test_an_effect_after_the_fork_point_runs_again_under_the_forks_own_idempotency_key(ctx, tmp_path: Path) -> None:
    effect = tmp_path / "effect.txt"
    parent = completed_parent(ctx, effect)

    forked = client.fork(parent, {"at_round": 1}, ctx=ctx)
    assert drive(ctx, forked.run_id)["status"] == "completed"

    (first_text, first_key), (again_text, again_key) = lines(effect)
    assert (first_text, again_text) == ("effect", "effect") and first_key != again_key
    executions = rows(ctx.engine, "SELECT run_id, boundary_seq FROM tool_executions ORDER BY started_at")
    assert executions == [{"run_id": parent, "boundary_seq": 1}, {"run_id": forked.run_id, "boundary_seq": 1}]
    assert client.diff(parent, forked.run_id, ctx=ctx).same


def test_an_edited_tool_result_is_what_the_forks_next_round_sees(ctx, tmp_path: Path) -> None:
    parent = completed_parent(ctx, tmp_path / "effect.txt")

    edit = {"tool_call_id": "call_0_0", "result": {"sum": 99}, "is_error": True}
    forked = client.fork(parent, {"at_round": 1, "edit_tool_result": edit}, ctx=ctx)
    assert drive(ctx, forked.run_id)["status"] == "completed"

    (tool,) = rows(ctx.engine, f"SELECT {message_body_sql()} AS body FROM messages AS m WHERE run_id = :id "
                   "AND role = 'tool' AND boundary_seq = 0", id=forked.run_id)
    assert (tool["body"]["result"], tool["body"]["is_error"]) == ({"sum": 99}, True)
    diff = client.diff(parent, forked.run_id, ctx=ctx)
    assert [(r.round, r.verdict, r.differs) for r in diff.rounds[:2]] == [
        (1, "differs", ["tool_results"]), (2, "differs", ["messages_digest"])]
    assert diff.rounds[0].b["tool_results"] == [
        {"tool_call_id": "call_0_0", "name": "add", "result": {"sum": 99}, "is_error": True}]


def test_a_fork_of_a_run_still_going_copies_only_its_committed_rounds(ctx) -> None:
    turns = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
             {"tool_calls": [{"name": "await_prerequisite", "args": {"key": "go"}}]}, {"content": "done"}]
    parent = client.submit(scripted_request(turns, tools=TOOLS), ctx=ctx).run_id
    assert drive(ctx, parent)["status"] == "suspended"  # round 2 waits: one round committed

    with pytest.raises(ForkRefused) as refused:
        client.fork(parent, {"at_round": 2}, ctx=ctx)
    assert refused.value.field == "at_round" and "from 0 to 1" in refused.value.reason

    forked = client.fork(parent, {"at_round": 1, "config_overrides": {"policy.max_rounds": 7}}, ctx=ctx)
    (run,) = rows(ctx.engine, "SELECT config, boundary_seq FROM runs WHERE id = :id", id=forked.run_id)
    assert (run["config"]["policy"]["max_rounds"], run["boundary_seq"]) == (7, 1)
    assert boundaries(ctx, "rounds", forked.run_id) == [0]


REFUSALS: list[Any] = [
    pytest.param({"at_round": 5}, ForkRefused, "at_round", "from 0 to 4", id="past_the_last_round"),
    pytest.param({"at_round": -1}, RequestInvalid, "at_round", "greater than or equal to 0", id="negative"),
    pytest.param({"at_round": 2, "edit_tool_result": {"tool_call_id": "call_0_0", "result": 1}}, ForkRefused,
                 "edit_tool_result.tool_call_id", "round 2 made no tool call 'call_0_0' (its calls: call_1_0)",
                 id="a_call_of_another_round"),
    pytest.param({"at_round": 0, "edit_tool_result": {"tool_call_id": "call_0_0", "result": 1}}, ForkRefused,
                 "edit_tool_result", "no tool result to edit", id="a_result_at_round_0"),
    pytest.param({"at_round": 1, "edit_input": "x", "edit_tool_result": {"tool_call_id": "call_0_0", "result": 1}},
                 RequestInvalid, "edit_tool_result", "at most one edit", id="two_edits"),
    pytest.param({"at_round": 1, "edit_input": "x\x00"}, RequestInvalid, "edit_input", "NUL", id="nul_in_input"),
    pytest.param({"at_round": 1, "edit_tool_result": {"tool_call_id": "call_0_0", "result": float("nan")}},
                 RequestInvalid, "edit_tool_result.result", "", id="nan_result"),
    pytest.param({"at_round": 1, "config_overrides": {"Policy!": 1}}, RequestInvalid, "config_overrides.Policy!",
                 "not a dotted config path", id="bad_path"),
    pytest.param({"at_round": 1, "config_overrides": {"policy.max_rounds": "many"}}, RequestInvalid,
                 "config_overrides.policy.max_rounds", "integer", id="bad_value"),
    pytest.param({"at_round": 1, "config_overrides": {"tools": ["no_such_tool"]}}, RequestInvalid,
                 "config_overrides.tools[0]", "unknown tool", id="unknown_tool"),
    pytest.param({"at_round": 1, "surprise": True}, RequestInvalid, "surprise", "Extra inputs", id="unknown_field"),
]


@pytest.mark.parametrize(("request_", "error", "field", "reason"), REFUSALS)
def test_a_fork_refused_names_the_field_and_stores_and_sends_nothing(
    ctx, broker, tmp_path: Path, request_: dict[str, Any], error: type[Exception], field: str, reason: str
) -> None:
    parent = completed_parent(ctx, tmp_path / "effect.txt")
    before, sent = snapshot(ctx), len(broker.sent)

    with pytest.raises(error) as refused:
        client.fork(parent, request_, ctx=ctx)

    refusal: Any = refused.value
    assert refusal.field == field and reason in refusal.reason, refusal
    assert_unchanged(ctx, before, f"fork {request_}")
    assert len(broker.sent) == sent


def test_a_fork_of_an_unknown_or_another_owners_run_is_not_found_and_stores_nothing(ctx, tmp_path: Path) -> None:
    parent = completed_parent(ctx, tmp_path / "effect.txt")
    before = snapshot(ctx)
    for run_id, owner in ((uuid4(), None), (parent, "someone-else")):
        with pytest.raises(RunNotFound):
            client.fork(run_id, {"at_round": 1}, owner=owner, ctx=ctx)
        with pytest.raises(RunNotFound):
            client.diff(parent, run_id, owner=owner, ctx=ctx)
    assert_unchanged(ctx, before, "forking a run that is not found")
    assert set(TABLES) >= {"runs", "roots", "rounds", "messages"}

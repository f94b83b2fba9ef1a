"""Deliveries of files and resolutions of prerequisites: idempotent, refused when the run does
not wait for them, and never stranding a run.

A run is suspended by a real round (``worker.engine.round.execute_round``), its input delivered
through ``worker.client`` (helpers in tests/support/suspensions.py). Every refusal is checked
against a snapshot of every table the feature touches: a refusal must change nothing at all.
"""

from __future__ import annotations

from uuid import UUID

import pytest

from runtime.errors import RequestInvalid
from runtime.tools import ToolArgsInvalid
from schema.store.suspensions import DeliveryRefused
from tests.support.db import rows
from tests.support.suspensions import (
    BODY_A,
    READ_ONE,
    assert_unchanged,
    drive,
    run_row,
    snapshot,
    submit,
    suspended_run,
)
from worker import client

# --- deliveries and prerequisites -----------------------------------------------------------------


def test_delivering_the_same_files_twice_is_idempotent(ctx) -> None:
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    first = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert first.stored and len(first.resumes) == 1
    assert run_row(ctx, run_id)["status"] == "running"  # ready: its resume was sent

    before = snapshot(ctx)
    again = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert (again.stored, again.resumes) == (False, [])
    assert_unchanged(ctx, before, "the same delivery again")
    with pytest.raises(DeliveryRefused, match="different content"):
        client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A + "!"}, ctx=ctx)
    assert_unchanged(ctx, before, "a different delivery for the same call")

    assert drive(ctx, run_id)["status"] == "completed"
    before = snapshot(ctx)
    try:  # after the end: a no-op receipt, or a refusal; either way nothing changes
        late = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
        assert (late.stored, late.resumes) == (False, [])
    except DeliveryRefused:
        pass
    assert_unchanged(ctx, before, "the same delivery after the run completed")


def test_deliveries_the_run_is_not_waiting_for_are_refused_and_store_nothing(ctx) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "add", "args": {"a": 1, "b": 2}},
                {"name": "read_files", "args": {"paths": ["a.txt", "b.txt"]}},
                {"name": "await_prerequisite", "args": {"key": "approval"}},
            ]
        },
        {"content": "done"},
    ]
    run_id = suspended_run(ctx, turns, ["add", "read_files", "await_prerequisite"])
    queued = submit(ctx, READ_ONE, ["read_files"])
    big = "x" * (ctx.settings.max_local_read_bytes + 1)
    cases: list[tuple[str, UUID, str, dict[str, str], str]] = [
        ("an unknown tool call", run_id, "call_9_9", {"a.txt": "1", "b.txt": "2"}, "not waiting"),
        ("a call that completed", run_id, "call_0_0", {"a.txt": "1", "b.txt": "2"}, "not waiting"),
        ("a call waiting for a prerequisite", run_id, "call_0_2", {"approval": "yes"}, "not waiting"),
        ("a missing path", run_id, "call_0_1", {"a.txt": "1"}, "asked for paths"),
        ("an extra path", run_id, "call_0_1", {"a.txt": "1", "b.txt": "2", "c.txt": "3"}, "asked for paths"),
        ("a wrong path", run_id, "call_0_1", {"a.txt": "1", "B.txt": "2"}, "asked for paths"),
        ("no files", run_id, "call_0_1", {}, "asked for paths"),
        ("a file over the limit", run_id, "call_0_1", {"a.txt": "1", "b.txt": big}, "over the limit"),
        ("a run that has not run yet", queued, "call_0_0", {"notes/a.txt": "1"}, "not waiting"),
    ]
    before = snapshot(ctx)
    for what, target, call, files, problem in cases:
        with pytest.raises(DeliveryRefused) as refused:
            client.deliver(target, call, files, ctx=ctx)
        assert problem in refused.value.message, f"{what}: {refused.value.message}"
        assert_unchanged(ctx, before, f"a delivery to {what}")

    receipt = client.deliver(run_id, "call_0_1", {"b.txt": "2", "a.txt": "1"}, ctx=ctx)
    assert receipt.stored and receipt.resumes == []  # the prerequisite is still missing


def test_a_delivery_to_a_cancelled_run_is_refused_and_stores_nothing(ctx) -> None:
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    assert client.cancel(run_id, ctx=ctx)
    before = snapshot(ctx)
    with pytest.raises(DeliveryRefused):
        client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert_unchanged(ctx, before, "a delivery to a cancelled run")


def test_resolving_a_prerequisite_of_a_cancelled_run_is_refused_and_stores_nothing(ctx) -> None:
    run_id = suspended_run(
        ctx, [{"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}], ["await_prerequisite"]
    )
    assert client.cancel(run_id, ctx=ctx)
    before = snapshot(ctx)
    with pytest.raises(DeliveryRefused):
        client.resolve(run_id, "approval", True, ctx=ctx)
    assert_unchanged(ctx, before, "resolving a prerequisite of a cancelled run")


def test_resolving_keys_the_run_does_not_wait_for_is_refused_and_resolving_twice_is_idempotent(ctx) -> None:
    awaiting = suspended_run(
        ctx,
        [{"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}, {"content": "approved"}],
        ["await_prerequisite"],
    )
    reading = suspended_run(ctx, READ_ONE, ["read_files"])
    before = snapshot(ctx)
    for target, key in [(awaiting, "other"), (awaiting, "Approval"), (reading, "approval"), (reading, "notes/a.txt")]:
        with pytest.raises(DeliveryRefused, match="not waiting for prerequisite"):
            client.resolve(target, key, {"ok": True}, ctx=ctx)
        assert_unchanged(ctx, before, f"resolving {key!r}")

    receipt = client.resolve(awaiting, "approval", {"ok": True}, ctx=ctx)
    assert receipt.stored and [r.tool_call_id for r in receipt.resumes] == ["call_0_0"]
    before = snapshot(ctx)
    again = client.resolve(awaiting, "approval", {"ok": True}, ctx=ctx)
    assert (again.stored, again.resumes) == (False, [])
    with pytest.raises(DeliveryRefused, match="another value"):
        client.resolve(awaiting, "approval", {"ok": False}, ctx=ctx)
    assert_unchanged(ctx, before, "resolving the same key again")

    assert drive(ctx, awaiting)["status"] == "completed"
    (tool,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=awaiting)
    assert tool == {"status": "completed", "result": {"key": "approval", "value": {"ok": True}}}


def test_a_prerequisite_awaited_again_in_a_later_round_does_not_strand_the_run(ctx) -> None:
    """Round 0 and round 1 both await "approval". It was resolved for round 0; the run
    must not end up suspended on an input that is already there with no way to resume."""
    await_approval = {"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}
    run_id = suspended_run(ctx, [await_approval, await_approval, {"content": "done"}], ["await_prerequisite"])
    receipt = client.resolve(run_id, "approval", "yes", ctx=ctx)
    assert receipt.resumes
    row = drive(ctx, run_id)
    if row["status"] == "suspended":
        view = client.status(run_id, ctx=ctx)
        again = client.resolve(run_id, "approval", "yes", ctx=ctx)  # what a client can do
        assert again.resumes, (
            f"run {run_id} is suspended at round {row['boundary_seq']} waiting for {view.waiting_for}; "
            f"resolving the key again answers {again} and nothing will ever resume it"
        )
        row = drive(ctx, run_id)
    assert row["status"] == "completed", row


def test_a_read_that_names_a_path_twice_can_be_delivered_or_fails_but_never_strands_the_run(ctx) -> None:
    twice = {"paths": ["a.txt", "a.txt"]}
    turns = [{"tool_calls": [{"name": "read_files", "args": twice}]}, {"content": "done"}]
    # A real model can ask this at any round; whatever the runtime does, it must not be a
    # suspension that no delivery can satisfy.
    read_files = ctx.runtime.base.tools.get("read_files")
    try:
        read_files.parse_args(twice)
    except ToolArgsInvalid:  # such args never reach a suspension: the submission is refused
        with pytest.raises(RequestInvalid, match="paths"):
            submit(ctx, turns, ["read_files"])
        return
    run_id = submit(ctx, turns, ["read_files"])
    row = drive(ctx, run_id)
    if row["status"] == "suspended":
        view = client.status(run_id, ctx=ctx)
        try:
            receipt = client.deliver(run_id, "call_0_0", {"a.txt": BODY_A}, ctx=ctx)
        except DeliveryRefused as exc:
            pytest.fail(f"the run waits for {view.waiting_for} but no delivery can satisfy it: {exc.message}")
        assert receipt.resumes, f"delivered every path asked for, still waiting: {client.status(run_id, ctx=ctx)}"
        row = drive(ctx, run_id)
    assert row["status"] == "completed", row

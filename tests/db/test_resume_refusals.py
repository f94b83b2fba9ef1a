"""Suspension and original tool resume against a real PostgreSQL, driven in-process.

A run is suspended by a real round (``worker.round.execute_round``), its input delivered
through ``worker.client``, and then resumes are altered, forged, replayed or raced. Every
refusal is checked against a snapshot of every table the feature touches: a refused
resume, delivery or projection must change nothing at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from runtime.canonical import digest
from runtime.deps import DEV_SECRET
from runtime.loop import drive_react_loop
from runtime.proofs import OwnedRoundProjection, OwnedToolCallProjection, ProjectionRefused, ProofAuthority
from runtime.resume import CHECKED_FIELDS, ResumeRefused
from schema.store import runs as run_store
from schema.store.bodies import message_body_sql
from schema.store.suspensions import DeliveryRefused, pending_resumes
from schema.wire import OriginalToolRoundResume, RoundTask, RunStatus
from tests.conftest import rows, scripted_request
from tests.db.test_store import HOLDER
from worker import client
from worker import round as round_mod
from worker.resume import execute_resume
from worker.round import LedgerHooks, RoundDisposition, execute_round, run_claimed

# Every table a round, a delivery or a resume writes (with their stable orders).
TABLES = {
    "runs": "id",
    "roots": "id",
    "run_checkpoints": "run_id",
    "rounds": "run_id, boundary_seq",
    "tool_invocations": "id",
    "messages": "id",
    "run_events": "id",
    "model_calls": "id",
    "local_reads": "run_id, tool_call_id, path",
    "prerequisites": "run_id, key",
}

READ_ONE = [
    {"tool_calls": [{"name": "read_files", "args": {"paths": ["notes/a.txt"]}}]},
    {"content": "read"},
]
READ_AND_COUNT = [
    {
        "tool_calls": [
            {"name": "read_files", "args": {"paths": ["notes/a.txt", "notes/b.txt"]}},
            {"name": "count_words", "args": {"path": "poem.txt"}},
        ]
    },
    {"content": "read and counted"},
]
BODY_A = "alpha body: the quick brown fox"
BODY_B = "beta body\nsecond line"
POEM = "one two three\nfour five\n"

BODY = message_body_sql()  # a tool message's output is stored once, in tool_invocations


# --- helpers -------------------------------------------------------------------------------


def snapshot(ctx: Any) -> dict[str, list[dict[str, Any]]]:
    return {name: rows(ctx.engine, f"SELECT * FROM {name} ORDER BY {order}") for name, order in TABLES.items()}


def assert_unchanged(ctx: Any, before: dict[str, list[dict[str, Any]]], what: str) -> None:
    after = snapshot(ctx)
    changed = [name for name in TABLES if after[name] != before[name]]
    assert not changed, f"{what} changed tables {changed}"


def run_row(ctx: Any, run_id: UUID) -> dict[str, Any]:
    return rows(ctx.engine, "SELECT * FROM runs WHERE id = :id", id=run_id)[0]


def submit(ctx: Any, turns: list[dict[str, Any]], tools: list[str], **kwargs: Any) -> UUID:
    return client.submit(scripted_request(turns, tools=tools, **kwargs), ctx=ctx).run_id


def suspended_run(ctx: Any, turns: list[dict[str, Any]], tools: list[str], **kwargs: Any) -> UUID:
    """A run whose round 0 ran for real and suspended."""
    run_id = submit(ctx, turns, tools, **kwargs)
    assert execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    row = run_row(ctx, run_id)
    assert (row["status"], row["boundary_seq"], row["lease_expires_at"]) == ("suspended", 0, None)
    return run_id


def ready_read_one(ctx: Any) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on one read_files call, its file delivered: ready to resume."""
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    receipt = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert receipt.stored and len(receipt.resumes) == 1
    return run_id, receipt.resumes


def ready_read_and_count(ctx: Any) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on read_files and count_words, all delivered: ready to resume."""
    run_id = suspended_run(ctx, READ_AND_COUNT, ["read_files", "count_words"])
    first = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A, "notes/b.txt": BODY_B}, ctx=ctx)
    assert first.stored and first.resumes == []  # count_words still waits
    second = client.deliver(run_id, "call_0_1", {"poem.txt": POEM}, ctx=ctx)
    assert second.stored and [r.tool_call_id for r in second.resumes] == ["call_0_0", "call_0_1"]
    return run_id, second.resumes


def attempt(ctx: Any, resumes: list[OriginalToolRoundResume]) -> str:
    """``refused:<field>`` or the disposition of ``execute_resume``."""
    try:
        return execute_resume(ctx, resumes).value
    except ResumeRefused as exc:
        return f"refused:{exc.field}"


def drive(ctx: Any, run_id: UUID, *, max_steps: int = 10) -> dict[str, Any]:
    """Run the run in-process the way workers would (a round, or the resume of a ready
    suspended round) until it ends or waits; returns its row."""
    for _ in range(max_steps):
        row = run_row(ctx, run_id)
        if row["status"] not in ("queued", "running"):
            return row
        boundary = row["boundary_seq"]
        if rows(ctx.engine, "SELECT 1 FROM rounds WHERE run_id = :id AND boundary_seq = :b", id=run_id, b=boundary):
            disposition = execute_resume(ctx, pending_resumes(ctx.engine, run_id))
        else:
            disposition = execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
        assert disposition is not RoundDisposition.DROPPED, f"run {run_id} at {boundary}: {row['status']}"
    raise AssertionError(f"run {run_id} did not end in {max_steps} steps")


def events_of(ctx: Any, run_id: UUID, kind: str) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in rows(ctx.engine, "SELECT kind, data FROM run_events WHERE run_id = :id ORDER BY seq", id=run_id)
        if e["kind"] == kind
    ]


def flip_last(value: str) -> str:
    return value[:-1] + ("0" if value[-1] != "0" else "1")


def forged_proof(resume: OriginalToolRoundResume) -> str:
    """A well-formed proof of the genuine fields under a secret that is not the server's."""
    return ProofAuthority(b"not-the-server-secret-0123456789").sign("tool_call", resume.projection_fields())


def resigned(ctx: Any, resume: OriginalToolRoundResume, **update: Any) -> OriginalToolRoundResume:
    """The resume with ``update`` applied and its proof re-signed with the real secret:
    only the field-by-field check against the stored suspension can refuse it."""
    altered = resume.model_copy(update=update)
    return altered.model_copy(update={"proof": ctx.runtime.base.proofs.sign("tool_call", altered.projection_fields())})


# --- resume refusals: field by field ------------------------------------------------------------


def test_each_altered_resume_field_is_refused_naming_it_and_nothing_changes(ctx) -> None:
    _, (genuine,) = ready_read_one(ctx)
    # A second run suspended the same way: its ids, digests and proofs are genuine too.
    other_run = suspended_run(ctx, READ_ONE, ["read_files"])
    (other,) = pending_resumes(ctx.engine, other_run)
    altered_values: dict[str, Any] = {
        "run_id": other.run_id,
        "invocation_id": flip_last(genuine.invocation_id),
        "boundary_seq": 1,
        "tool_call_id": "call_0_1",
        "tool_domain": "sdk",
        "args_digest": digest({"paths": ["notes/other.txt"]}),
        "work_owner": "team-other",
        "claim_fence": genuine.claim_fence + 1,
        "round_proof": other.round_proof,
    }
    assert set(altered_values) == set(CHECKED_FIELDS)
    before = snapshot(ctx)

    named: dict[str, str] = {}
    named_resigned: dict[str, str] = {}
    for field, value in altered_values.items():
        assert getattr(genuine, field) != value
        named[field] = attempt(ctx, [genuine.model_copy(update={field: value})])
        assert_unchanged(ctx, before, f"a resume with {field} altered")
        # Even correctly signed for its altered fields, the resume does not match what is stored.
        named_resigned[field] = attempt(ctx, [resigned(ctx, genuine, **{field: value})])
        assert_unchanged(ctx, before, f"a re-signed resume with {field} altered")

    expected = {field: f"refused:{field}" for field in CHECKED_FIELDS}
    assert named == expected
    assert named_resigned == expected

    # The run was resumable all along: the genuine resume goes through.
    assert execute_resume(ctx, [genuine]) is RoundDisposition.COMMITTED


FORGED_PROOFS: dict[str, Callable[[OriginalToolRoundResume], str]] = {
    "signed with another secret": forged_proof,
    "truncated by one": lambda r: r.proof[:-1],
    "truncated to half": lambda r: r.proof[:32],
    "empty": lambda r: "",
    "upper case": lambda r: r.proof.upper(),
    "the round proof": lambda r: r.round_proof,
    "extended": lambda r: r.proof + "00",
}


def test_a_forged_or_truncated_proof_is_refused_and_nothing_changes(ctx) -> None:
    _, (genuine,) = ready_read_one(ctx)
    before = snapshot(ctx)
    outcomes = {}
    for what, make_proof in FORGED_PROOFS.items():
        proof = make_proof(genuine)
        assert proof != genuine.proof
        outcomes[what] = attempt(ctx, [genuine.model_copy(update={"proof": proof})])
        assert_unchanged(ctx, before, f"a resume with a proof {what}")
    assert outcomes == {what: "refused:proof" for what in FORGED_PROOFS}
    assert execute_resume(ctx, [genuine]) is RoundDisposition.COMMITTED


def test_a_non_ascii_proof_is_refused_like_any_forged_proof(ctx) -> None:
    """A resume arrives as JSON from the broker: its proof can be any string."""
    _, (genuine,) = ready_read_one(ctx)
    before = snapshot(ctx)
    assert attempt(ctx, [genuine.model_copy(update={"proof": "\u00e9" * 64})]) == "refused:proof"
    assert_unchanged(ctx, before, "a resume with a non-ASCII proof")


def test_a_proof_copied_from_another_suspended_call_is_refused(ctx) -> None:
    _, (read, count) = ready_read_and_count(ctx)
    before = snapshot(ctx)
    swapped = [read.model_copy(update={"proof": count.proof}), count.model_copy(update={"proof": read.proof})]
    assert attempt(ctx, swapped) == "refused:proof"
    assert_unchanged(ctx, before, "resumes with swapped proofs")


def test_incomplete_duplicated_or_mixed_resume_sets_are_refused(ctx) -> None:
    _, (read, count) = ready_read_and_count(ctx)
    _, (other,) = ready_read_one(ctx)
    before = snapshot(ctx)
    cases = {
        "none": [],
        "only the first call": [read],
        "only the second call": [count],
        "the first call twice": [read, read],
        "two runs in one resume": [read, count, other],
        "two boundaries in one resume": [read, count.model_copy(update={"boundary_seq": 1})],
    }
    for what, resumes in cases.items():
        if not resumes:
            with pytest.raises(ResumeRefused):
                execute_resume(ctx, resumes)
        else:
            outcome = attempt(ctx, resumes)
            assert outcome.startswith("refused:"), f"{what}: {outcome}"
        assert_unchanged(ctx, before, f"a resume set with {what}")
    assert execute_resume(ctx, [count, read]) is RoundDisposition.COMMITTED  # order does not matter


def test_property_any_altered_field_of_any_resume_is_refused_and_changes_nothing(ctx) -> None:
    """Hypothesis over (which resume, which field, which value) on one ready run: since a
    refusal must not change anything, every example starts from the same state."""
    _, genuine = ready_read_and_count(ctx)
    before = snapshot(ctx)
    fields = (*CHECKED_FIELDS, "proof")

    def values_for(field: str, current: Any) -> st.SearchStrategy[Any]:
        if field == "run_id":
            return st.uuids()
        if field in ("boundary_seq", "claim_fence"):
            return st.integers(min_value=-(2**31), max_value=2**31) | st.sampled_from([current - 1, current + 1])
        mutated = st.integers(min_value=0, max_value=max(len(current) - 1, 0)).map(
            lambda i: current[:i] + ("0" if current[i : i + 1] != "0" else "1") + current[i + 1 :]
        )
        # A non-ASCII proof is pinned by its own example (test_a_forged_or_truncated_proof...[non-ascii]);
        # here proofs stay ASCII so that this property keeps exploring everything else.
        any_text = (
            st.text(alphabet=st.characters(max_codepoint=127), max_size=80)
            if field == "proof"
            else st.text(max_size=80)
        )
        return any_text | mutated | st.just(current[:-1]) | st.just(current + "x")

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(data=st.data())
    def refused(data: st.DataObject) -> None:
        index = data.draw(st.integers(min_value=0, max_value=len(genuine) - 1), label="resume")
        field = data.draw(st.sampled_from(fields), label="field")
        current = getattr(genuine[index], field)
        value = data.draw(values_for(field, current).filter(lambda v: v != current), label="value")
        resumes = list(genuine)
        resumes[index] = genuine[index].model_copy(update={field: value})
        outcome = attempt(ctx, resumes)
        assert outcome.startswith("refused:"), outcome
        assert_unchanged(ctx, before, f"resume {index} with {field}={value!r}")

    refused()
    assert execute_resume(ctx, genuine) is RoundDisposition.COMMITTED


def test_a_tampered_suspended_round_cannot_be_resumed(ctx) -> None:
    run_id, resumes = ready_read_one(ctx)
    with ctx.engine.begin() as conn:
        conn.execute(text("UPDATE rounds SET messages_digest = 'x' WHERE run_id = :id"), {"id": run_id})
    before = snapshot(ctx)
    assert attempt(ctx, resumes) == "refused:round_proof"
    assert_unchanged(ctx, before, "the resume of a tampered round")


# --- replayed and stale resumes ----------------------------------------------------------------


def replayed(outcome: str) -> bool:
    """A replayed resume is refused (on any field) or its claim is dropped."""
    return outcome == "dropped" or outcome.startswith("refused:")


def test_a_replayed_resume_is_refused_after_the_resume_and_after_the_run_completed(ctx) -> None:
    run_id, resumes = ready_read_one(ctx)
    assert execute_resume(ctx, resumes) is RoundDisposition.COMMITTED
    # Replayed between the resume and the next round (the run is running at boundary 1).
    before = snapshot(ctx)
    assert replayed(attempt(ctx, resumes))
    assert_unchanged(ctx, before, "a resume replayed before the next round")

    assert drive(ctx, run_id)["status"] == "completed"
    before = snapshot(ctx)
    assert replayed(attempt(ctx, resumes))
    assert replayed(attempt(ctx, [resigned(ctx, resumes[0], boundary_seq=1)]))
    assert_unchanged(ctx, before, "a resume replayed after the run completed")
    assert len(events_of(ctx, run_id, "round_resumed")) == 1


def test_a_stale_resume_whose_suspension_another_claim_resumed_in_between_is_dropped(ctx, monkeypatch) -> None:
    """The resume passes its checks, then, before it claims, another holder resumes the
    same suspension and commits. The late claim must find nothing to claim."""
    run_id, resumes = ready_read_and_count(ctx)
    original_claim = run_store.claim_round
    state: dict[str, Any] = {}

    def claim_after_another_resume(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("resume_of") is not None and "other" not in state:
            state["other"] = "running"
            state["other"] = execute_resume(ctx, resumes)  # the other holder, to completion
            state["after_other"] = snapshot(ctx)
        return original_claim(*args, **kwargs)

    monkeypatch.setattr(run_store, "claim_round", claim_after_another_resume)
    assert execute_resume(ctx, resumes) is RoundDisposition.DROPPED
    assert state["other"] is RoundDisposition.COMMITTED
    assert_unchanged(ctx, state["after_other"], "the stale resume")
    assert len(events_of(ctx, run_id, "round_resumed")) == 1
    completed = events_of(ctx, run_id, "tool_completed")
    assert sorted(e["tool_call_id"] for e in completed) == ["call_0_0", "call_0_1"]


def test_concurrent_deliveries_of_one_resume_commit_it_exactly_once(ctx) -> None:
    run_id, resumes = ready_read_and_count(ctx)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def race() -> None:
        barrier.wait()
        outcomes.append(attempt(ctx, resumes))

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes).count("committed") == 1, outcomes
    assert all(o == "committed" or replayed(o) for o in outcomes), outcomes
    assert len(events_of(ctx, run_id, "round_resumed")) == 1
    tool_messages = rows(
        ctx.engine, f"SELECT {BODY} AS body FROM messages AS m WHERE run_id = :id AND role = 'tool'", id=run_id
    )
    assert sorted(m["body"]["tool_call_id"] for m in tool_messages) == ["call_0_0", "call_0_1"]


def test_the_resume_claim_takes_only_the_very_suspension_it_names(ctx) -> None:
    run_id, resumes = ready_read_and_count(ctx)
    ids = [r.invocation_id for r in resumes]
    before = snapshot(ctx)

    def claim(resume_of: list[str] | None) -> Any:
        return run_store.claim_round(
            ctx.engine, run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER, resume_of=resume_of
        )

    assert claim(None) is None  # a plain round claim never re-runs a suspended round
    assert claim(ids[:1]) is None
    assert claim([*ids, "0" * 32]) is None
    assert claim([ids[0], "f" * 32]) is None
    assert claim([]) is None
    assert_unchanged(ctx, before, "refused resume claims")
    taken = claim(list(reversed(ids)))
    assert taken is not None and taken.fence == resumes[0].claim_fence + 1


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
    if read_files.run(twice).status != "suspended":
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


# --- proofs of rounds ------------------------------------------------------------------------------


def _copied_round(result: Any) -> Any:
    original = result.projection
    return dataclasses.replace(result, projection=OwnedRoundProjection(**original.fields(), proof=original.proof))


def _other_authority_round(result: Any) -> Any:
    """Issued by another authority with the same secret: its proof verifies here, but this
    process's driver did not issue it."""
    original = result.projection
    return dataclasses.replace(result, projection=ProofAuthority(DEV_SECRET).issue_round(**original.fields()))


def _copied_tool_call(result: Any) -> Any:
    invocations = []
    for inv in result.tool_invocations:
        if inv.projection is not None:
            p = inv.projection
            inv = dataclasses.replace(inv, projection=OwnedToolCallProjection(**p.fields(), proof=p.proof))
        invocations.append(inv)
    return dataclasses.replace(result, tool_invocations=tuple(invocations))


PROJECTION_TAMPERS: dict[str, Callable[[Any], Any]] = {
    "round projection copied": _copied_round,
    "round projection of another authority": _other_authority_round,
    "tool call projection copied": _copied_tool_call,
}


def test_a_result_whose_projection_this_process_did_not_issue_is_not_recorded(ctx) -> None:
    proofs = ctx.runtime.base.proofs
    for what, tamper in PROJECTION_TAMPERS.items():
        run_id = submit(ctx, READ_ONE, ["read_files"])
        claim = run_store.claim_round(ctx.engine, run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER)
        assert claim is not None
        seen: dict[str, Any] = {}

        def step(
            deps: Any,
            state: Any,
            hooks: Any = None,
            tamper: Callable[[Any], Any] = tamper,
            claim: Any = claim,
            seen: dict[str, Any] = seen,
        ) -> Any:
            genuine = drive_react_loop(deps, state, hooks or LedgerHooks(ctx, claim))
            seen["genuine"] = genuine
            seen["tampered"] = tampered = tamper(genuine)
            return tampered

        before = snapshot(ctx)
        with pytest.raises(ProjectionRefused):
            run_claimed(ctx, claim, None, step)

        tampered = seen["tampered"]
        # The copies carry valid proofs: only their provenance is wrong.
        proofs.verify_round(tampered.projection)
        for inv in tampered.tool_invocations:
            assert proofs.verifies("tool_call", inv.projection.fields(), inv.projection.proof)
        round_mod.record_of(ctx, claim, seen["genuine"])  # the genuine result would have been recorded

        after = snapshot(ctx)
        for name in ("rounds", "tool_invocations", "messages", "run_events", "local_reads"):
            assert after[name] == before[name], f"{what}: {name} changed"
        row = run_row(ctx, run_id)
        assert (row["status"], row["boundary_seq"], row["lease_expires_at"]) == ("running", 0, None), what


def _round_1_after_tampering(ctx: Any, assignment: str | None) -> tuple[Any, dict[str, Any], list[int], list[int]]:
    """Round 0 commits; its stored row is altered with ``assignment``; round 1 is executed
    on a cold worker. Returns the disposition, the run row, and the boundaries of model
    calls and rounds."""
    turns = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "three"}]
    run_id = submit(ctx, turns, ["add"])
    assert execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    if assignment is not None:
        with ctx.engine.begin() as conn:
            conn.execute(text(f"UPDATE rounds SET {assignment} WHERE run_id = :id"), {"id": run_id})
    ctx.runtime.contexts.discard(run_id)
    disposition = execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=1))
    calls = rows(ctx.engine, "SELECT boundary_seq FROM model_calls WHERE run_id = :id ORDER BY id", id=run_id)
    rounds = rows(ctx.engine, "SELECT boundary_seq FROM rounds WHERE run_id = :id ORDER BY boundary_seq", id=run_id)
    return disposition, run_row(ctx, run_id), [c["boundary_seq"] for c in calls], [r["boundary_seq"] for r in rounds]


TAMPERED_ROUND = {
    "messages_digest": "messages_digest = 'x'",
    "system_digest": "system_digest = 'x'",
    "claim_fence": "claim_fence = claim_fence + 1",
    "proof": "proof = CASE WHEN left(proof, 1) = '0' THEN '1' ELSE '0' END || substr(proof, 2)",
    "proof removed": "proof = NULL",
}


def test_a_run_whose_previous_round_proof_was_tampered_fails_instead_of_running(ctx) -> None:
    disposition, row, calls, rounds = _round_1_after_tampering(ctx, None)  # the control: untampered
    assert disposition is RoundDisposition.COMMITTED
    assert (row["status"], row["output"], calls, rounds) == ("completed", "three", [0, 1], [0, 1])

    for what, assignment in TAMPERED_ROUND.items():
        disposition, row, calls, rounds = _round_1_after_tampering(ctx, assignment)
        assert disposition is RoundDisposition.RUN_FAILED, what
        assert (row["status"], row["error_code"]) == ("failed", "ROUND_PROOF_INVALID"), what
        assert (calls, rounds) == ([0], [0]), f"{what}: round 1 ran on a tampered predecessor"
        assert [e["error_code"] for e in events_of(ctx, row["id"], "run_failed")] == ["ROUND_PROOF_INVALID"]


def test_a_non_ascii_stored_round_proof_fails_the_run_with_round_proof_invalid(ctx) -> None:
    disposition, row, calls, rounds = _round_1_after_tampering(ctx, "proof = repeat(chr(233), 64)")
    assert disposition is RoundDisposition.RUN_FAILED
    assert (row["status"], row["error_code"]) == ("failed", "ROUND_PROOF_INVALID")
    assert (calls, rounds) == ([0], [0])


# --- durable local reads: where the bodies are, and what the status shows ---------------------------


def test_delivered_file_bodies_live_in_local_reads_only_and_the_model_still_sees_them(ctx) -> None:
    secret_body = f"BODY-{uuid4().hex} only the model and local_reads may hold this"
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    receipt = client.deliver(run_id, "call_0_0", {"notes/a.txt": secret_body}, ctx=ctx)
    assert execute_resume(ctx, receipt.resumes) is RoundDisposition.COMMITTED
    warm = ctx.runtime.contexts.get(run_id)
    assert warm is not None

    # Round 1 on a cold worker: the claim joins the bodies in from the durable store.
    ctx.runtime.contexts.discard(run_id)
    claim = run_store.claim_round(ctx.engine, run_id, 1, lease_s=30, after_position=-1, cold=True, holder=HOLDER)
    assert claim is not None
    seen: dict[str, Any] = {}

    def step(deps: Any, state: Any, hooks: Any = None) -> Any:  # (the shell may pass its own hooks)
        seen["state"] = state
        return drive_react_loop(deps, state, hooks or LedgerHooks(ctx, claim))

    assert run_claimed(ctx, claim, None, step) is RoundDisposition.COMMITTED
    cold = seen["state"]
    assert cold.history_digest == warm.history_digest
    assert secret_body in json.dumps([m.to_json() for m in cold.history])
    assert secret_body in json.dumps([m.to_json() for m in warm.history])
    assert run_row(ctx, run_id)["status"] == "completed"

    bodies = rows(ctx.engine, "SELECT body::text AS t FROM messages")
    assert bodies and not [b for b in bodies if secret_body in b["t"]], "a message stores the file body"
    for table, column in [("tool_invocations", "result"), ("run_events", "data")]:
        stored = rows(ctx.engine, f"SELECT coalesce({column}::text, '') AS t FROM {table}")
        assert not [s for s in stored if secret_body in s["t"]], f"{table}.{column} stores the file body"
    (read,) = rows(
        ctx.engine, "SELECT path, content, digest, size_bytes FROM local_reads WHERE run_id = :id", id=run_id
    )
    expected_digest = hashlib.sha256(secret_body.encode()).hexdigest()
    size = len(secret_body.encode())
    assert read == {"path": "notes/a.txt", "content": secret_body, "digest": expected_digest, "size_bytes": size}
    (tool,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=run_id)
    assert tool == {
        "status": "completed",
        "result": {
            "files": [{"path": "notes/a.txt", "status": "received", "digest": expected_digest, "size_bytes": size}]
        },
    }


def test_status_shows_what_a_suspended_run_waits_for(ctx) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "read_files", "args": {"paths": ["a.txt", "b.txt"]}},
                {"name": "await_prerequisite", "args": {"key": "approval"}},
            ]
        },
        {"content": "done"},
    ]
    run_id = suspended_run(ctx, turns, ["read_files", "await_prerequisite"])

    def waiting() -> list[tuple[Any, ...]]:
        view = client.status(run_id, ctx=ctx)
        return [(w.tool_call_id, w.tool_name, w.kind, w.paths, w.key, w.delivered) for w in view.waiting_for]

    view = client.status(run_id, ctx=ctx)
    assert (view.status, view.rounds, view.model_calls) == (RunStatus.SUSPENDED, 0, 1)
    assert waiting() == [
        ("call_0_0", "read_files", "local_read", ["a.txt", "b.txt"], None, False),
        ("call_0_1", "await_prerequisite", "prerequisite", None, "approval", False),
    ]
    client.deliver(run_id, "call_0_0", {"a.txt": "1", "b.txt": "2"}, ctx=ctx)
    assert client.status(run_id, ctx=ctx).status is RunStatus.SUSPENDED
    assert [w[-1] for w in waiting()] == [True, False]
    receipt = client.resolve(run_id, "approval", 42, ctx=ctx)
    assert len(receipt.resumes) == 2
    assert client.status(run_id, ctx=ctx).status is RunStatus.RUNNING
    assert execute_resume(ctx, receipt.resumes) is RoundDisposition.COMMITTED
    assert waiting() == []
    assert drive(ctx, run_id)["status"] == "completed"
    final = client.status(run_id, ctx=ctx)
    assert (final.status, final.rounds, final.model_calls, final.waiting_for) == (RunStatus.COMPLETED, 2, 2, [])

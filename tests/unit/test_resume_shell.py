"""The worker shell of a resume (``worker.engine.resume``) and of a suspension's aftermath
(``worker.engine.round``) on the in-memory store: no PostgreSQL, no broker. The db tier proves
the same against the real store (tests/db/test_resume_*.py, test_deliveries.py)."""

from __future__ import annotations

import pytest

from runtime.resume import ResumeRefused
from schema.wire import RoundTask
from tests.support.shell import Sent, shell
from worker.engine.resume import execute_resume
from worker.engine.round import RoundDisposition, execute_round

READ_ONE = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["notes/a.txt"]}}]}, {"content": "read"}]
BODY_A = "alpha body: the quick brown fox"
AWAIT = {"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}


def test_a_resume_of_a_suspended_round_commits_the_original_tool_calls_result() -> None:
    s = shell()
    run_id = s.submit(READ_ONE, tools=["read_files"])
    assert execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    run = s.store.run(run_id)
    assert (run.status, run.boundary_seq, run.lease_expires_at) == ("suspended", 0, None)
    assert s.dispatch.sent == []  # it waits for the file: nothing to send
    (suspended,) = s.store.tool_invocations
    assert suspended["status"] == "suspended" and suspended["result"] is None

    receipt = s.store.deliver_local_read(run_id, "call_0_0", {"notes/a.txt": BODY_A})
    assert execute_resume(s.ctx, receipt.resumes) is RoundDisposition.COMMITTED
    (tool,) = s.store.tool_invocations  # completed in place, the same row
    assert tool["tool_call_id"] == "call_0_0" and tool["status"] == "completed"
    assert [f["path"] for f in tool["result"]["files"]] == ["notes/a.txt"]  # a placeholder; the body is in local_reads
    assert s.store.rounds[(run_id, 0)]["outcome"] == "continue" and s.store.rounds[(run_id, 0)]["resume_fence"] == 2
    assert len(s.store.model_calls) == 1  # a resume calls no model
    assert s.dispatch.sent == [Sent("round", run_id, 1)]

    assert s.deliver_sent() == ["committed"]
    run = s.store.run(run_id)
    assert (run.status, run.output) == ("completed", "read")


def test_a_suspension_whose_inputs_are_already_there_dispatches_its_resume() -> None:
    # Round 0 and round 1 both await "approval"; it was resolved for round 0.
    s = shell()
    run_id = s.submit([AWAIT, AWAIT, {"content": "done"}], tools=["await_prerequisite"])
    assert execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    assert s.dispatch.sent == []
    receipt = s.store.resolve_prerequisite(run_id, "approval", "yes")
    assert execute_resume(s.ctx, receipt.resumes) is RoundDisposition.COMMITTED
    assert s.dispatch.sent == [Sent("round", run_id, 1)]
    s.dispatch.sent.clear()

    assert execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=1)) is RoundDisposition.COMMITTED
    (sent,) = s.dispatch.sent
    assert (sent.kind, sent.run_id, sent.boundary_seq) == ("resume", run_id, 1)
    assert [r.tool_call_id for r in sent.resumes] == ["call_1_0"]
    assert s.store.events[-1]["kind"] == "resume_ready" and s.store.run(run_id).status == "running"
    assert s.deliver_sent() == ["committed", "committed"]
    assert s.store.run(run_id).output == "done"


def test_a_resume_with_an_altered_proof_is_refused_and_changes_nothing() -> None:
    s = shell()
    run_id = s.submit(READ_ONE, tools=["read_files"])
    execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    (resume,) = s.store.deliver_local_read(run_id, "call_0_0", {"notes/a.txt": BODY_A}).resumes
    forged = resume.model_copy(update={"proof": resume.proof[:-1] + ("0" if resume.proof[-1] != "0" else "1")})
    before, calls = s.store.snapshot(), len(s.store.calls)
    with pytest.raises(ResumeRefused) as refused:
        execute_resume(s.ctx, [forged])
    assert refused.value.field == "proof"
    assert s.store.snapshot() == before
    assert s.store.calls[calls:] == ["load_suspension"]  # refused before the claim


def test_a_replayed_resume_is_refused_and_a_resume_of_a_leased_run_is_dropped() -> None:
    s = shell()
    run_id = s.submit(READ_ONE, tools=["read_files"])
    execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    resumes = s.store.deliver_local_read(run_id, "call_0_0", {"notes/a.txt": BODY_A}).resumes
    invocation_ids = [r.invocation_id for r in resumes]
    held = s.store.claim_round(
        run_id, 0, lease_s=30, after_position=-1, cold=True, holder=s.leases.worker_id, resume_of=invocation_ids
    )
    assert held is not None
    before = s.store.snapshot()
    assert execute_resume(s.ctx, resumes) is RoundDisposition.DROPPED  # another holder is resuming it
    assert s.store.snapshot() == before

    s.store.expire_lease(run_id)
    assert execute_resume(s.ctx, resumes) is RoundDisposition.COMMITTED
    with pytest.raises(ResumeRefused) as replayed:
        execute_resume(s.ctx, resumes)
    assert replayed.value.field == "invocation_id"


def test_a_resume_claim_refused_on_a_stale_snapshot_is_claimed_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a round's (test_round_shell): the resume's claim, refused although the run
    meets every condition when read right after, is made once more and commits."""
    s = shell()
    run_id = s.submit(READ_ONE, tools=["read_files"])
    assert execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    receipt = s.store.deliver_local_read(run_id, "call_0_0", {"notes/a.txt": BODY_A})
    real = s.store.claim_round
    calls: list[bool] = []

    def stale_first(*args: object, **kwargs: object) -> object:
        calls.append(True)
        return None if len(calls) == 1 else real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(s.store, "claim_round", stale_first)
    assert execute_resume(s.ctx, receipt.resumes) is RoundDisposition.COMMITTED
    assert len(calls) == 2 and s.dispatch.sent == [Sent("round", run_id, 1)]

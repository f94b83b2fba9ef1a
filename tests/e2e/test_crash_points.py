from __future__ import annotations

import pytest

from tests.support.cluster import Cluster, events, wait_events, wait_exit
from tests.support.db import calls_per_boundary, model_calls, round_rows, rows, wait_terminal
from tests.support.requests import scripted_request
from worker import client
from worker.engine.failpoints import EXIT_CODE

SCRIPT = [
    {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
    {"tool_calls": [{"name": "echo", "args": {"k": "v"}}]},
    {"content": "done"},
]

# Per crash point in round 0: (model calls per boundary, fence of each committed round,
# (attempt, fence) of each ledger row at boundary 0). Worker A claims round 0 with fence 1;
# every later claim is worker B's.
EXPECTED = {
    # A dies before the model call, before the round's execution started: that costs the
    # round no attempt, so B's claim is still attempt 1 and makes the only call.
    "after_claim": ({0: 1, 1: 1, 2: 1}, [2, 3, 4], [(1, 2)]),
    # A paid for a call and died with its response on the ledger: B goes on from that
    # response (the same tool call) without calling the model again, so the ledger has A's
    # call only.
    "after_model_call": ({0: 1, 1: 1, 2: 1}, [2, 3, 4], [(1, 1)]),
    # A committed round 0 but never sent round 1: the reconciler sends it, B runs it.
    "after_commit": ({0: 1, 1: 1, 2: 1}, [1, 2, 3], [(1, 1)]),
    # A committed and sent round 1, then died before acknowledging round 0.
    "after_enqueue": ({0: 1, 1: 1, 2: 1}, [1, 2, 3], [(1, 1)]),
}


@pytest.mark.parametrize("failpoint", list(EXPECTED))
def test_crash_at_failpoint_run_completes_on_another_worker(cluster: Cluster, ctx, failpoint: str) -> None:
    expected_calls, expected_fences, expected_ledger_b0 = EXPECTED[failpoint]
    # A is alone (one thread, so it reserves nothing else) and takes round 0.
    cluster.start_worker("a", concurrency=1, env={"AIDAWORK_FAILPOINTS": failpoint})
    cluster.start_beat()
    submitted = client.submit(scripted_request(SCRIPT), ctx=ctx)
    run_id = submitted.run_id

    assert wait_exit(cluster, "a") == EXIT_CODE
    assert [e["failpoint"] for e in events(cluster, "a", "failpoint_hit")] == [failpoint]
    a_claims = events(cluster, "a", "round_claimed", run_id=run_id)
    assert [(e["boundary_seq"], e["claim_fence"], e["attempt"]) for e in a_claims] == [(0, 1, 1)]
    committed_by_a = failpoint in ("after_commit", "after_enqueue")
    assert len(events(cluster, "a", "round_committed")) == int(committed_by_a)
    # (The round_enqueued lines of a round A held carry its claim.)
    sent_by_a_round = [e for e in events(cluster, "a", "round_enqueued") if "claim_fence" in e]
    assert [e["next_boundary_seq"] for e in sent_by_a_round] == ([1] if failpoint == "after_enqueue" else [])

    cluster.start_worker("b")
    run = wait_terminal(ctx.engine, run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "done"
    assert run["boundary_seq"] == 3

    # One accepted round per boundary.
    rounds = round_rows(ctx.engine, run_id)
    assert [r["boundary_seq"] for r in rounds] == [0, 1, 2]
    assert all(r["accepted_response_digest"] for r in rounds)
    assert [r["claim_fence"] for r in rounds] == expected_fences
    b_commits = wait_events(cluster, "b", "round_committed", run_id=run_id, count=2 if committed_by_a else 3)
    b_claims = events(cluster, "b", "round_claimed", run_id=run_id)
    assert sorted(e["boundary_seq"] for e in b_commits) == ([1, 2] if committed_by_a else [0, 1, 2])
    assert {e["claim_fence"] for e in b_commits} == set(expected_fences) - ({1} if committed_by_a else set())
    assert {e["claim_fence"] for e in b_claims} == {e["claim_fence"] for e in b_commits}, "a claim left no round"

    # Model calls: one per boundary, whatever the crash point: a call paid for before the
    # crash is not paid for again.
    per_boundary = calls_per_boundary(ctx.engine, run_id)
    assert all(n == 1 for n in per_boundary.values()), per_boundary
    assert per_boundary == expected_calls
    reused = events(cluster, "b", "model_response_reused", run_id=run_id)
    assert [(e["boundary_seq"], e["claim_fence"]) for e in reused] == (
        [(0, 2)] if failpoint == "after_model_call" else []
    )
    ledger_b0 = [(c["attempt"], c["claim_fence"]) for c in model_calls(ctx.engine, run_id) if c["boundary_seq"] == 0]
    assert ledger_b0 == expected_ledger_b0
    assert {c["status"] for c in model_calls(ctx.engine, run_id)} == {"succeeded"}

    # The transcript holds each round once.
    messages = rows(ctx.engine, "SELECT role FROM messages WHERE run_id = :id ORDER BY position", id=run_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    tools = rows(
        ctx.engine, "SELECT tool_call_id FROM tool_invocations WHERE run_id = :id ORDER BY boundary_seq", id=run_id
    )
    assert [t["tool_call_id"] for t in tools] == ["call_0_0", "call_1_0"]

from __future__ import annotations

import signal

from tests.support.cluster import Cluster, events
from tests.support.db import (
    calls_per_boundary,
    model_calls,
    round_rows,
    rows,
    run_row,
    wait_model_call_succeeded,
    wait_terminal,
)
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

SLEEP_S = 2  # the round to kill sits in this tool call; far longer than it takes to kill it
SCRIPT = [
    {"tool_calls": [{"name": "sleep", "args": {"seconds": SLEEP_S}}]},
    {"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
    {"content": "survived"},
]


def holder_of(cluster: Cluster, names: tuple[str, ...], run_id, boundary_seq: int) -> str | None:
    """The worker whose log says it claimed this round (None while no log says so)."""
    holders = [n for n in names if events(cluster, n, "round_claimed", run_id=run_id, boundary_seq=boundary_seq)]
    assert len(holders) <= 1, f"round {boundary_seq} claimed by {holders}"
    return holders[0] if holders else None


def test_worker_killed_mid_round_run_completes_on_another_worker(cluster: Cluster, ctx) -> None:
    workers = ("w1", "w2")
    for name in workers:
        cluster.start_worker(name)
    cluster.start_beat()

    submitted = client.submit(scripted_request(SCRIPT), ctx=ctx)
    run_id = submitted.run_id
    # The round's model call returned: the holder is now inside the sleep tool.
    first_call = wait_model_call_succeeded(ctx.engine, run_id, 0)
    victim = wait_until(lambda: holder_of(cluster, workers, run_id, 0), what="the holder's round_claimed line")
    survivor = next(n for n in workers if n != victim)
    cluster.kill(victim)
    assert cluster.procs[victim].returncode == -signal.SIGKILL
    assert not events(cluster, victim, "round_committed"), "the victim finished its round before it was killed"
    assert run_row(ctx.engine, run_id)["boundary_seq"] == 0

    run = wait_terminal(ctx.engine, run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "survived"

    # Exactly one accepted round per boundary, all written by the survivor's claims.
    rounds = round_rows(ctx.engine, run_id)
    assert [r["boundary_seq"] for r in rounds] == [0, 1, 2]
    assert all(r["accepted_response_digest"] for r in rounds)
    survivor_claims = {e["claim_fence"] for e in events(cluster, survivor, "round_claimed", run_id=run_id)}
    assert {r["claim_fence"] for r in rounds} <= survivor_claims
    assert first_call["claim_fence"] not in {r["claim_fence"] for r in rounds}

    # The survivor re-ran round 0 as its second attempt, from the response the victim's call
    # had accepted (the victim died in the tool that response asked for): the model was
    # called once per boundary, and the dead claim's call is the only one of round 0.
    retaken = events(cluster, survivor, "round_claimed", run_id=run_id, boundary_seq=0)
    assert [e["attempt"] for e in retaken] == [2]
    reused = events(cluster, survivor, "model_response_reused", run_id=run_id)
    assert [e["claim_fence"] for e in reused] == [e["claim_fence"] for e in retaken]
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1, 2: 1}
    assert [(c["boundary_seq"], c["attempt"], c["status"]) for c in model_calls(ctx.engine, run_id)] == [
        (0, 1, "succeeded"),
        (1, 1, "succeeded"),
        (2, 1, "succeeded"),
    ]
    assert model_calls(ctx.engine, run_id)[0]["claim_fence"] == first_call["claim_fence"]
    # The transcript has the sleep round once: user, call, result, call, result, answer.
    messages = rows(ctx.engine, "SELECT position, role FROM messages WHERE run_id = :id ORDER BY position", id=run_id)
    assert [(m["position"], m["role"]) for m in messages] == list(
        enumerate(["user", "assistant", "tool", "assistant", "tool", "assistant"])
    )
    tools = rows(
        ctx.engine,
        "SELECT tool_call_id, claim_fence FROM tool_invocations WHERE run_id = :id ORDER BY boundary_seq",
        id=run_id,
    )
    assert [t["tool_call_id"] for t in tools] == ["call_0_0", "call_1_0"]
    assert tools[0]["claim_fence"] == rounds[0]["claim_fence"]

from __future__ import annotations

import signal
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from schema.store.audit import audit
from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import (
    calls_per_boundary,
    model_calls,
    round_rows,
    rows,
    run_row,
    wait_model_call_succeeded,
    wait_terminal,
)
from tests.support.env import default_timings
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client
from worker.ops.settings import Settings

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


# A lost worker costs seconds, not a lease: at the default settings (a 30 s lease), the
# rounds a killed worker held are sent to another worker once beat sees it silent past
# AIDAWORK_WORKER_DEAD_AFTER_S.
DEFAULTS = default_timings()
LEASE_S = Settings.model_fields["lease_s"].default
# The runs must be done well within a lease of the kill: only the dead-worker path can do that.
DONE_WITHIN_S = LEASE_S - 5
RUNS, ROUNDS, CALL_MS = 6, 10, 300


def counting_request(i: int) -> dict[str, Any]:
    """ROUNDS - 1 tool rounds (distinct args: identical ones would trip the breaker), then
    the answer; every model call takes CALL_MS, so a kill lands in one."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "add", "args": {"a": i, "b": k}}], "latency_ms": CALL_MS} for k in range(ROUNDS - 1)
    ]
    turns.append({"content": f"counted-{i}", "latency_ms": CALL_MS})
    return scripted_request(turns, tools=["add"])


def worker_id_of(cluster: Cluster, name: str) -> str:
    registered = wait_until(lambda: events(cluster, name, "worker_registered"), what=f"{name} to register")
    return str(registered[0]["worker_id"])


# Safe to kill now: every unfinished run is leased (no worker is between a commit and the
# next claim, where a kill would leave a run for the dispatch grace), and every round the
# victim holds is in its model call with time left (none is about to commit).
_KILLABLE_SQL = """
SELECT count(*) FILTER (WHERE lease_expires_at IS NULL) AS unleased,
       count(*) FILTER (WHERE holder = :victim AND boundary_seq >= 1) AS held,
       count(*) FILTER (WHERE holder = :victim AND NOT fresh_call) AS held_late
FROM (SELECT r.lease_expires_at, r.boundary_seq, r.round_holders[cardinality(r.round_holders)] AS holder,
        EXISTS (SELECT 1 FROM model_calls AS mc WHERE mc.run_id = r.id AND mc.boundary_seq = r.boundary_seq
                  AND mc.claim_fence = r.claim_fence AND mc.status = 'started'
                  AND mc.started_at > clock_timestamp() - make_interval(secs => :fresh_s)) AS fresh_call
      FROM runs AS r WHERE r.id = ANY(:ids) AND r.status <> 'completed') AS s
"""


def killable(ctx: Any, victim: str, run_ids: list[UUID]) -> bool:
    (found,) = rows(ctx.engine, _KILLABLE_SQL, victim=victim, ids=run_ids, fresh_s=CALL_MS / 2000)
    return found["unleased"] == 0 and found["held"] >= 2 and found["held_late"] == 0


def test_a_killed_workers_runs_move_to_another_worker_in_seconds_not_a_lease(cluster: Cluster, ctx) -> None:
    # A has the threads for most runs; B keeps a thread per run it has, so that few rounds
    # move from A to B before the kill (a worker with a free thread takes the next round).
    cluster.start_worker("a", concurrency=4, env=DEFAULTS)
    cluster.start_worker("b", concurrency=2, env=DEFAULTS)
    cluster.start_beat(env=DEFAULTS)
    wait_ready(cluster, "a", "b")
    victim = worker_id_of(cluster, "a")
    run_ids = [client.submit(counting_request(i), ctx=ctx).run_id for i in range(RUNS)]

    wait_until(lambda: killable(ctx, victim, run_ids), interval_s=0.01, what="A to hold rounds mid-call")
    killed_at = datetime.now(UTC)
    cluster.kill("a")
    held = rows(
        ctx.engine,
        "SELECT id, boundary_seq, claim_fence, lease_expires_at FROM runs "
        "WHERE id = ANY(:ids) AND round_holders[cardinality(round_holders)] = :victim AND lease_expires_at IS NOT NULL",
        ids=run_ids, victim=victim,
    )
    killed = {r["id"]: r for r in held}
    assert len(killed) >= 2, held

    def all_done() -> bool:
        return all(run_row(ctx.engine, r)["status"] == "completed" for r in run_ids)

    wait_until(all_done, timeout_s=DONE_WITHIN_S, interval_s=0.1, what="every run to complete within a lease")

    # Every run completed with exactly one round per boundary, its own answer.
    for i, run_id in enumerate(run_ids):
        run = run_row(ctx.engine, run_id)
        assert (run["status"], run["output"], run["boundary_seq"]) == ("completed", f"counted-{i}", ROUNDS)
        assert [r["boundary_seq"] for r in round_rows(ctx.engine, run_id)] == list(range(ROUNDS))
    # The killed rounds were committed once, by B, under a newer claim, before the victim's
    # lease on them would have run out.
    b_claims = {(e["run_id"], e["boundary_seq"], e["claim_fence"]) for e in events(cluster, "b", "round_claimed")}
    first_commits = []
    for run_id, at_kill in killed.items():
        (redone,) = [r for r in round_rows(ctx.engine, run_id) if r["boundary_seq"] == at_kill["boundary_seq"]]
        assert redone["claim_fence"] > at_kill["claim_fence"]
        assert (str(run_id), redone["boundary_seq"], redone["claim_fence"]) in b_claims
        assert redone["created_at"] < at_kill["lease_expires_at"]
        first_commits.append(redone["created_at"])

    # Beat sent them because their holder was dead, not because a lease ran out.
    found_dead = events(cluster, "beat", "worker_found_dead", worker_id=victim)
    assert len(found_dead) == 1, found_dead
    moved = [e for e in events(cluster, "beat", "dead_worker_runs_redispatched") if victim in e["worker_ids"]]
    assert sum(e["count"] for e in moved) == len(killed), moved
    resent = {e["run_id"] for e in events(cluster, "beat", "run_redispatched", cause="dead_holder", holder=victim)}
    assert resent == {str(r) for r in killed}

    after_s = (min(first_commits) - killed_at).total_seconds()
    print(f"\nfirst commit after the kill: {after_s:.2f} s ({len(killed)} runs held by the killed worker, "
          f"lease {LEASE_S:g} s, dead after {DEFAULTS['AIDAWORK_WORKER_DEAD_AFTER_S']} s)")
    # The audit finds nothing wrong: the killed claims' calls are warnings at most.
    report = audit(ctx.engine)
    assert report.runs_checked == RUNS and report.errors == 0, report.problems

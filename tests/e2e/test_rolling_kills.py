"""A poison budget only poison can spend: under rolling SIGKILLs (a random worker killed
every half lease and replaced at once) every healthy run completes, with exactly one
committed round per boundary, while a round that kills its worker every time it runs still
fails after its bounded attempts with ROUND_ATTEMPTS_EXHAUSTED."""

from __future__ import annotations

import random
import time
from typing import Any
from uuid import UUID

import pytest

from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.storm import RollingKills
from tests.support.wait import wait_until
from worker import client
from worker.engine.round import ROUND_ATTEMPTS_EXHAUSTED
from worker.ops.settings import Settings

pytestmark = pytest.mark.slow  # a storm (40 s of rolling SIGKILLs): make test-slow, alone

MAX_ATTEMPTS = Settings.model_fields["max_round_attempts"].default
LEASE_S = 3.0
KILL_INTERVAL_S = LEASE_S / 2  # the ratio: lease 6 s, a kill every 3 s
STORM_S = 40.0
WORKERS, CONCURRENCY = 3, 4
RUNS, ROUNDS = 40, 6  # ROUNDS - 1 tool rounds, then the answer
FIRST_WAVE, PER_KILL = 20, 2
POISON_OWNER = "team-poison"
STORM_ENV = {
    "AIDAWORK_LEASE_S": str(LEASE_S),
    # Every round of the poison owner's run kills its worker once its model call returned.
    "AIDAWORK_FAILPOINTS": f"after_model_call@{POISON_OWNER}",
}


def healthy_request(i: int) -> dict[str, Any]:
    """Distinct echo args per round (identical rounds would trip the repeated-call
    breaker), and a model latency of 200-400 ms so that kills land mid-round."""

    def latency_ms(k: int) -> int:
        return 200 + (37 * i + 71 * k) % 201

    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "echo", "args": {"run": i, "round": k}}], "latency_ms": latency_ms(k)}
        for k in range(ROUNDS - 1)
    ]
    turns.append({"content": f"done-{i}", "latency_ms": latency_ms(ROUNDS - 1)})
    return scripted_request(turns, tools=["echo"])


def poison_request() -> dict[str, Any]:
    return scripted_request(
        [{"tool_calls": [{"name": "echo", "args": {"poison": True}}], "latency_ms": 200}, {"content": "never"}],
        tools=["echo"],
        owner=POISON_OWNER,
    )


def unfinished(engine: Any) -> int:
    found = rows(engine, "SELECT count(*) AS n FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')")
    return int(found[0]["n"])


def executions(engine: Any, run_ids: list[UUID]) -> dict[str, Any]:
    """What the ledger says about the rounds' executions that called the model (one call
    each here): how many never committed (their worker died, in the call or in its tools),
    on how many rounds, and how many died inside the model call. (An execution that went on
    from an earlier holder's recorded response made no call, so it has no row.)"""
    return rows(
        engine,
        "SELECT count(*) FILTER (WHERE r.run_id IS NULL) AS died, "
        "  count(DISTINCT (mc.run_id, mc.boundary_seq)) FILTER (WHERE r.run_id IS NULL) AS rounds_hit, "
        "  count(*) FILTER (WHERE mc.status = 'started') AS died_in_call, "
        "  count(*) FILTER (WHERE mc.status = 'succeeded') AS succeeded "
        "FROM model_calls AS mc LEFT JOIN rounds AS r "
        "  ON r.run_id = mc.run_id AND r.boundary_seq = mc.boundary_seq AND r.claim_fence = mc.claim_fence "
        "WHERE mc.run_id = ANY(:ids)",
        ids=run_ids,
    )[0]


def charged(cluster: Cluster, storm: RollingKills, engine: Any, run_ids: list[UUID]) -> dict[str, int]:
    """How many deaths were charged to the healthy rounds: the committing claim's attempt
    number minus one, summed (from the workers' round_claimed lines, since a committing
    execution that went on from a recorded response has no ledger row to say it)."""
    attempts = {
        (e["run_id"], e["boundary_seq"], e["claim_fence"]): e["attempt"]
        for n in (f"w{i}" for i in range(storm.started))
        for e in events(cluster, n, "round_claimed")
    }
    committed = rows(engine, "SELECT run_id, boundary_seq, claim_fence FROM rounds WHERE run_id = ANY(:ids)",
                     ids=run_ids)
    keys = [(str(r["run_id"]), r["boundary_seq"], r["claim_fence"]) for r in committed]
    assert all(k in attempts for k in keys), "a committed round's claim is in no worker's log"
    found = [attempts[k] for k in keys]
    return {"charged": sum(a - 1 for a in found), "max_attempt": max(found)}


def test_rolling_sigkills_fail_no_healthy_run_and_a_poison_round_still_fails(cluster: Cluster, ctx: Any) -> None:
    seed = time.time_ns()
    storm = RollingKills(cluster, WORKERS, CONCURRENCY, STORM_ENV, random.Random(seed))
    storm.start()
    cluster.start_beat()
    wait_ready(cluster, *storm.live)

    began = time.monotonic()
    healthy: list[UUID] = []
    poison: list[UUID] = []

    def submit_more(tick: int) -> None:
        wave = FIRST_WAVE if tick == 0 else PER_KILL
        for _ in range(min(wave, RUNS - len(healthy))):
            healthy.append(client.submit(healthy_request(len(healthy)), ctx=ctx).run_id)
        if tick == 3:  # in the thick of it
            poison.append(client.submit(poison_request(), ctx=ctx).run_id)

    submit_more(0)
    ticks = storm.rage(interval_s=KILL_INTERVAL_S, duration_s=STORM_S, on_tick=submit_more)
    storm_s = time.monotonic() - began
    wait_until(
        lambda: storm.keep_until(lambda: unfinished(ctx.engine) == 0),
        timeout_s=180,
        interval_s=0.2,
        what="every run to end after the storm",
    )
    total_s = time.monotonic() - began
    work_s = rows(ctx.engine, "SELECT extract(epoch FROM max(finished_at) - min(created_at)) AS s FROM runs")[0]["s"]
    assert len(healthy) == RUNS and len(poison) == 1

    # Every healthy run completed with its own answer, one committed round per boundary.
    runs = {r["id"]: r for r in rows(ctx.engine, "SELECT * FROM runs WHERE id = ANY(:ids)", ids=healthy)}
    failed = [(r["id"], r["error_code"], r["error_message"]) for r in runs.values() if r["status"] != "completed"]
    assert failed == [], f"seed {seed}: healthy runs did not complete: {failed}"
    for i, run_id in enumerate(healthy):
        assert runs[run_id]["output"] == f"done-{i}"
        assert runs[run_id]["boundary_seq"] == ROUNDS
    committed = rows(
        ctx.engine,
        "SELECT run_id, array_agg(boundary_seq ORDER BY boundary_seq) AS seqs, count(DISTINCT claim_fence) AS fences "
        "FROM rounds WHERE run_id = ANY(:ids) GROUP BY run_id",
        ids=healthy,
    )
    assert len(committed) == RUNS
    assert all(c["seqs"] == list(range(ROUNDS)) and c["fences"] == ROUNDS for c in committed)

    # The kills really hit rounds in flight, and most of those deaths cost their round nothing.
    ledger = {**executions(ctx.engine, healthy), **charged(cluster, storm, ctx.engine, healthy)}
    assert storm.kills + storm.preempted == ticks
    assert ledger["died"] >= 3 and ledger["rounds_hit"] >= 3, f"the storm hit too few rounds in flight: {ledger}"
    assert ledger["charged"] < ledger["died"], f"every death was charged to its round: {ledger}"

    # The poison round still fails with the clear code, once the deaths it caused while no
    # other worker died spent its budget (during the storm they are excused, as anyone's);
    # the claims before the one that failed the run are its executions. Its model was
    # called until one call returned; every later holder went on from that response.
    (bad,) = rows(ctx.engine, "SELECT * FROM runs WHERE id = :id", id=poison[0])
    assert (bad["status"], bad["error_code"], bad["boundary_seq"]) == ("failed", ROUND_ATTEMPTS_EXHAUSTED, 0), bad
    claimed = [e for i in range(storm.started) for e in events(cluster, f"w{i}", "round_claimed", run_id=poison[0])]
    poison_runs = len(claimed) - 1
    assert poison_runs >= MAX_ATTEMPTS, bad
    assert "started executing" in bad["error_message"], bad  # its budget, not the backstop
    poison_calls = executions(ctx.engine, poison)
    assert poison_calls["succeeded"] >= 1, poison_calls
    reused = [e for i in range(storm.started) for e in events(cluster, f"w{i}", "model_response_reused",
                                                                run_id=poison[0])]
    assert reused, "no holder of the poison round went on from its recorded response"
    assert "AIDAWORK_MAX_ROUND_ATTEMPTS" in bad["error_message"]
    assert rows(ctx.engine, "SELECT count(*) AS n FROM rounds WHERE run_id = :id", id=poison[0])[0]["n"] == 0
    assert storm.self_exits >= 1

    print(
        f"\nrolling kills (seed {seed}): {RUNS} healthy runs x {ROUNDS} rounds + 1 poison round; "
        f"{storm.kills} SIGKILLs every {KILL_INTERVAL_S}s for {storm_s:.1f}s (lease {LEASE_S}s), "
        f"{storm.self_exits} poison exits, {storm.started} workers started; healthy executions that died: "
        f"{ledger['died']} on {ledger['rounds_hit']} rounds ({ledger['died_in_call']} in the model call), "
        f"{ledger['charged']} charged, highest attempt {ledger['max_attempt']}; poison: {poison_runs} "
        f"executions, {poison_calls['succeeded']} paid calls, {len(reused)} from the recorded response, "
        f"{bad['error_message']!r}; all ended {work_s:.1f}s after the first submit, waited {total_s:.1f}s"
    )

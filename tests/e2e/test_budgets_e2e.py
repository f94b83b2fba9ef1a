"""Spend budgets with real worker processes: ``fail`` stops a run before the call its
owner's budget cannot take (no ledger row for that round); ``wait`` parks the run, shown
in ``aidawork status --json``, and raising the budget puts it back on its way; 8
concurrent runs of one owner never overspend by more than one call's estimate, beat
waking parked runs as their owner's calls settle."""

from __future__ import annotations

import json

from sqlalchemy import Engine

from runtime.budget import OWNER_BUDGET_EXCEEDED
from schema.store.budgets import set_owner_budget
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_suspended, wait_terminal
from tests.support.env import WAIT_S
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

OWNER = "team-budget"
# A long input makes each call's estimate (about 1330 tokens here: the input by the
# 4-characters rule plus the scripted model's 256 output tokens) mostly real usage
# (about 1010), so the budget binds after a call or two.
LONG_INPUT = "x" * 4000
ADD_THEN_ANSWER = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]
# Takes round 0 (estimate ~1330), not round 1 (~1015 used + ~1370 estimated).
ONE_ROUND_BUDGET = 1600


def request(turns: list[dict[str, object]]) -> dict[str, object]:
    return scripted_request(turns, tools=["add"], owner=OWNER, text_input=LONG_INPUT)


def spend(engine: Engine) -> tuple[int, int]:
    found = rows(engine, "SELECT coalesce(sum(used), 0) AS u, coalesce(sum(reserved), 0) AS r FROM owner_spend "
                         "WHERE owner = :o", o=OWNER)[0]
    return int(found["u"]), int(found["r"])


def test_fail_stops_the_run_before_the_call_the_budget_cannot_take(cluster: Cluster, ctx) -> None:
    set_owner_budget(ctx.engine, OWNER, ONE_ROUND_BUDGET, "1h", "fail")
    cluster.start_worker("w1", concurrency=2)
    wait_ready(cluster, "w1")
    run_id = client.submit(request(ADD_THEN_ANSWER), ctx=ctx).run_id

    row = wait_terminal(ctx.engine, run_id)
    assert (row["status"], row["error_code"], row["boundary_seq"]) == ("failed", OWNER_BUDGET_EXCEEDED, 2)
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1}  # no call on the ledger for round 1
    used, reserved = spend(ctx.engine)
    assert reserved == 0 and used <= ONE_ROUND_BUDGET


def test_wait_parks_the_run_and_raising_the_budget_lets_it_complete(cluster: Cluster, ctx) -> None:
    set_owner_budget(ctx.engine, OWNER, ONE_ROUND_BUDGET, "1h", "wait")
    cluster.start_worker("w1", concurrency=2)
    wait_ready(cluster, "w1")
    run_id = client.submit(request(ADD_THEN_ANSWER), ctx=ctx).run_id

    row = wait_suspended(ctx.engine, run_id, boundary_seq=1)
    assert row["lease_expires_at"] is None
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1}
    shown = cli(cluster.db_url, "status", str(run_id), "--json")
    assert shown.returncode == 0, shown.stderr
    (wait,) = json.loads(shown.stdout)["waiting_for"]
    assert (wait["kind"], wait["token_budget"], wait["budget_window"], wait["tool_call_id"]) == (
        "budget", ONE_ROUND_BUDGET, "1h", None,
    )
    assert wait["window_ends_at"] is not None and wait["estimate_tokens"] + wait["used_tokens"] > ONE_ROUND_BUDGET

    # What `aidawork owner set OWNER --token-budget 100000` does: it raises the budget, wakes
    # the parked run and sends its round.
    assert client.set_owner_limits(OWNER, token_budget=100_000, ctx=ctx).token_budget == 100_000

    row = wait_terminal(ctx.engine, run_id)
    assert (row["status"], row["output"]) == ("completed", "5")
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    assert spend(ctx.engine)[1] == 0


def test_eight_concurrent_runs_of_one_owner_overspend_by_at_most_one_estimate(cluster: Cluster, ctx) -> None:
    """With ``wait``, the runs the budget cannot take park and beat wakes them as calls
    settle, until the window's budget cannot take one more call: 4 runs of about 1010
    tokens each fit in 5000; the other 4 stay parked, and the spend stays within it."""
    budget = 5000  # about 3 calls' estimates, 4 calls' real usage
    set_owner_budget(ctx.engine, OWNER, budget, "1h", "wait")
    cluster.start_worker("w1", concurrency=8)
    cluster.start_beat()
    wait_ready(cluster, "w1")
    # Each call takes 300 ms, so the 8 runs' calls overlap and their reservations race.
    run_ids = [client.submit(request([{"content": "done", "latency_ms": 300}]), ctx=ctx).run_id for _ in range(8)]

    def settled() -> dict[str, int] | None:
        found = rows(ctx.engine, "SELECT status, count(*) AS n FROM runs GROUP BY status")
        counts = {r["status"]: int(r["n"]) for r in found}
        return counts if counts == {"completed": 4, "suspended": 4} and spend(ctx.engine)[1] == 0 else None

    wait_until(settled, timeout_s=WAIT_S, what="4 runs completed within the budget and 4 parked")
    calls = rows(ctx.engine, "SELECT reserved_tokens, input_tokens + output_tokens AS used FROM model_calls")
    assert len(calls) == 4  # a parked run's refused call was never made
    estimate = max(c["reserved_tokens"] for c in calls)
    used, _ = spend(ctx.engine)
    assert used == sum(c["used"] for c in calls)
    assert used <= budget + estimate, f"overspent by {used - budget} (one estimate: {estimate})"
    assert used + estimate > budget  # the parked runs are parked for a reason
    parked = rows(ctx.engine, "SELECT id FROM runs WHERE status = 'suspended' AND budget_wait IS NOT NULL")
    assert {r["id"] for r in parked} <= set(run_ids) and len(parked) == 4

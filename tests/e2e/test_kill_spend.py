"""What a storm of SIGKILLs costs in model calls: only the calls that were on the wire when
each kill landed. A round whose worker died after its model call returned (in its tools,
or committing) is redone from the response on the ledger, so it costs no second call.

Rounds here spend about as long in their tool as in their model call, so kills land on both."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from tests.support.cluster import Cluster, wait_ready
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.storm import RollingKills
from tests.support.wait import wait_until
from worker import client

pytestmark = pytest.mark.slow  # a storm (rolling SIGKILLs over 36 runs): make test-slow, alone

LEASE_S = 3.0
WORKERS, CONCURRENCY = 3, 4
RUNS, ROUNDS = 36, 5
KILLS, KILL_INTERVAL_S = 6, LEASE_S / 2  # on average: each wait is drawn from +-40% of it
# A statement the victim had sent before it died still completes in PostgreSQL; what it
# held is read once those have landed, and long before its lease runs out.
SETTLE_S = 0.3

# The rounds a worker held when it was killed, by where each one was: its model call on
# the wire (its ledger row still 'started'), or past it (the response recorded).
HELD_SQL = """
SELECT count(*) FILTER (WHERE mc.status = 'started') AS in_call,
       count(*) FILTER (WHERE mc.status = 'succeeded') AS past_call
FROM runs AS r
JOIN model_calls AS mc ON mc.run_id = r.id AND mc.claim_fence = r.claim_fence AND mc.boundary_seq = r.boundary_seq
JOIN workers AS w ON w.id = r.round_holders[cardinality(r.round_holders)]
WHERE r.status = 'running' AND w.name LIKE :name
"""


def request(i: int) -> dict[str, Any]:
    """Model calls of 200-400 ms and tools of 200-400 ms, different in every round of every
    run (so the runs do not move in step, and no two rounds are identical for the breaker)."""

    def latency_ms(k: int) -> int:
        return 200 + (37 * i + 71 * k) % 201

    def tool_s(k: int) -> float:
        return 0.2 + ((53 * i + 29 * k) % 201) / 1000 + i / 10**6

    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "sleep", "args": {"seconds": tool_s(k)}}], "latency_ms": latency_ms(k)}
        for k in range(ROUNDS - 1)
    ]
    turns.append({"content": f"done-{i}", "latency_ms": latency_ms(ROUNDS - 1)})
    return scripted_request(turns, tools=["sleep"])


def test_sigkills_cost_only_the_model_calls_on_the_wire_when_they_landed(cluster: Cluster, ctx: Any) -> None:
    seed = time.time_ns()
    rng = random.Random(seed)
    storm = RollingKills(cluster, WORKERS, CONCURRENCY, {"AIDAWORK_LEASE_S": str(LEASE_S)}, rng)
    storm.start()
    cluster.start_beat()
    wait_ready(cluster, *storm.live)
    run_ids = [client.submit(request(i), ctx=ctx).run_id for i in range(RUNS)]

    held = {"in_call": 0, "past_call": 0}
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.6, 1.4) * KILL_INTERVAL_S - SETTLE_S)
        victim = storm.kill_one()
        time.sleep(SETTLE_S)
        found = rows(ctx.engine, HELD_SQL, name=f"aidawork-{cluster.procs[victim].pid}@%")[0]
        held = {k: held[k] + found[k] for k in held}
    wait_until(
        lambda: storm.keep_until(
            lambda: rows(ctx.engine, "SELECT count(*) AS n FROM runs WHERE finished_at IS NULL")[0]["n"] == 0
        ),
        timeout_s=120,
        interval_s=0.2,
        what="every run to end after the kills",
    )

    ended = rows(ctx.engine, "SELECT status, count(*) AS n FROM runs GROUP BY status")
    assert ended == [{"status": "completed", "n": RUNS}], f"seed {seed}: {ended}"
    committed = rows(ctx.engine, "SELECT count(*) AS n FROM rounds")[0]["n"]
    assert committed == RUNS * ROUNDS
    ledger = rows(
        ctx.engine,
        "SELECT count(*) AS calls, count(*) FILTER (WHERE status = 'started') AS started, "
        "  count(*) FILTER (WHERE stale) AS stale FROM model_calls WHERE run_id = ANY(:ids)",
        ids=run_ids,
    )[0]
    extra = ledger["calls"] - committed
    summary = f"seed {seed}: {storm.kills} kills caught {held}; ledger {ledger}, {extra} extra calls"
    print("\n" + summary)
    # The kills did catch rounds past their model call: on main each of those cost a call.
    assert storm.kills == KILLS and held["past_call"] >= 1, summary
    # Each extra call was on the wire when its worker was killed, or was paid for by a live
    # holder that had lost its claim (stale).
    assert extra <= held["in_call"] + ledger["stale"], summary

from __future__ import annotations

import time

from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

RUNS = 16
LATENCY_MS = 1000
BUDGET_S = 8.0  # sequentially this is 16 s; in parallel about 1 s plus overhead


def test_one_worker_process_runs_many_rounds_at_once(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1", concurrency=RUNS)
    wait_ready(cluster, "w1")

    started = time.monotonic()
    submitted = [
        client.submit(scripted_request([{"content": f"answer {i}", "latency_ms": LATENCY_MS}]), ctx=ctx)
        for i in range(RUNS)
    ]
    ids = [s.run_id for s in submitted]

    def all_ended() -> bool:
        n = rows(
            ctx.engine,
            "SELECT count(*) AS n FROM runs WHERE id = ANY(:ids) AND status IN ('completed', 'failed', 'cancelled')",
            ids=ids,
        )[0]["n"]
        return n == RUNS

    wait_until(all_ended, timeout_s=60, interval_s=0.05, what="all runs to end")
    elapsed = time.monotonic() - started

    done = rows(
        ctx.engine, "SELECT id, status, output, started_at, finished_at FROM runs WHERE id = ANY(:ids)", ids=ids
    )
    assert sorted((r["status"], r["output"]) for r in done) == sorted(("completed", f"answer {i}") for i in range(RUNS))
    assert elapsed < BUDGET_S, f"{RUNS} runs of {LATENCY_MS} ms took {elapsed:.1f}s in one process"
    # The rounds overlapped in time: most started before the first one finished.
    first_finish = min(r["finished_at"] for r in done)
    overlapping = sum(1 for r in done if r["started_at"] < first_finish)
    assert overlapping >= RUNS // 2, f"only {overlapping} rounds were in flight together"
    # All in the one process.
    assert len(events(cluster, "w1", "round_committed")) == RUNS

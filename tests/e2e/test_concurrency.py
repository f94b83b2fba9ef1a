"""One worker process runs many rounds at once. How long they take is a figure of
``make bench`` (bench/rounds.py, "16 runs of one 1 s round"); here the claim is that the
rounds overlapped, read from the model-call intervals the ledger recorded."""

from __future__ import annotations

from datetime import datetime

from tests.support.cluster import Cluster, wait_events, wait_ready
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

RUNS = 16
LATENCY_MS = 1000


def max_in_flight(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an interval ending as another starts does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals], key=lambda e: e)
    open_now = peak = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak


def test_max_in_flight_counts_overlapping_intervals_only() -> None:
    t = [datetime(2026, 1, 1, 0, 0, s) for s in range(6)]
    assert max_in_flight([(t[0], t[2]), (t[1], t[3]), (t[2], t[4])]) == 2
    assert max_in_flight([(t[0], t[1]), (t[1], t[2]), (t[2], t[3])]) == 1
    assert max_in_flight([(t[0], t[5])] * 4) == 4


def test_one_worker_process_runs_many_rounds_at_once(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1", concurrency=RUNS)
    wait_ready(cluster, "w1")

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

    done = rows(
        ctx.engine, "SELECT id, status, output, started_at, finished_at FROM runs WHERE id = ANY(:ids)", ids=ids
    )
    assert sorted((r["status"], r["output"]) for r in done) == sorted(("completed", f"answer {i}") for i in range(RUNS))
    # The model calls (1 s each) were in flight together, as the ledger recorded them.
    calls = rows(ctx.engine, "SELECT started_at, finished_at FROM model_calls WHERE run_id = ANY(:ids)", ids=ids)
    assert len(calls) == RUNS
    in_flight = max_in_flight([(c["started_at"], c["finished_at"]) for c in calls])
    assert in_flight >= RUNS // 2, f"at most {in_flight} of {RUNS} model calls were in flight together"
    # The rounds overlapped in time: most started before the first one finished.
    first_finish = min(r["finished_at"] for r in done)
    overlapping = sum(1 for r in done if r["started_at"] < first_finish)
    assert overlapping >= RUNS // 2, f"only {overlapping} rounds were in flight together"
    # All in the one process.
    assert len(wait_events(cluster, "w1", "round_committed", count=RUNS)) == RUNS

"""Fair share, measured (make bench): owner A's 500 queued runs in front, then owner B's
10, on one ``aidawork worker --concurrency 8`` with 50 ms model turns. Printed: how long
B's 10 runs take from the moment the worker starts on the queue until B's last one ends,
alone on the fleet, behind A's backlog with weights 1:1 and 1:3, and behind it with one
round queue (``AIDAWORK_ROUND_QUEUES=1``: FIFO, as before fair share). The issue's
target: B within 2x of alone. Every scenario submits first and starts the worker after,
so the backlog is really in front; each is timed from its first claim (the worker's start
is not counted). Prints figures; never fails on timing."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.env  # sets the environment before any project module reads it
from bench import db
from bench.procs import aidawork_worker, stop

BACKLOG_RUNS, FEW_RUNS = 500, 10
CONCURRENCY, LATENCY_MS = 8, 50
TARGET_RATIO = 2.0


@dataclass
class Scenario:
    label: str
    weights: tuple[int, int] | None  # A's and B's; None: B alone
    queues: int = 16


@dataclass
class Result:
    scenario: Scenario
    b_s: float  # first claim of the scenario -> B's last end
    all_s: float  # first claim -> the last end of any run
    stuck: int


def owners(queues: int, weights: tuple[int, int]) -> tuple[str, str]:
    """Two owner names whose queues do not overlap at these weights (a collision would
    make them share a queue FIFO, which is not what is measured)."""
    from runtime.shares import owner_queues

    for i in range(100):
        a, b = f"bench-a{i}", f"bench-b{i}"
        if queues == 1 or set(owner_queues(a, weights[0], queues)).isdisjoint(owner_queues(b, weights[1], queues)):
            return a, b
    raise RuntimeError("no two owner names without a shared queue")


def set_weights(weights: dict[str, int]) -> None:
    from sqlalchemy import text

    with db.engine().begin() as conn:
        for owner, weight in weights.items():
            conn.execute(
                text(
                    "INSERT INTO owners (owner, weight) VALUES (:o, :w) "
                    "ON CONFLICT (owner) DO UPDATE SET weight = :w"
                ),
                {"o": owner, "w": weight},
            )


def client_context(queues: int) -> Any:
    from worker.client.context import build_client_context
    from worker.ops.settings import get_settings

    return build_client_context(get_settings().model_copy(update={"round_queues": queues}), threads=2)


def run(scenario: Scenario) -> Result:
    from sqlalchemy import text

    from worker import client

    a, b = owners(scenario.queues, scenario.weights or (1, 1))
    set_weights({a: (scenario.weights or (1, 1))[0], b: (scenario.weights or (1, 1))[1]})
    ctx = client_context(scenario.queues)
    try:
        def submit(owner: str) -> UUID:
            return client.submit(db.scripted(1, latency_ms=LATENCY_MS, owner=owner), ctx=ctx).run_id

        backlog = [submit(a) for _ in range(BACKLOG_RUNS)] if scenario.weights else []
        few = [submit(b) for _ in range(FEW_RUNS)]
    finally:
        ctx.engine.dispose()
    worker = aidawork_worker(CONCURRENCY, env={"AIDAWORK_ROUND_QUEUES": str(scenario.queues)})
    try:
        stuck = db.wait_finished([*few, *backlog], stall_s=30)
    finally:
        stop(worker)
    ids: list[UUID] = [*few, *backlog]
    with db.engine().connect() as conn:
        row = conn.execute(
            text(
                "SELECT extract(epoch FROM max(finished_at) FILTER (WHERE owner = :b) - min(started_at)) AS b_s, "
                "  extract(epoch FROM max(finished_at) - min(started_at)) AS all_s FROM runs WHERE id = ANY(:ids)"
            ),
            {"b": b, "ids": ids},
        ).one()
    return Result(scenario, float(row.b_s or 0), float(row.all_s or 0), len(stuck))


SCENARIOS = (
    Scenario("B alone", None),
    Scenario("behind A's backlog, weights 1:1", (1, 1)),
    Scenario("behind A's backlog, weights 1:3 (B 3)", (1, 3)),
    Scenario("behind A's backlog, one queue (FIFO, before fair share)", (1, 1), queues=1),
)


def measure() -> list[Result]:
    db.submit(db.scripted(1))  # the client side's imports and pools, before any timing
    return [run(s) for s in SCENARIOS]


def report(results: list[Result]) -> list[str]:
    alone = results[0].b_s
    lines = [
        f"Fair share: owner B's {FEW_RUNS} runs, alone and behind owner A's {BACKLOG_RUNS} queued runs "
        f"(1 round each, latency_ms {LATENCY_MS}, one worker --concurrency {CONCURRENCY}); "
        f"from the first claim to B's last end (target: within {TARGET_RATIO:.0f}x of alone)"
    ]
    for r in results:
        ratio = f"{r.b_s / alone:5.2f}x of alone" if alone else "n/a"
        tail = "" if r.scenario.weights is None else f"; all {FEW_RUNS + BACKLOG_RUNS} runs {r.all_s:.2f} s"
        stuck = f"; NOTE: {r.stuck} runs did not end" if r.stuck else ""
        lines.append(f"  {r.scenario.label:<56} B {r.b_s:6.2f} s ({ratio}){tail}{stuck}")
    return lines


def main() -> None:
    db.reset()
    try:
        print("\n".join(report(measure())))
    finally:
        import redis

        redis.Redis.from_url(bench.env.BROKER_URL).flushdb()


if __name__ == "__main__":
    main()

"""make bench: what a round costs, next to two Celery task hops measured in the same run
(the machine is shared and noisy, so only figures from one run are compared):

1. a plain Celery hop and a hop with our delivery settings (bench/hop_app.py);
2. per-round wall time of a 500-round scripted run (zero latency) at its start and end;
3. the worker's CPU per round over that run;
4. in-flight throughput of one worker with 512 threads and 1 s model turns (bench/inflight.py;
   runs submitted while it runs, and every run queued first), and with a streamed answer,
   without and with a watcher attached (bench/streaming.py);
5. bytes stored per round, events included, for a small and a 100 kB tool output;
6. a 16 x 20 throughput figure and where a round's time goes, in process;
7. 16 runs of one 1 s round on one `--concurrency 16` worker: the wall time of rounds that
   overlap (tests/e2e/test_concurrency.py asserts that they do, not how fast);
8. fair share: owner B's 10 runs alone and behind owner A's 500 queued runs (bench/fairness.py);
9. what a round costs across the whole stack (worker, PostgreSQL and Redis CPU, commits, WAL
   flushes and bytes, rows, Redis commands), beside issue 33's targets (bench/stack.py).

Prints figures; never fails on timing.
"""

from __future__ import annotations

import itertools
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.env  # sets the environment before any project module reads it
from bench import db, fairness, inflight, stack, streaming
from bench.procs import HopWorkers, aidawork_worker, cpu_ms, stop

LONG_ROUNDS = 500
ROUND_WORKER_CONCURRENCY = 8
BIG_OUTPUT_CHARS = 100_000
GOAL_RATIO = 1.5
# A round's synchronous writes: the claim with its context delta, the ledger before and
# after the model call, the commit (README, "Development": why each one is synchronous).
SYNC_WRITES = {"claim+load": 1, "model-call ledger": 2, "commit": 1}
# Chains of 400 hops per kind, alternating, before and after the round figures.
HOP_CHAINS_BEFORE, HOP_CHAINS_AFTER = 4, 2


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def gaps_ms(run_id: UUID) -> list[float]:
    stamps = db.round_stamps(run_id)
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(stamps)]


def per_round_ms(run_id: UUID, rounds: int, since: str = "started_at") -> float:
    """(finished_at - since) / rounds, from the run's row: since ``started_at`` (its first
    claim) or ``created_at`` (its submit)."""
    row = db.run_row(run_id)
    return float((row.finished_at - getattr(row, since)).total_seconds() * 1000 / rounds)


def round_worker() -> tuple[subprocess.Popen[bytes], list[UUID]]:
    """The worker the round figures run on (`aidawork worker --concurrency 8`), warmed by a
    5-round run (imports, connection pools, prepared statements); and that run if it did
    not end. bench/peers.py measures on the same worker."""
    worker = aidawork_worker(ROUND_WORKER_CONCURRENCY)
    try:
        return worker, db.wait_finished([db.submit(db.scripted(5))], stall_s=120)
    except BaseException:
        stop(worker)
        raise


def run_rounds(figures: dict[str, Any]) -> None:
    """Phases 2, 3 and 5 (and the 16 x 20 throughput) on one `aidawork worker`."""
    worker, _ = round_worker()
    try:
        ten = db.submit(db.scripted(10))
        stuck = db.wait_finished([ten])
        figures["per_round_10"] = per_round_ms(ten, 10)

        request = db.scripted(LONG_ROUNDS)
        before = cpu_ms(worker.pid)
        long_id = db.submit(request)
        stuck += db.wait_finished([long_id], poll_s=0.02)
        figures["cpu_ms"] = cpu_ms(worker.pid) - before
        figures["long_id"] = long_id

        blob = secrets.token_urlsafe(BIG_OUTPUT_CHARS)[:BIG_OUTPUT_CHARS]  # random: pglz cannot shrink it
        big = db.scripted(4, big={1: blob})
        # Round 3: a 100 kB output from small args (text_blob: one repeated character).
        big["config"]["model"]["turns"][2] = {
            "tool_calls": [{"name": "text_blob", "args": {"size_bytes": BIG_OUTPUT_CHARS}}]
        }
        big["config"]["tools"].append("text_blob")
        big_id = db.submit(big)
        stuck += db.wait_finished([big_id])
        figures["big_id"] = big_id

        start = time.monotonic()
        ids = [db.submit(db.scripted(20)) for _ in range(16)]
        stuck += db.wait_finished(ids)
        figures["rps_16x20"] = 16 * 20 / (time.monotonic() - start)
        figures["not_completed"] = [db.describe_stuck(i) for i in stuck] + [
            f"run {i} ended {row.status} ({row.error_code})"
            for i in [ten, long_id, big_id, *ids]
            if (row := db.run_row(i)).status not in ("completed", "running")
        ]
    finally:
        stop(worker)


PARALLEL_RUNS, PARALLEL_LATENCY_MS = 16, 1000


def run_parallel_slow_rounds(figures: dict[str, Any]) -> None:
    """Phase 7: submit to all ended, sequentially this would be 16 s."""
    worker = aidawork_worker(PARALLEL_RUNS)
    try:
        stuck = db.wait_finished([db.submit(db.scripted(1))], stall_s=120)  # warm
        start = time.monotonic()
        ids = [db.submit(db.scripted(1, latency_ms=PARALLEL_LATENCY_MS)) for _ in range(PARALLEL_RUNS)]
        stuck += db.wait_finished(ids)
        figures["parallel_wall_s"] = time.monotonic() - start
        figures["not_completed"] += [db.describe_stuck(i) for i in stuck]
    finally:
        stop(worker)


def step_breakdown(rounds: int = 300) -> dict[str, float]:
    """Where one round's time goes, measured in this process (no Celery receive/ack):
    each store call and the pure loop, in ms per round. Steps whose function this code
    does not have are left out."""
    from schema.store import claims as claim_store
    from schema.store import rounds as round_store
    from schema.wire import RoundTask
    from worker.engine import round as round_shell
    from worker.engine.bootstrap import get_context
    from worker.ops.celery_app import Dispatcher

    spent: dict[str, float] = {}

    def timed(module: Any, name: str, label: str) -> None:
        original = getattr(module, name, None)
        if original is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        setattr(module, name, wrapper)

    timed(claim_store, "claim_round", "claim + context delta (1 statement)")
    timed(round_store, "record_model_call_started", "ledger before the call (1 statement)")
    timed(round_store, "record_model_call_finished", "ledger after the call (1 statement)")
    timed(round_store, "commit_round", "commit (1 statement)")
    timed(Dispatcher, "round", "publish next round")
    ctx = get_context()
    run_id = db.submit(db.scripted(rounds + 10))
    for boundary in range(5):  # warm: pools, prepared statements, the context cache
        round_shell.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
    spent.clear()
    start = time.perf_counter()
    for boundary in range(5, rounds):
        round_shell.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
    total = time.perf_counter() - start
    n = rounds - 5
    result = {label: seconds * 1000 / n for label, seconds in spent.items()}
    result["everything else (loop, digests, proofs, logging)"] = (total - sum(spent.values())) * 1000 / n
    result["total in process"] = total * 1000 / n
    return result


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report_hops(hops: HopWorkers) -> list[str]:
    n = hops.describe("plain")["n"]
    lines = [
        f"Celery task hops (threads pool, concurrency 1, acks_late, prefetch 1; median of {n} chains of 400 hops,",
        f"  alternating, {HOP_CHAINS_BEFORE} before and {HOP_CHAINS_AFTER} after the round figures, min-max; and the "
        "hop worker's CPU per hop)",
    ]
    labels = {
        "plain": "plain: no task events, no sent events",
        "aidawork": "our delivery settings: create_app(), --task-events",
    }
    for kind, label in labels.items():
        d = hops.describe(kind)
        lines.append(
            f"  {label:<52} {d['median']:6.2f} ms per hop ({d['min']:.2f}-{d['max']:.2f}); "
            f"CPU {d['cpu']:.2f} ms per hop"
        )
    return lines


def report_rounds(figures: dict[str, Any], plain_ms: float, ours_ms: float) -> list[str]:
    gaps = gaps_ms(figures["long_id"])
    rows = [
        ("rounds 1-10 of the 500-round run", gaps[:10]),
        ("rounds 491-500 of the 500-round run", gaps[-10:]),
        ("all 500 rounds (submit -> last commit)", gaps),
    ]
    lines = [
        f"Per-round wall time, scripted model at zero latency, `aidawork worker --concurrency "
        f"{ROUND_WORKER_CONCURRENCY}`",
        "  (gaps between rounds.created_at, i.e. commit to commit; round 1 from runs.created_at, the submit)",
        f"  {'':<44} {'mean ms':>8} {'median':>8} {'x plain hop':>12} {'x our hop':>10}",
    ]
    for label, values in rows:
        mean = _mean(values)
        lines.append(
            f"  {label:<44} {mean:8.2f} {statistics.median(values):8.2f} "
            f"{mean / plain_ms:11.2f}x {mean / ours_ms:9.2f}x"
        )
    ten = figures["per_round_10"]
    lines.append(
        f"  {'10-round run, (finished - started) / 10':<44} {ten:8.2f} {'':>8} "
        f"{ten / plain_ms:11.2f}x {ten / ours_ms:9.2f}x"
    )
    goal_ms = GOAL_RATIO * plain_ms
    verdicts = ", ".join(
        f"{label.split(' of')[0]} {'met' if _mean(v) <= goal_ms else 'not met'} ({_mean(v) / plain_ms:.2f}x)"
        for label, v in rows[:2]
    )
    lines.append(f"  goal: a round <= {GOAL_RATIO}x the plain hop = {goal_ms:.2f} ms; {verdicts}")
    floor = figures["statement_floor"]
    writes = sum(SYNC_WRITES.values())
    floor_ms = ours_ms + writes * floor["write"]
    lines += [
        f"  floor of this design, with no work of its own: our hop + {writes} writes that each wait for the WAL flush",
        f"    (one-row UPDATE in autocommit {floor['write']:.2f} ms; SELECT 1 {floor['read']:.2f} ms) "
        f"= {floor_ms:.2f} ms = {floor_ms / plain_ms:.2f}x the plain hop;",
        f"    the goal leaves {goal_ms - floor_ms:.2f} ms per round for the round's own work (its statements' "
        f"execution, the loop), which took {_mean(gaps) - floor_ms:.2f} ms over the 500 rounds",
    ]
    cpu = figures["cpu_ms"]
    lines += [
        "",
        f"Worker CPU per round over the {LONG_ROUNDS}-round run (utime+stime of the worker process and its children,",
        "  /proc/<pid>/stat, read right before submitting and right after the run ended; start-up excluded)",
        f"  {'CPU per round':<44} {cpu / LONG_ROUNDS:8.2f} ms   ({cpu / 1000:.2f} s over {LONG_ROUNDS} rounds; "
        f"{cpu / sum(gaps):.0%} of the wall time)",
    ]
    plain_cpu, ours_cpu = figures["hop_cpu"]["plain"], figures["hop_cpu"]["aidawork"]
    lines.append(
        f"  {'CPU per hop, plain / our delivery settings':<44} {plain_cpu:8.2f} / {ours_cpu:.2f} ms "
        f"(so a round's own work beyond our hop: {cpu / LONG_ROUNDS - ours_cpu:.2f} ms)"
    )
    return lines


def report_bytes(figures: dict[str, Any]) -> list[str]:
    long_id, big_id = figures["long_id"], figures["big_id"]
    cases = [
        ("small output, round 5 of the 500-round run", db.bytes_at(long_id, 5)),
        ("small output, round 495 of the 500-round run", db.bytes_at(long_id, 495)),
        ("echo of a 100 kB random string (args = output)", db.bytes_at(big_id, 1)),
        ("text_blob, 100 kB output of 'x' (compressible)", db.bytes_at(big_id, 2)),
    ]
    header = "".join(f"{t:>17}" for t in db.BYTE_TABLES)
    lines = [
        "Bytes stored per round (pg_column_size of the round's rows, TOAST as stored; bytes/rows per table;",
        "  indexes and page overhead not counted; events are those of the round's commit)",
        f"  {'':<46}{header}{'total':>10}",
    ]
    for label, sizes in cases:
        cells = "".join(f"{f'{b}/{n}':>17}" for b, n in sizes.values())
        lines.append(f"  {label:<46}{cells}{sum(b for b, _ in sizes.values()):>10}")
    lines.append(
        f"  (the 100 kB run's runs.config, which holds the script and so the 100 kB arg once: "
        f"{db.config_bytes(big_id)} bytes)"
    )
    return lines


def main() -> None:
    started = time.monotonic()
    log("resetting the bench database and broker")
    db.reset()
    figures: dict[str, Any] = {}
    hops = HopWorkers()
    try:
        log("starting the hop workers; measuring hops")
        hops.start()
        for _ in range(HOP_CHAINS_BEFORE):
            hops.measure()
        figures["statement_floor"] = db.statement_floor_ms()
        log("round figures: 10-, 500-, 3-round (100 kB) runs, 16 x 20")
        run_rounds(figures)
        log(f"{PARALLEL_RUNS} runs of one {PARALLEL_LATENCY_MS} ms round at once")
        run_parallel_slow_rounds(figures)
        log("measuring hops again")
        for _ in range(HOP_CHAINS_AFTER):
            hops.measure()
    finally:
        hops.stop()
    log("in-flight throughput: 512 runs x 3 rounds, 1 s model turns")
    flight = inflight.measure()
    log("in-flight throughput again, every run queued first")
    queued = inflight.measure(queued_first=True)
    log("whole-stack cost per round")
    stack_costs = stack.measure_all()
    log("streaming: the in-flight figure with a streamed answer, without and with a watcher")
    streamed = streaming.measure()
    log("fair share: B's 10 runs alone and behind A's 500")
    fair = fairness.measure()
    log("step breakdown, in process")
    try:
        steps: dict[str, float] | str = step_breakdown()
    except Exception as exc:  # newer code may have moved what it patches; the rest still counts
        steps = f"unavailable on this code: {exc!r}"
    finally:
        import redis

        redis.Redis.from_url(bench.env.BROKER_URL).flushdb()  # what it published was never meant to run

    plain_ms, ours_ms = hops.median_ms("plain"), hops.median_ms("aidawork")
    figures["hop_cpu"] = {kind: hops.describe(kind)["cpu"] for kind in HopWorkers.KINDS}
    out = [f"AIDAWORK round benchmark (scripted model, loopback PostgreSQL and Redis, {_cores()} cores, shared)", ""]
    out += [*report_hops(hops), ""]
    out += [*report_rounds(figures, plain_ms, ours_ms), ""]
    out += [*inflight.report(flight), ""]
    out += [*inflight.report(queued), ""]
    for cost in stack_costs:
        out += [*stack.report(cost), ""]
    out += [*streaming.report(streamed), ""]
    out += [*fairness.report(fair), ""]
    out += [*report_bytes(figures), ""]
    out.append(
        f"Throughput, 16 runs x 20 rounds in parallel (zero latency, --concurrency {ROUND_WORKER_CONCURRENCY}): "
        f"{figures['rps_16x20']:.1f} rounds/s"
    )
    out.append(
        f"{PARALLEL_RUNS} runs of one {PARALLEL_LATENCY_MS} ms round, one worker --concurrency {PARALLEL_RUNS}: "
        f"{figures['parallel_wall_s']:.2f} s from the first submit to the last end "
        f"(sequentially {PARALLEL_RUNS * PARALLEL_LATENCY_MS / 1000:.0f} s)"
    )
    out.append("Database round trips per round: " + ", ".join(f"{step} {n}" for step, n in SYNC_WRITES.items()))
    out.append("Where a round's time goes (in process, no Celery receive/ack), ms per round:")
    if isinstance(steps, str):
        out.append(f"  {steps}")
    else:
        out += [f"  {label:<50} {ms:7.2f} ms" for label, ms in steps.items()]
    out += [f"NOTE: {note}; the figures of that run are not what they claim" for note in figures["not_completed"]]
    out += ["", f"(bench took {time.monotonic() - started:.0f} s)"]
    print("\n".join(out))


def _cores() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    main()

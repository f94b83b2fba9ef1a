"""make bench: per-round cost of scripted runs at round 10 and round 500 (zero model
latency), next to a bare Celery task hop, plus the bytes stored per round and a
throughput figure. Prints figures; never fails on timing."""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import redis
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
PG = os.environ.get("AIDAWORK_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
DB_URL = f"{PG}/aidawork_bench"
BROKER_URL = os.environ.get("AIDAWORK_BENCH_BROKER", "redis://127.0.0.1:6379/10")
os.environ.setdefault("AIDAWORK_SECRET_KEY", secrets.token_urlsafe(32))
os.environ.update({"AIDAWORK_DATABASE_URL": DB_URL, "AIDAWORK_BROKER_URL": BROKER_URL, "AIDAWORK_LOG_LEVEL": "WARNING"})
sys.path.insert(0, str(REPO))

from schema.migrate import upgrade_head  # noqa: E402
from worker import client  # noqa: E402

ROW_BYTES_SQL = """
SELECT
  (SELECT coalesce(sum(pg_column_size(m.*)), 0) FROM messages m WHERE m.run_id = :id AND m.boundary_seq = :b)
+ (SELECT coalesce(sum(pg_column_size(r.*)), 0) FROM rounds r WHERE r.run_id = :id AND r.boundary_seq = :b)
+ (SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM tool_invocations t WHERE t.run_id = :id AND t.boundary_seq = :b)
+ (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM model_calls c WHERE c.run_id = :id AND c.boundary_seq = :b)
"""


def reset() -> None:
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS aidawork_bench WITH (FORCE)"))
        conn.execute(text("CREATE DATABASE aidawork_bench"))
    admin.dispose()
    upgrade_head(DB_URL)
    redis.Redis.from_url(BROKER_URL).flushdb()


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, AIDAWORK_LOG_LEVEL="WARNING")
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def measure_hop(hops: int = 500) -> float:
    proc = spawn([sys.executable, "-m", "celery", "-A", "bench.hop_app", "worker", "--pool=threads",
                  "--concurrency=1", "-Q", "aidawork.bench", "--without-mingle", "--without-gossip",
                  "--loglevel=WARNING"])
    try:
        from bench.hop_app import HOP_QUEUE, hop

        r = redis.Redis.from_url(BROKER_URL)
        hop.apply_async((5, "warm"), queue=HOP_QUEUE)
        wait_for(lambda: r.get("warm"), 60)
        start = time.time()
        hop.apply_async((hops, "done"), queue=HOP_QUEUE)
        done = float(wait_for(lambda: r.get("done"), 120))
        return (done - start) / (hops + 1) * 1000
    finally:
        stop(proc)


def wait_for(fn: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError


def scripted(rounds: int) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [{"tool_calls": [{"name": "echo", "args": {"i": i}}]} for i in range(rounds - 1)]
    turns.append({"content": "done"})
    return {"owner": "bench", "input": "benchmark", "config": {
        "model": {"provider": "scripted", "turns": turns}, "tools": ["echo"], "policy": {"max_rounds": rounds}}}


def run_and_time(rounds: int) -> tuple[UUID, float, list[float]]:
    run_id = client.submit(scripted(rounds)).run_id
    client.wait(run_id, timeout_s=600, poll_s=0.05)
    engine = client.get_context().engine
    with engine.connect() as conn:
        started, finished = conn.execute(
            text("SELECT started_at, finished_at FROM runs WHERE id = :id"), {"id": run_id}).one()
        stamps = [r[0] for r in conn.execute(
            text("SELECT created_at FROM rounds WHERE run_id = :id ORDER BY boundary_seq"), {"id": run_id})]
    gaps = [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(stamps)]
    return run_id, (finished - started).total_seconds() * 1000 / rounds, gaps


def bytes_at(run_id: UUID, boundary: int) -> int:
    with client.get_context().engine.connect() as conn:
        return int(conn.execute(text(ROW_BYTES_SQL), {"id": run_id, "b": boundary}).scalar_one())


def throughput(runs: int = 16, rounds: int = 20) -> float:
    start = time.monotonic()
    ids = [client.submit(scripted(rounds)).run_id for _ in range(runs)]
    for run_id in ids:
        client.wait(run_id, timeout_s=600, poll_s=0.05)
    return runs * rounds / (time.monotonic() - start)


def step_breakdown(rounds: int = 300) -> dict[str, float]:
    """Where one round's time goes, measured in this process (no Celery receive/ack):
    each store call and the pure loop, in ms per round."""
    from schema.store import rounds as round_store
    from schema.store import runs as run_store
    from schema.wire import RoundTask
    from worker import round as round_shell

    spent: dict[str, float] = {}

    def timed(module: Any, name: str, label: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        setattr(module, name, wrapper)

    timed(run_store, "claim_round", "claim + context delta (1 statement)")
    timed(round_store, "record_model_call_started", "ledger before the call (1 statement)")
    timed(round_store, "record_model_call_finished", "ledger after the call (1 statement)")
    timed(round_store, "commit_round", "commit (1 statement)")
    timed(round_shell, "dispatch_round", "publish next round + sent event")
    ctx = client.get_context()
    run_id = client.submit(scripted(rounds + 10)).run_id
    for boundary in range(5):  # warm: pools, prepared statements, the context cache
        round_shell.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
    spent.clear()
    start = time.perf_counter()
    for boundary in range(5, rounds):
        round_shell.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
    total = time.perf_counter() - start
    n = rounds - 5
    result = {label: seconds * 1000 / n for label, seconds in spent.items()}
    result["everything else (loop, digests, proofs)"] = (total - sum(spent.values())) * 1000 / n
    result["total in process"] = total * 1000 / n
    redis.Redis.from_url(BROKER_URL).flushdb()  # the tasks it published were never meant to run
    return result


def main() -> None:
    reset()
    hop_ms = measure_hop()
    worker = spawn([sys.executable, "-m", "worker.cli", "worker", "--concurrency", "8"])
    try:
        run_and_time(5)  # warm up: imports, connection pools, prepared statements
        _, per_round_10, _ = run_and_time(10)
        long_id, per_round_500, gaps = run_and_time(500)
        rps = throughput()
    finally:
        stop(worker)
    early, late = gaps[:20], gaps[-20:]
    print("AIDAWORK round benchmark (scripted model, zero latency, one worker, threads pool)")
    print(f"  bare Celery task hop (same broker settings) : {hop_ms:7.2f} ms")
    print(f"  per round, 10-round run                      : {per_round_10:7.2f} ms")
    print(f"  per round, 500-round run                     : {per_round_500:7.2f} ms")
    print(f"    rounds 1-20 of it                          : {sum(early) / len(early):7.2f} ms")
    print(f"    rounds 480-500 of it                       : {sum(late) / len(late):7.2f} ms")
    print(f"  bytes stored by round 5 / round 495          : {bytes_at(long_id, 5)} / {bytes_at(long_id, 495)}")
    print(f"  throughput, 16 runs x 20 rounds in parallel  : {rps:7.1f} rounds/s")
    print("  database round trips per round: claim+load 1, model-call ledger 2, commit 1")
    print("where a round's time goes (in process, no Celery receive/ack), ms per round:")
    for label, ms in step_breakdown().items():
        print(f"    {label:<44} : {ms:7.2f} ms")


if __name__ == "__main__":
    main()

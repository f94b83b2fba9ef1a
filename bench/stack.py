"""What a round costs across the whole stack (issue 33's figures), over a phase in which
every run was queued first, so only rounds are counted (no submits):

- CPU from /proc: the worker process and its threads; every ``postgres`` process (the
  backends, the WAL writer, the checkpointer: the machine runs nothing else during the
  bench); Redis from its own ``INFO cpu``;
- PostgreSQL from its statistics views: commits (``pg_stat_database.xact_commit`` of the
  bench database), rows written (``tup_inserted + tup_updated``), WAL records' bytes and
  the flushes waited on (``pg_stat_wal.wal_bytes``, ``wal_sync``);
- Redis commands from ``INFO commandstats`` (the bench's own INFO calls left out).

PostgreSQL's backends report their statistics when idle (at most every 10 s) or when they
exit, so the phase starts after the idle backends had time to report, and ends after the
worker (and its connections) stopped.

``python bench/stack.py`` runs just these phases; ``make bench`` prints them with the rest.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import redis
from sqlalchemy import text

import bench.env  # noqa: F401  (sets the environment before any project module reads it)
from bench import db, wal
from bench.env import BROKER_URL, DB_NAME
from bench.procs import CLK_TCK, aidawork_worker, cpu_ms, stop

# Issue 33's targets, per round unless said otherwise.
TARGETS = {
    "stack CPU (worker + PostgreSQL + Redis)": (5.0, "ms"),
    "PostgreSQL commits": (2.5, ""),
    "WAL flushes waited on (wal_sync)": (2.0, ""),
    "WAL bytes": (3500.0, "B"),
    "rows written (inserted + updated)": (8.0, ""),
    "Redis commands": (6.0, ""),
}
THROUGHPUT_TARGET = 300.0  # rounds/s, 512 x 3 at 1 s on one worker
STATS_IDLE_S = 11.0  # PostgreSQL's idle backends report their statistics within 10 s


def _postgres_ms() -> float:
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        if name == "postgres" or name.startswith("postgres:"):
            fields = stat[stat.rindex(")") + 2:].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * 1000 / CLK_TCK


@dataclass
class Counters:
    worker_ms: float = 0.0
    postgres_ms: float = 0.0
    redis_ms: float = 0.0
    commits: int = 0
    rows: int = 0
    wal_bytes: int = 0
    wal_sync: int = 0
    redis_calls: int = 0
    redis_by_command: dict[str, int] = field(default_factory=dict)

    def __sub__(self, other: Counters) -> Counters:
        fields = {k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__ if k != "redis_by_command"}
        by_command = {k: n - other.redis_by_command.get(k, 0) for k, n in self.redis_by_command.items()}
        return Counters(**fields, redis_by_command={k: n for k, n in by_command.items() if n})


def read_cpu(counters: Counters, worker_pid: int) -> None:
    counters.worker_ms = cpu_ms(worker_pid)
    counters.postgres_ms = _postgres_ms()
    cpu = redis.Redis.from_url(BROKER_URL).info("cpu")
    counters.redis_ms = (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1000


def read_stats(counters: Counters) -> str:
    """Read the counters; returns the WAL position they were read at."""
    with db.engine().connect() as conn:
        lsn = wal.current_lsn(conn)
        row = conn.execute(
            text("SELECT xact_commit, tup_inserted + tup_updated AS rows FROM pg_stat_database WHERE datname = :db"),
            {"db": DB_NAME},
        ).one()
        stat_wal = conn.execute(text("SELECT wal_bytes, wal_sync FROM pg_stat_wal")).one()
    db.engine().dispose()  # its own statistics are reported now, not inside the next phase
    counters.commits, counters.rows = int(row.xact_commit), int(row.rows)
    counters.wal_bytes, counters.wal_sync = int(stat_wal.wal_bytes), int(stat_wal.wal_sync)
    stats = redis.Redis.from_url(BROKER_URL).info("commandstats")
    counters.redis_by_command = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    counters.redis_calls = sum(counters.redis_by_command.values())
    return lsn


@dataclass
class StackCost:
    label: str
    runs: int
    rounds: int
    rounds_done: int
    latency_ms: int
    wall_s: float
    delta: Counters
    wal: wal.WalBreakdown

    def per_round(self) -> dict[str, float]:
        d, n = self.delta, max(self.rounds_done, 1)
        return {
            "worker CPU": d.worker_ms / n,
            "PostgreSQL CPU (all its processes)": d.postgres_ms / n,
            "Redis CPU": d.redis_ms / n,
            "stack CPU (worker + PostgreSQL + Redis)": (d.worker_ms + d.postgres_ms + d.redis_ms) / n,
            "PostgreSQL commits": d.commits / n,
            "WAL flushes waited on (wal_sync)": d.wal_sync / n,
            "WAL bytes": d.wal_bytes / n,
            "rows written (inserted + updated)": d.rows / n,
            "Redis commands": d.redis_calls / n,
        }


def measure(runs: int, rounds: int, latency_ms: int, concurrency: int, label: str) -> StackCost:
    """Every run queued while the worker is stopped (SIGSTOP), then counted from SIGCONT
    to the last run's end."""
    env = {"AIDAWORK_WORKER_CONCURRENCY": str(concurrency)}
    worker = aidawork_worker(concurrency, env=env)
    try:
        db.wait_finished([db.submit(db.scripted(1, owner="bench-warm"))], stall_s=120)
        os.kill(worker.pid, signal.SIGSTOP)
        ids = [db.submit(db.scripted(rounds, latency_ms=latency_ms, owner="bench-stack", tag=j))
               for j in range(runs)]
        with db.engine().connect() as conn:
            wal.enable(conn)
        db.engine().dispose()
        time.sleep(STATS_IDLE_S)
        before = Counters()
        start_lsn = read_stats(before)
        read_cpu(before, worker.pid)
        os.kill(worker.pid, signal.SIGCONT)
        start = time.monotonic()
        stuck = db.wait_finished(ids, poll_s=0.1)
        wall_s = time.monotonic() - start
        after = Counters()
        read_cpu(after, worker.pid)
    finally:
        stop(worker)
    time.sleep(1.0)  # the worker's backends exit and report
    end_lsn = read_stats(after)
    with db.engine().connect() as conn:
        by_relation = wal.breakdown(conn, start_lsn, end_lsn)
    delta = after - before
    delta.redis_calls -= 2  # the two INFO commandstats of the snapshots
    delta.redis_by_command["info"] = delta.redis_by_command.get("info", 0) - 2
    with db.engine().connect() as conn:
        count = text("SELECT count(*) FROM rounds WHERE run_id = ANY(:ids)")
        done = int(conn.execute(count, {"ids": ids}).scalar_one())
    if stuck:
        label += f" ({len(stuck)} runs had not ended)"
    return StackCost(label, runs, rounds, done, latency_ms, wall_s, delta, by_relation)


def report(cost: StackCost) -> list[str]:
    rps = cost.rounds_done / cost.wall_s
    lines = [f"Whole-stack cost per round: {cost.label}; {cost.rounds_done} rounds committed"]
    met = "ok" if rps >= THROUGHPUT_TARGET else "UNDER"
    goal = f"   target >= {THROUGHPUT_TARGET:g}  {met}" if cost.latency_ms else ""
    lines.append(f"  {'rounds/s (wall from the worker resumed)':<42} {rps:14.1f}{goal}")
    for name, value in cost.per_round().items():
        target = TARGETS.get(name)
        unit = target[1] if target else ("ms" if "CPU" in name else "")
        shown = f"{value:9.2f} {unit}".rstrip() if unit != "B" else f"{value:9.0f} B"
        goal = "" if target is None else f"   target <= {target[0]:g} {target[1]}".rstrip()
        mark = "" if target is None else ("  ok" if value <= target[0] else "  OVER")
        lines.append(f"  {name:<42} {shown:>14}{goal}{mark}")
    n = max(cost.rounds_done, 1)
    postgres_ms = cost.delta.postgres_ms / n
    if postgres_ms > 0:
        # What one PostgreSQL primary carries: its CPU is the bound once workers are added.
        lines.append(f"  {'PostgreSQL capacity (rounds/s per core)':<42} {1000 / postgres_ms:14.0f}")
    by_command = sorted(((calls, name) for name, calls in cost.delta.redis_by_command.items() if calls), reverse=True)
    lines.append("  Redis commands per round, by command: "
                 + ", ".join(f"{name} {calls / n:.2f}" for calls, name in by_command))
    return lines + cost.wal.lines(n)


PHASES = [
    (512, 3, 1000, 512, "512 runs x 3 rounds, 1 s model turns, one worker --concurrency 512, queued first"),
    (200, 5, 0, 8, "200 runs x 5 rounds, zero latency, one worker --concurrency 8, queued first"),
]


def measure_all() -> list[StackCost]:
    return [measure(*phase) for phase in PHASES]


def main() -> None:
    db.reset()
    for cost in measure_all():
        print("\n".join(report(cost)), flush=True)


if __name__ == "__main__":
    main()

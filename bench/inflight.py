"""In-flight throughput: one ``aidawork worker --concurrency 512`` (threads pool), 512
runs x 3 rounds submitted at once, every model turn waiting ``latency_ms``. With 512
threads and 1 s per turn the ideal is 512 rounds/s and 3 s of wall time; the measured
figures show what the worker's CPU and the database pool leave of that.

Measured twice: with the runs submitted while the worker runs (the bench's submit loop,
on the same two cores, then paces the worker), and with every run queued first, while
the worker is stopped (SIGSTOP, after its warm-up), so the figure is the worker's own:
from its first claim to the last run's end."""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from bench import db
from bench.env import DB_URL
from bench.procs import aidawork_worker, cpu_ms, stop

APP_NAME = "aidawork-bench-worker"


@dataclass
class InFlight:
    runs: int
    rounds: int
    latency_ms: int
    concurrency: int
    queued_first: bool = False
    submit_s: float = 0.0
    wall_s: float = 0.0
    rounds_done: int = 0
    completed: int = 0
    cpu_ms: float = 0.0
    created_to_finished_s: list[float] = field(default_factory=list)
    started_to_finished_s: list[float] = field(default_factory=list)
    created_to_started_s: list[float] = field(default_factory=list)
    peak_connections: int = 0
    max_connections: int = 0
    log_problems: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # runs that had not ended when progress stopped

    @property
    def ideal_rps(self) -> float:
        return min(self.concurrency, self.runs) / (self.latency_ms / 1000)

    @property
    def ideal_wall_s(self) -> float:
        return self.runs * self.rounds / self.ideal_rps


class ConnectionSampler(threading.Thread):
    """The peak number of the worker's connections (by application_name) to PostgreSQL."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        sql = text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app")
        with db.engine().connect() as conn:
            while not self._done.wait(0.05):
                self.peak = max(self.peak, int(conn.execute(sql, {"app": APP_NAME}).scalar_one()))
                conn.rollback()

    def stop(self) -> None:
        self._done.set()
        self.join()


def measure(
    runs: int = 512,
    rounds: int = 3,
    latency_ms: int = 1000,
    concurrency: int = 512,
    content: str = "done",
    *,
    queued_first: bool = False,
) -> InFlight:
    """``content``: the last turn's answer (the scripted model streams it word by word);
    ``queued_first``: every run is submitted while the worker is stopped, and the wall
    time counts from its first claim."""
    result = InFlight(runs=runs, rounds=rounds, latency_ms=latency_ms, concurrency=concurrency,
                      queued_first=queued_first)
    sep = "&" if "?" in DB_URL else "?"
    env = {
        # Both: the CLI flag sizes Celery's pool, the setting sizes the database pool.
        "AIDAWORK_WORKER_CONCURRENCY": str(concurrency),
        "AIDAWORK_DATABASE_URL": f"{DB_URL}{sep}application_name={APP_NAME}",
    }
    with tempfile.TemporaryFile() as log:
        worker = aidawork_worker(concurrency, env=env, stderr=log)
        try:
            db.wait_finished([db.submit(db.scripted(1, owner="bench-warm"))], stall_s=120)  # the worker is up
            requests = [
                db.scripted(rounds, latency_ms=latency_ms, owner="bench-inflight", tag=j, content=content)
                for j in range(runs)
            ]
            sampler = ConnectionSampler()
            sampler.start()
            if queued_first:
                os.kill(worker.pid, signal.SIGSTOP)
            cpu_before = cpu_ms(worker.pid)
            start = time.monotonic()
            ids = [db.submit(r) for r in requests]
            result.submit_s = time.monotonic() - start
            if queued_first:
                os.kill(worker.pid, signal.SIGCONT)
            stuck = db.wait_finished(ids, poll_s=0.1)
            result.cpu_ms = cpu_ms(worker.pid) - cpu_before
            sampler.stop()
            result.peak_connections = sampler.peak
        finally:
            stop(worker)
        log.seek(0)
        result.log_problems = _log_problems(log.read())
    result.stuck = [db.describe_stuck(i) for i in stuck]
    _read_runs(result, ids)
    return result


def _log_problems(stderr: bytes) -> list[str]:
    """The worker's log lines (JSON, WARNING and above) and anything that looks like an
    error; Celery's warning about running as root is left out."""
    lines = [line.decode(errors="replace").strip() for line in stderr.splitlines()]
    return [
        line[:300]
        for line in lines
        if line.startswith("{") or any(word in line for word in ("Error", "Traceback", "CRITICAL"))
    ]


def _read_runs(result: InFlight, ids: list[Any]) -> None:
    with db.engine().connect() as conn:
        rows = conn.execute(
            text("SELECT status, created_at, started_at, finished_at FROM runs WHERE id = ANY(:ids)"), {"ids": ids}
        ).all()
        result.rounds_done = int(
            conn.execute(text("SELECT count(*) FROM rounds WHERE run_id = ANY(:ids)"), {"ids": ids}).scalar_one()
        )
        result.max_connections = int(conn.execute(text("SHOW max_connections")).scalar_one())
    result.completed = sum(r.status == "completed" for r in rows)
    rows = [r for r in rows if r.finished_at is not None]
    first = min(r.started_at for r in rows) if result.queued_first else min(r.created_at for r in rows)
    result.wall_s = (max(r.finished_at for r in rows) - first).total_seconds()
    result.created_to_finished_s = [(r.finished_at - r.created_at).total_seconds() for r in rows]
    result.started_to_finished_s = [(r.finished_at - r.started_at).total_seconds() for r in rows if r.started_at]
    result.created_to_started_s = [(r.started_at - r.created_at).total_seconds() for r in rows if r.started_at]


def over_twice_median(values: list[float], unfinished: int) -> int:
    """Runs that took more than twice the median; a run that never ended counts."""
    median = statistics.median(values)
    return sum(v > 2 * median for v in values) + unfinished


def report(r: InFlight) -> list[str]:
    rps = r.rounds_done / r.wall_s
    c2f, s2f, c2s = r.created_to_finished_s, r.started_to_finished_s, r.created_to_started_s
    how = "every run queued first, the worker stopped meanwhile" if r.queued_first else "submitted while it runs"
    wall = "first claim" if r.queued_first else "first submit"
    lines = [
        f"In-flight throughput: one worker, --concurrency {r.concurrency} (threads), {r.runs} runs x {r.rounds} "
        f"rounds, every model turn latency_ms {r.latency_ms}; {how}",
        f"  {'rounds/s (committed rounds / wall)':<52} {rps:9.1f}   ideal {r.ideal_rps:.0f} "
        f"({rps / r.ideal_rps:.0%} of it)",
        f"  {f'wall: {wall} -> last run finished (DB clock)':<52} {r.wall_s:9.2f} s ideal {r.ideal_wall_s:.2f} s",
        f"  {'submitting the runs (worker.client.submit loop)':<52} {r.submit_s:9.2f} s "
        f"({r.submit_s / r.runs * 1000:.1f} ms per run)",
        f"  {'runs completed / rounds committed':<52} {r.completed:>5} / {r.rounds_done} "
        f"(of {r.runs} / {r.runs * r.rounds})",
        f"  {'run duration created_at -> finished_at, median':<52} {statistics.median(c2f):9.2f} s "
        f"max {max(c2f):.2f} s; runs > 2x median: {over_twice_median(c2f, len(r.stuck))}",
        f"  {'run duration started_at -> finished_at, median':<52} {statistics.median(s2f):9.2f} s "
        f"max {max(s2f):.2f} s; runs > 2x median: {over_twice_median(s2f, len(r.stuck))}",
        f"  {'wait before the first claim (created -> started)':<52} {statistics.median(c2s):9.2f} s "
        f"max {max(c2s):.2f} s",
        f"  {'worker CPU over the phase':<52} {r.cpu_ms / 1000:9.2f} s = {r.cpu_ms / 1000 / r.wall_s:.2f} "
        f"of a core; {r.cpu_ms / max(r.rounds_done, 1):.1f} ms per round",
        f"  {'worker connections to PostgreSQL, peak':<52} {r.peak_connections:>9} (max_connections "
        f"{r.max_connections}, shared with everyone)",
        f"  {'worker log lines (WARNING and above) and errors':<52} {len(r.log_problems):>9}",
    ]
    lines += [f"    e.g. {line}" for line in r.log_problems[:3]]
    if r.stuck:
        lines.append(
            f"  {len(r.stuck)} run(s) had not ended when progress stopped (the bench runs no reconciler; wall, "
            "durations and CPU are of the runs that ended, CPU includes the wait):"
        )
        lines += [f"    {line}" for line in r.stuck[:5]]
    return lines

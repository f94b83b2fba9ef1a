"""Processes of the bench: spawning and stopping workers, the CPU a process has used,
and the two Celery hops (measured with both hop workers started once, alternately)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

import redis

from bench.env import BROKER_URL, REPO

T = TypeVar("T")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def spawn(
    args: list[str], *, env: Mapping[str, str] | None = None, stderr: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """A process in its own session (so stop() takes any children with it)."""
    return subprocess.Popen(
        args,
        cwd=REPO,
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.DEVNULL,
        stderr=stderr or subprocess.DEVNULL,
        start_new_session=True,
    )


def aidawork_worker(
    concurrency: int, *, env: Mapping[str, str] | None = None, stderr: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """``aidawork worker`` as operators run it; its PID is the worker process itself."""
    return spawn(
        [sys.executable, "-m", "worker.cli", "worker", "--concurrency", str(concurrency)], env=env, stderr=stderr
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for(fn: Callable[[], T], timeout_s: float, poll_s: float = 0.01) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing after {timeout_s}s")
        time.sleep(poll_s)


def _stat(pid: int) -> list[str]:
    # Fields after the ")" that ends comm: [0] state, [1] ppid, ... [11] utime, [12] stime,
    # [13] cutime, [14] cstime (proc(5), fields 3 onwards).
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _ticks(pid: int) -> int:
    ticks = sum(int(f) for f in _stat(pid)[11:15])
    for child in _children(pid):
        try:
            ticks += _ticks(child)
        except OSError:  # it ended meanwhile
            continue
    return ticks


def cpu_ms(pid: int) -> float:
    """User + system CPU of the process (all its threads), its reaped children, and its
    live descendants, in ms, from /proc/<pid>/stat."""
    return _ticks(pid) * 1000 / CLK_TCK


class HopWorkers:
    """One Celery worker per hop kind (threads pool, concurrency 1), started together and
    measured alternately, so both figures see the same machine. Each chain gives the
    wall time per hop and the hop worker's CPU per hop."""

    KINDS = ("plain", "aidawork")

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.samples: dict[str, list[float]] = {kind: [] for kind in self.KINDS}
        self.cpu_samples: dict[str, list[float]] = {kind: [] for kind in self.KINDS}
        self._redis = redis.Redis.from_url(BROKER_URL)
        self._n = 0

    def start(self) -> None:
        from bench.hop_app import AIDAWORK_QUEUE, PLAIN_QUEUE

        common = ["--pool=threads", "--concurrency=1", "--without-mingle", "--without-gossip", "--loglevel=WARNING"]
        celery = [sys.executable, "-m", "celery", "-A"]
        self._procs = {
            "plain": spawn([*celery, "bench.hop_app:plain_app", "worker", "-Q", PLAIN_QUEUE, *common]),
            "aidawork": spawn(
                [*celery, "bench.hop_app:aidawork_app", "worker", "-Q", AIDAWORK_QUEUE, *common]
            ),
        }
        for kind in self.KINDS:  # warm: connections, the first task's imports
            self._chain(kind, 5, timeout_s=90)

    def _chain(self, kind: str, hops: int, timeout_s: float = 120) -> tuple[float, float]:
        from bench.hop_app import send_hops

        self._n += 1
        key = f"bench:hop:{kind}:{self._n}"
        pid = self._procs[kind].pid
        cpu_before = cpu_ms(pid)
        start = time.time()
        send_hops(kind, hops, key)
        done = float(wait_for(lambda: self._redis.get(key), timeout_s))
        return (done - start) / (hops + 1) * 1000, (cpu_ms(pid) - cpu_before) / (hops + 1)

    def measure(self, hops: int = 400) -> None:
        for kind in self.KINDS:
            wall, cpu = self._chain(kind, hops)
            self.samples[kind].append(wall)
            self.cpu_samples[kind].append(cpu)

    def median_ms(self, kind: str) -> float:
        return statistics.median(self.samples[kind])

    def stop(self) -> None:
        for proc in self._procs.values():
            stop(proc)

    def describe(self, kind: str) -> dict[str, Any]:
        values = self.samples[kind]
        return {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "n": len(values),
            "cpu": statistics.median(self.cpu_samples[kind]),
        }

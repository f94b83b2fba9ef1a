"""Real ``aidawork worker`` / ``beat`` / ``webhooks`` processes for a test, and reading what they log.

Every line a process writes must be one JSON object (worker.ops.logging): ``stop_all`` checks
each captured log at teardown and fails the test naming the process and the line, so
every e2e test that starts a process proves it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.env import BROKER_URL, FAST_ENV, REPO, WAIT_S, broker_app, process_environ
from tests.support.wait import wait_until


class Cluster:
    """Real worker and beat processes for one test, logging JSON lines to files."""

    def __init__(self, db_url: str, log_dir: Path) -> None:
        self.db_url = db_url
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = process_environ()
        env.update(FAST_ENV)
        env.update({"AIDAWORK_DATABASE_URL": self.db_url, "AIDAWORK_BROKER_URL": BROKER_URL})
        env.update(extra or {})
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes]:
        if name in self.procs and self.procs[name].poll() is None:
            raise RuntimeError(f"process {name} is already running")
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args],
            cwd=REPO,
            env=self.env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str = "w1", *, concurrency: int = 4,
                     env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        # Each worker of the cluster its own node name: several share this host.
        env = {"AIDAWORK_WORKER_NAME": node_name(name), **(env or {})}
        return self._spawn(name, ["worker", "--concurrency", str(concurrency)], env)

    def start_beat(self, name: str = "beat", *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self._spawn(name, ["beat"], env)

    def start_webhooks(self, name: str = "webhooks", *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """The webhook deliverer (``aidawork webhooks``); ``env`` gives it its secret."""
        return self._spawn(name, ["webhooks"], env)

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def logs(self, name: str) -> list[dict[str, Any]]:
        """The structlog JSON lines a process wrote (other lines are skipped)."""
        path = self.log_dir / f"{name}.log"
        out = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def stop_all(self) -> None:
        """Stop every process, then check that each wrote JSON lines only."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)
        for name in self.procs:
            assert_json_lines(name, self.log_dir / f"{name}.log")


def non_json_lines(text: str) -> list[str]:
    """The lines of ``text`` that are not one JSON object each."""
    bad = []
    for line in text.splitlines():
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            bad.append(line)
    return bad


def assert_json_lines(name: str, path: Path) -> None:
    """Fail naming process ``name`` and its first lines that are not JSON objects."""
    bad = non_json_lines(path.read_text(errors="replace")) if path.exists() else []
    assert not bad, f"{name} wrote {len(bad)} line(s) that are not JSON objects, first: {bad[:3]!r}"


def node_name(name: str) -> str:
    """The Celery node name (AIDAWORK_WORKER_NAME) of the cluster's worker ``name``."""
    return f"{name}@{socket.gethostname()}"


def events(cluster: Cluster, name: str, event: str | None = None, **fields: Any) -> list[dict[str, Any]]:
    """The JSON log lines of process ``name`` with this event name and field values."""
    out = []
    for line in cluster.logs(name):
        if event is not None and line.get("event") != event:
            continue
        if all(str(line.get(k)) == str(v) for k, v in fields.items()):
            out.append(line)
    return out


def wait_events(cluster: Cluster, name: str, event: str, *, count: int, **fields: Any) -> list[dict[str, Any]]:
    """Like ``events``, once at least ``count`` lines are logged: a process writes a line after
    the database change it reports, so a test that saw the change may be ahead of the log."""
    return wait_until(lambda: (found := events(cluster, name, event, **fields)) and len(found) >= count and found,
                      timeout_s=WAIT_S, what=f"{count} {event} lines from {name}")


def wait_ready(cluster: Cluster, *names: str, timeout_s: float = WAIT_S, app: Any = None) -> None:
    """Wait until each named worker process answers a remote-control ping, i.e. it is
    consuming from the broker (so a task sent now can reach it); ``app``: a Celery app on
    the workers' broker when it is not the test broker."""
    app = app or broker_app()
    for name in names:
        proc = cluster.procs[name]
        node = node_name(name)

        def answered(proc: Any = proc, node: str = node, name: str = name) -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker {name} exited with {proc.returncode} while starting")
            replies = app.control.ping(destination=[node], timeout=0.5, limit=1)
            return any(node in reply for reply in replies)

        wait_until(answered, timeout_s=timeout_s, interval_s=0.05, what=f"worker {name} to answer a ping")



def wait_exit(cluster: Cluster, name: str, *, timeout_s: float = WAIT_S) -> int:
    proc = cluster.procs[name]
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {name} did not exit within {timeout_s}s")
        time.sleep(0.02)
    return proc.returncode


def cli(db_url: str, *args: str, env: dict[str, str] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """One ``aidawork`` client command on the test database and broker; ``env``: its only
    other ``AIDAWORK_*`` settings."""
    full = process_environ()
    full.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL, **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args], cwd=REPO, env=full, input=stdin, capture_output=True, text=True,
        timeout=60,
    )

"""A real ``aidawork flower`` process (Tornado) on the test broker, for a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.api import free_port
from tests.support.cluster import assert_json_lines
from tests.support.env import BROKER_URL, REPO, WAIT_S, process_environ
from tests.support.wait import wait_until


@contextmanager
def running_flower(db_url: str, log_path: Path, extra_env: dict[str, str] | None = None) -> Iterator[httpx.Client]:
    """Flower up (answering /healthcheck), as an HTTP client on it; killed afterwards, and
    its log checked to be JSON lines only."""
    port = free_port()
    env = process_environ("FLOWER_")
    env.update({"AIDAWORK_BROKER_URL": BROKER_URL, "AIDAWORK_DATABASE_URL": db_url, **(extra_env or {})})
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "flower", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"flower exited with {proc.returncode}: {log_path.read_text()}")
            try:
                return http.get("/healthcheck").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout_s=WAIT_S, interval_s=0.1, what="Flower to answer /healthcheck")
        yield http
    finally:
        http.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert_json_lines("flower", log_path)

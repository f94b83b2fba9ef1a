"""Fixtures of the e2e tier: a flushed test Redis database, real worker / beat / API /
Flower processes. Marked ``e2e`` (see tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import ApiServer, free_port
from tests.support.cluster import Cluster, assert_json_lines
from tests.support.env import BROKER_URL, REPO, WAIT_S, make_context, unavailable
from tests.support.wait import wait_until


@pytest.fixture
def redis_clean() -> None:
    import redis

    try:
        redis.Redis.from_url(BROKER_URL).flushdb()
    except Exception as exc:
        unavailable("Redis", exc)


@pytest.fixture
def ctx(db_url: str, redis_clean: None) -> Iterator[Any]:
    """An in-process context (client side) on the test database and the real test broker."""
    context = make_context(db_url)
    yield context
    context.leases.stop()  # a context that claimed rounds registered itself and heartbeats
    context.engine.dispose()


@pytest.fixture
def cluster(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(db_url, tmp_path)
    yield c
    c.stop_all()


@pytest.fixture
def api(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[ApiServer]:
    server = ApiServer(db_url, tmp_path / "api.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def flower(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[httpx.Client]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIDAWORK_", "FLOWER_"))}
    env.update({"AIDAWORK_BROKER_URL": BROKER_URL, "AIDAWORK_DATABASE_URL": db_url, "FLOWER_UNAUTHENTICATED_API": "1"})
    log_path = tmp_path / "flower.log"
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

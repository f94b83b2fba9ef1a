"""Fixtures of the e2e tier: a flushed test Redis database, real worker / beat / API /
Flower processes. Marked ``e2e`` (see tests/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import ApiServer
from tests.support.cluster import Cluster
from tests.support.env import BROKER_URL, make_context, unavailable
from tests.support.flower import running_flower
from tests.support.postgres import PG_BIN, PgNode
from tests.support.sentinel import SentinelGroup


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
    with running_flower(db_url, tmp_path / "flower.log", {"FLOWER_UNAUTHENTICATED_API": "1"}) as http:
        yield http


@pytest.fixture
def primary() -> Iterator[PgNode]:
    """A throwaway PostgreSQL primary set up for streaming replication (tests/support/postgres.py)."""
    if not (PG_BIN / "pg_basebackup").exists():
        pytest.fail(f"no pg_basebackup at {PG_BIN}")
    node = PgNode.primary(replication=True)
    yield node
    node.destroy()


@pytest.fixture
def sentinels() -> Iterator[SentinelGroup]:
    """A Redis master, its replica and 3 sentinels on loopback ports (tests/support/sentinel.py)."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    group = SentinelGroup()
    try:
        group.start()
        yield group
    finally:
        group.stop()

"""Shared fixtures.

- Unit tests (tests/unit) need no services.
- DB tests get a fresh database per test, copied from a template migrated once per
  session (``CREATE DATABASE ... TEMPLATE`` is fast).
- E2E tests also get a flushed Redis database and a ``cluster`` that starts real
  ``aidawork worker`` / ``aidawork beat`` processes.

When ``CI`` is set, a missing PostgreSQL or Redis fails the tests instead of skipping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The test process sends tasks to this broker through its contexts (ctx.dispatch) and
# ``broker_app()``; nothing reads it from the environment.
TEST_REDIS_DB = os.environ.get("AIDAWORK_TEST_REDIS_DB", "9")
BROKER_URL = f"redis://127.0.0.1:6379/{TEST_REDIS_DB}"
PG_BASE = os.environ.get("AIDAWORK_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
TEMPLATE_DB = f"aidawork_test_template_{os.getpid()}"  # one per session: sessions may overlap
REPO = Path(__file__).resolve().parent.parent

# Timings for tests: short leases so crash recovery takes seconds, not minutes.
FAST_ENV = {
    "AIDAWORK_LEASE_S": "2",
    "AIDAWORK_DISPATCH_GRACE_S": "1",
    "AIDAWORK_RECONCILE_INTERVAL_S": "0.5",
    "AIDAWORK_LOG_LEVEL": "INFO",
    # The in-process test context signs with the development secret; so do the workers.
    "AIDAWORK_DEV": "1",
}

from sqlalchemy import Engine, create_engine, text  # noqa: E402

from schema.store.tx import make_engine  # noqa: E402


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def admin_engine() -> Engine:
    return create_engine(f"{PG_BASE}/postgres", isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    from schema.migrate import upgrade_head

    try:
        admin = admin_engine()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{TEMPLATE_DB}"'))
    except Exception as exc:
        _unavailable("PostgreSQL", exc)
    upgrade_head(f"{PG_BASE}/{TEMPLATE_DB}")
    yield TEMPLATE_DB
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def db_url(pg_template: str) -> Iterator[str]:
    name = f"aidawork_t_{uuid.uuid4().hex[:12]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    yield f"{PG_BASE}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url, pool_size=8)
    yield eng
    eng.dispose()


@pytest.fixture
def redis_clean() -> None:
    import redis

    try:
        redis.Redis.from_url(BROKER_URL).flushdb()
    except Exception as exc:
        _unavailable("Redis", exc)


@pytest.fixture
def ctx(db_url: str, redis_clean: None) -> Iterator[Any]:
    """An in-process context (client side) on the test database and broker."""
    from worker.bootstrap import build_context
    from worker.settings import Settings

    settings = Settings(database_url=db_url, broker_url=BROKER_URL, lease_s=2, dispatch_grace_s=1)
    context = build_context(settings)
    yield context
    context.leases.stop()  # a context that claimed rounds registered itself and heartbeats
    context.engine.dispose()


def broker_app() -> Any:
    """The Celery app on the test broker: for pings, inspection and raw sends."""
    from worker.app import app_for
    from worker.settings import Settings

    return app_for(Settings(broker_url=BROKER_URL))


def wait_until(predicate: Callable[[], Any], *, timeout_s: float = 30.0, interval_s: float = 0.05,
               what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class Cluster:
    """Real worker and beat processes for one test, logging JSON lines to files."""

    def __init__(self, db_url: str, log_dir: Path) -> None:
        self.db_url = db_url
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
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
        return self._spawn(name, ["worker", "--concurrency", str(concurrency), "--loglevel", "WARNING"], env)

    def start_beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        return self._spawn(name, ["beat", "--loglevel", "WARNING"], None)

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
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)


@pytest.fixture
def cluster(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(db_url, tmp_path)
    yield c
    c.stop_all()


def scripted_request(turns: list[dict[str, Any]], *, tools: list[str] | None = None,
                     owner: str = "team-test", root_id: str | None = None, max_rounds: int = 50,
                     text_input: str = "go") -> dict[str, Any]:
    """A run request for the scripted model."""
    return {
        "owner": owner,
        "root_id": root_id,
        "input": text_input,
        "config": {
            "model": {"provider": "scripted", "turns": turns},
            "system_prompt": "test",
            "tools": tools if tools is not None else ["add", "echo", "sleep"],
            "policy": {"max_rounds": max_rounds},
        },
    }


def rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]

"""Recovery follows the fault, not a timer: a PostgreSQL restart (a throwaway cluster
the test starts itself with initdb + pg_ctl, so the shared server is left alone) and a
throwaway Redis restarted empty, each while rounds are in flight.

Leases and the dispatch grace are set far longer than the tests wait, so only the
mechanisms under test can bring the runs back: the store riding out an unavailable
database in place (``database_unavailable`` / ``database_available``), and the
reconciler noticing an empty broker (``broker_reset_detected``). Every run completes
with exactly one committed round per boundary. The recovery times are printed (not
asserted). The last test restarts Redis at the default timings instead, as a deployment
would see it (issue 34: 30 s there once; docs/how-to/redis-sentinel.md says where it went)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from schema.migrate import upgrade_head
from schema.store.tx import make_engine
from tests.support.api import free_port
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import rows
from tests.support.env import BROKER_URL
from tests.support.requests import echo_rounds_request
from tests.support.wait import wait_until
from worker.engine.bootstrap import build_context
from worker.ops.settings import Settings

PG_BIN = Path("/usr/lib/postgresql") / (sorted(os.listdir("/usr/lib/postgresql"))[-1] if Path(
    "/usr/lib/postgresql").exists() else "none") / "bin"
RUNS, ROUNDS = 12, 8
SLOW = {"AIDAWORK_LEASE_S": "300", "AIDAWORK_DISPATCH_GRACE_S": "600", "AIDAWORK_RECONCILE_INTERVAL_S": "0.5"}
WAIT_S = 90.0


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class ThrowawayPostgres:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="aidawork-pg-"))
        self.port = free_port()
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(self.dir, pg.pw_uid, pg.pw_gid)
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U",
                                     "postgres"]), check=True, capture_output=True)
        self.start()

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w",
                          *args]),
            check=True, capture_output=True, timeout=60,
        )

    def start(self) -> None:
        self._ctl("-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def url(self, db: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def throwaway_pg() -> Iterator[ThrowawayPostgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"no initdb at {PG_BIN}")
    pg = ThrowawayPostgres()
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("CREATE DATABASE aidawork"))
    admin.dispose()
    upgrade_head(pg.url("aidawork"))
    yield pg
    pg.destroy()


class ThrowawayRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        import redis

        client = redis.Redis(port=self.port)
        wait_until(lambda: _pings(client), timeout_s=30, what="the throwaway Redis")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    r = ThrowawayRedis()
    yield r
    r.kill()


def _request(i: int) -> dict[str, Any]:
    return echo_rounds_request(i, ROUNDS, latency_ms=150)


def _submit_all(ctx: Any) -> list[UUID]:
    from worker import client

    return [client.submit(_request(i), ctx=ctx).run_id for i in range(RUNS)]


def _store_due(ctx: Any) -> list[UUID]:
    """Store the runs and make them due: the cluster's reconciler sends them through its
    own broker (this process's Celery app points at the shared test Redis)."""
    from runtime.prepare import prepare_execution
    from schema.store.runs import submit_run

    ids = []
    for i in range(RUNS):
        parsed, prepared = prepare_execution(ctx.runtime, _request(i))
        run_id = submit_run(ctx.engine, parsed, prepared.turn_config.model_dump(mode="json")).run_id
        ctx.store.dispatch_failed(run_id)
        ids.append(run_id)
    return ids


def _committed(engine: Any) -> int:
    return int(rows(engine, "SELECT count(*) AS n FROM rounds")[0]["n"])


def _all_completed_once(engine: Any, run_ids: list[UUID]) -> None:
    def done() -> bool:
        try:
            got = rows(engine, "SELECT count(*) AS n FROM runs WHERE status = 'completed'")
        except OperationalError:  # this test's own connection, killed by the restart
            return False
        return got[0]["n"] == len(run_ids)

    wait_until(done, timeout_s=WAIT_S, interval_s=0.2, what="every run to complete")
    per_run = rows(
        engine, "SELECT run_id, count(*) AS n, count(DISTINCT boundary_seq) AS b FROM rounds GROUP BY run_id"
    )
    assert sorted((r["n"], r["b"]) for r in per_run) == [(ROUNDS, ROUNDS)] * len(run_ids)
    outputs = rows(engine, "SELECT output FROM runs ORDER BY output")
    assert sorted(r["output"] for r in outputs) == sorted(f"done {i}" for i in range(RUNS))


def _first_commit_after(engine: Any, moment: datetime) -> float | None:
    got = rows(engine, "SELECT min(created_at) AS t FROM rounds WHERE created_at > :m", m=moment)[0]["t"]
    return None if got is None else (got - moment).total_seconds()


def test_rounds_in_flight_ride_out_a_postgresql_restart(
    throwaway_pg: ThrowawayPostgres, redis_clean: None, tmp_path: Path
) -> None:
    url = throwaway_pg.url("aidawork")
    cluster = Cluster(url, tmp_path)
    ctx = build_context(Settings(database_url=url, broker_url=BROKER_URL))
    engine = make_engine(url, pool_size=2)
    try:
        cluster.start_worker("w1", concurrency=RUNS, env=SLOW)
        cluster.start_beat()
        wait_ready(cluster, "w1")
        run_ids = _submit_all(ctx)
        wait_until(lambda: _committed(engine) >= RUNS, timeout_s=WAIT_S, what="rounds to commit")

        throwaway_pg.stop()
        time.sleep(3)  # the outage: rounds in flight meet a database that is gone
        throwaway_pg.start()
        back = datetime.now(UTC)
        engine.dispose()
        _all_completed_once(engine, run_ids)
        print(f"\nfirst commit {_first_commit_after(engine, back)} s after PostgreSQL was back")

        logs = [e for name in ("w1", "beat") for e in cluster.logs(name)]
        assert any(e.get("event") == "database_unavailable" for e in logs)
        assert any(e.get("event") == "database_available" for e in logs)
    finally:
        cluster.stop_all()
        engine.dispose()
        ctx.engine.dispose()


def test_runs_move_again_once_an_empty_redis_is_back(
    throwaway_redis: ThrowawayRedis, db_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(db_url, tmp_path)
    env = {**SLOW, "AIDAWORK_BROKER_URL": throwaway_redis.url}
    ctx = build_context(Settings(database_url=db_url, broker_url=throwaway_redis.url))
    engine = make_engine(db_url, pool_size=2)
    try:
        cluster.start_worker("w1", concurrency=RUNS, env=env)
        cluster.start_beat(env=env)
        wait_until(lambda: any(e.get("event") == "broker_reset_detected" for e in cluster.logs("beat")),
                   timeout_s=WAIT_S, what="the first reconcile (a new broker counts as reset)")
        run_ids = _store_due(ctx)
        wait_until(lambda: _committed(engine) >= RUNS, timeout_s=WAIT_S, what="rounds to commit")

        throwaway_redis.kill()  # every queued message is gone
        time.sleep(2)
        throwaway_redis.start()
        back = datetime.now(UTC)
        _all_completed_once(engine, run_ids)
        print(f"\nfirst commit {_first_commit_after(engine, back)} s after Redis was back (empty)")

        resets = [e for e in cluster.logs("beat") if e.get("event") == "broker_reset_detected"]
        assert len(resets) >= 2  # the start, and the restart
    finally:
        cluster.stop_all()
        engine.dispose()
        ctx.engine.dispose()


def test_runs_move_again_once_an_empty_redis_is_back_at_the_default_timings(
    throwaway_redis: ThrowawayRedis, db_url: str, tmp_path: Path
) -> None:
    """As a deployment sees it: the default lease, grace and reconcile interval, 20 runs in
    flight. Runs were 30 s late here once (issue 34): see docs/how-to/redis-sentinel.md."""
    from tests.support.env import default_timings

    cluster = Cluster(db_url, tmp_path)
    env = {**default_timings(), "AIDAWORK_BROKER_URL": throwaway_redis.url}
    ctx = build_context(Settings(database_url=db_url, broker_url=throwaway_redis.url))
    engine = make_engine(db_url, pool_size=2)
    runs = 20
    try:
        cluster.start_worker("w1", concurrency=runs, env=env)
        cluster.start_beat(env=env)
        wait_ready(cluster, "w1", app=ctx.dispatch.app)
        from worker import client

        run_ids = [client.submit(_request(i), ctx=ctx).run_id for i in range(runs)]
        wait_until(lambda: _committed(engine) >= runs, timeout_s=WAIT_S, what="rounds to commit")

        throwaway_redis.kill()  # every queued message is gone
        time.sleep(2)
        throwaway_redis.start()
        back = datetime.now(UTC)
        wait_until(lambda: rows(engine, "SELECT count(*) AS n FROM runs WHERE status = 'completed'")[0]["n"] == runs,
                   timeout_s=WAIT_S, interval_s=0.1, what="every run to complete")
        done = datetime.now(UTC)
        per_run = rows(
            engine, "SELECT run_id, count(*) AS n, count(DISTINCT boundary_seq) AS b FROM rounds GROUP BY run_id"
        )
        assert sorted((r["n"], r["b"]) for r in per_run) == [(ROUNDS, ROUNDS)] * len(run_ids)
        print(f"\ndefault timings: first commit {_first_commit_after(engine, back)} s after Redis was back (empty), "
              f"every run completed {(done - back).total_seconds():.2f} s after")
    finally:
        cluster.stop_all()
        engine.dispose()
        ctx.engine.dispose()

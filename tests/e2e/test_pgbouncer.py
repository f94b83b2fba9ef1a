"""Behind PgBouncer in transaction pooling mode (Debian's ``pgbouncer``, started by the
test on its own port in front of the shared PostgreSQL): with
``AIDAWORK_DATABASE_PGBOUNCER=1`` (no server-side prepared statements) a multi-round run
and a suspension with its resume complete, the worker and the client both going through
the pooler, and the pooler really served them in transaction mode."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.api import free_port
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_suspended, wait_terminal
from tests.support.env import BROKER_URL, WAIT_S
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client
from worker.engine.bootstrap import build_context
from worker.ops.settings import Settings

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# Many rounds reuse the same statements: past psycopg's prepare threshold (5), a prepared
# statement would be looked up on whichever server connection the pooler hands out.
ROUNDS = 12


def _as_postgres(cmd: list[str]) -> list[str]:
    # PgBouncer refuses to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture
def pgbouncer_url(db_url: str) -> Iterator[str]:
    if not Path(PGBOUNCER).exists():
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is not installed (.ci/run installs Debian's pgbouncer)")
        pytest.skip("pgbouncer is not installed")
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="aidawork-pgbouncer-"))
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        os.chown(work, postgres.pw_uid, postgres.pw_gid)
    config = work / "pgbouncer.ini"
    config.write_text(
        "[databases]\n* = host=127.0.0.1 port=5432 user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\n"
        "default_pool_size = 4\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {work}/pgbouncer.log\npidfile = {work}/pgbouncer.pid\n"
    )
    os.chmod(config, 0o644)
    proc = subprocess.Popen(_as_postgres([PGBOUNCER, str(config)]), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = db_url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
    plain = url.replace("postgresql+psycopg://", "postgresql://")

    def up() -> bool:
        if proc.poll() is not None:
            log = (work / "pgbouncer.log").read_text() if (work / "pgbouncer.log").exists() else ""
            raise AssertionError(f"pgbouncer exited with {proc.returncode}: {log}")
        try:
            with psycopg.connect(plain, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    wait_until(up, timeout_s=WAIT_S, interval_s=0.1, what="pgbouncer to accept connections")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _pooler_mode(url: str) -> dict[str, Any]:
    """What PgBouncer's admin console says about the database's pool."""
    admin = url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/pgbouncer"
    with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
        cur = conn.execute("SHOW POOLS")
        names = [c.name for c in cur.description or ()]
        pools = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    db = url.rsplit("/", 1)[1]
    (pool,) = [p for p in pools if p["database"] == db]
    return pool


def test_runs_and_a_resume_complete_behind_pgbouncer_in_transaction_mode(
    cluster: Cluster, redis_clean: None, pgbouncer_url: str, db_url: str
) -> None:
    settings = Settings(database_url=pgbouncer_url, broker_url=BROKER_URL, database_pgbouncer=True, lease_s=2,
                        dispatch_grace_s=1)
    ctx = build_context(settings)
    try:
        cluster.start_worker("w1", concurrency=4, env={"AIDAWORK_DATABASE_URL": pgbouncer_url,
                                                       "AIDAWORK_DATABASE_PGBOUNCER": "1"})
        cluster.start_beat()
        wait_ready(cluster, "w1")
        adds = [{"tool_calls": [{"name": "add", "args": {"a": i, "b": 2}}]} for i in range(ROUNDS - 1)]
        long_run = client.submit(scripted_request([*adds, {"content": "added"}]), ctx=ctx).run_id
        waiting = client.submit(
            scripted_request(
                [{"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}, {"content": "ok"}],
                tools=["await_prerequisite"],
            ),
            ctx=ctx,
        ).run_id

        wait_suspended(ctx.engine, waiting, 0)
        client.resolve(waiting, "approval", {"by": "ops"}, ctx=ctx)
        for run_id, output in ((long_run, "added"), (waiting, "ok")):
            run = wait_terminal(ctx.engine, run_id, timeout_s=WAIT_S)
            assert (run["status"], run["output"]) == ("completed", output), run
        assert calls_per_boundary(ctx.engine, long_run) == dict.fromkeys(range(ROUNDS), 1)
        assert calls_per_boundary(ctx.engine, waiting) == {0: 1, 1: 1}
        (approval,) = rows(ctx.engine, "SELECT result FROM tool_invocations WHERE run_id = :id", id=waiting)
        assert approval["result"] == {"key": "approval", "value": {"by": "ops"}}
        # The pooler has a pool for this database (its clients were ours), in transaction mode.
        assert _pooler_mode(pgbouncer_url)["pool_mode"] == "transaction"
    finally:
        ctx.engine.dispose()

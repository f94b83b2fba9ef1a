"""Both at once: the Redis master and the PostgreSQL primary are lost together under load.

A master, a replica and 3 sentinels (tests/support/sentinel.py) and a PostgreSQL primary
with an asynchronous streaming replica (tests/support/postgres.py); 2 workers and beat at
the default timings reach them through the Sentinel URL and the libpq multi-host URL. With
rounds in flight the master is SIGKILLed and the primary stopped immediately; the replica
is promoted by hand while Sentinel promotes the Redis replica. Every run completes with one
committed round per boundary, rounds after the failover carry fences of the new timeline,
and ``aidawork audit`` finds no error on the promoted database. The seconds from the later
of the two promotions to the first commit are printed (not asserted)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from sqlalchemy.exc import OperationalError

from schema.store.audit import audit
from schema.store.tx import make_engine
from schema.wire.audit import Severity
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import rows
from tests.support.env import default_timings
from tests.support.postgres import PgNode, multi_host_url, replicate
from tests.support.requests import echo_rounds_request
from tests.support.sentinel import MASTER_NAME, SentinelGroup
from tests.support.wait import wait_until
from worker import client
from worker.engine.bootstrap import build_context
from worker.ops.settings import Settings

RUNS, ROUNDS = 40, 5
WAIT_S = 90.0
TIMELINE_FLOOR = 1 << 40  # the lowest fence timeline 2 issues (schema.store.claims)


def _count(engine: object, sql: str) -> int:
    try:
        return int(rows(engine, sql)[0]["n"])  # type: ignore[arg-type]
    except OperationalError:  # a pooled connection to the stopped primary
        engine.dispose()  # type: ignore[attr-defined]
        return -1


def test_runs_survive_losing_the_redis_master_and_the_postgres_primary_together(
    primary: PgNode, sentinels: SentinelGroup, tmp_path: Path
) -> None:
    replica = replicate(primary, "async")
    url = multi_host_url("aidawork", primary, replica)
    env = {**default_timings(), **sentinels.env()}
    settings = Settings(database_url=url, broker_url=sentinels.url, sentinel_master=MASTER_NAME)
    ctx = build_context(settings)
    engine = make_engine(url, pool_size=2)
    cluster = Cluster(url, tmp_path)
    try:
        for name in ("w1", "w2"):
            cluster.start_worker(name, concurrency=RUNS // 2, env=env)
        cluster.start_beat(env=env)
        wait_ready(cluster, "w1", "w2", app=ctx.dispatch.app)
        run_ids: list[UUID] = [
            client.submit(echo_rounds_request(i, ROUNDS, latency_ms=200), ctx=ctx).run_id for i in range(RUNS)
        ]
        wait_until(lambda: _count(engine, "SELECT count(*) AS n FROM rounds") >= RUNS, timeout_s=WAIT_S,
                   interval_s=0.05, what="the first rounds to commit")

        sentinels.kill("master")
        primary.stop("immediate")
        replica.promote()
        promoted_at = time.time()
        engine.dispose()
        ctx.engine.dispose()
        switched_at = sentinels.wait_switched()
        both = datetime.fromtimestamp(max(promoted_at, switched_at), UTC)

        wait_until(lambda: _count(engine, "SELECT count(*) AS n FROM runs WHERE status = 'completed'") == RUNS,
                   timeout_s=WAIT_S, interval_s=0.2, what="every run to complete after both failovers")
        assert rows(engine, "SELECT inet_server_port() AS p")[0]["p"] == replica.port
        per_run = rows(engine, "SELECT run_id, count(*) AS n, count(DISTINCT boundary_seq) AS b FROM rounds "
                               "GROUP BY run_id")
        assert sorted((r["n"], r["b"]) for r in per_run) == [(ROUNDS, ROUNDS)] * RUNS
        outputs = rows(engine, "SELECT id, output FROM runs")
        assert {r["id"]: r["output"] for r in outputs} == {run_ids[i]: f"done {i}" for i in range(RUNS)}
        assert _count(engine, f"SELECT count(*) AS n FROM rounds WHERE claim_fence >= {TIMELINE_FLOOR}") > 0

        report = audit(engine)
        errors = [p for p in report.problems if p.severity is Severity.ERROR]
        assert not errors, errors
        first = rows(engine, "SELECT min(created_at) AS t FROM rounds WHERE created_at > :m", m=both)[0]["t"]
        seconds = None if first is None else round((first - both).total_seconds(), 2)
        print(f"\nboth lost: the Redis master (Sentinel named the new one {switched_at - promoted_at:+.2f} s "
              f"from the PostgreSQL promotion); first commit {seconds} s after the later of the two; "
              f"{RUNS} runs completed, each boundary once; audit: {report.warnings} warning(s), no error")
    finally:
        cluster.stop_all()
        engine.dispose()
        ctx.engine.dispose()
        replica.destroy()

"""The broker behind Redis Sentinel (``sentinel://`` URLs, AIDAWORK_SENTINEL_MASTER): a
master, a replica and 3 sentinels (tests/support/sentinel.py); 2 workers and beat at the
default timings, pointed at the sentinels; 40 runs of 5 rounds in flight when the master
is SIGKILLed. Sentinel promotes the replica; every process's Redis clients (Celery's, the
deltas', the reconciler's epoch key) follow it. Every run completes with exactly one
committed round per boundary, and ``aidawork audit`` finds no error.

Printed, not asserted (no wall-clock assertions): the seconds from Sentinel naming the
new master to the first round committed after it, and to the last run completed."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import rows
from tests.support.env import default_timings
from tests.support.requests import echo_rounds_request
from tests.support.sentinel import MASTER_NAME, SentinelGroup
from tests.support.wait import wait_until
from worker import client
from worker.engine.bootstrap import build_context
from worker.engine.reconcile import BROKER_EPOCH_KEY
from worker.ops.deltas import DeltaPublisher, DeltaSubscription, RunDelta
from worker.ops.redis_clients import RedisTarget, async_client, sync_client
from worker.ops.settings import Settings

RUNS, ROUNDS = 40, 5
LOST = 5  # runs whose first message was on the old master only (see _lost_messages)
LATENCY_MS = 300  # a round's model call: rounds are in flight when the master dies
WAIT_S = 75.0


def _request(i: int) -> dict[str, Any]:
    return echo_rounds_request(i, ROUNDS, latency_ms=LATENCY_MS, answer_latency_ms=LATENCY_MS)


def _committed(engine: Any) -> int:
    return int(rows(engine, "SELECT count(*) AS n FROM rounds")[0]["n"])


def _deltas_flow(target: RedisTarget) -> bool:
    """A delta published through ``target`` reaches a reader subscribed through it."""
    run = uuid4()
    reader = DeltaSubscription(target, run)
    publisher = DeltaPublisher(target)
    try:
        publisher.publish(run, RunDelta(0, "hello"))
        publisher.flush(timeout_s=5)
        return reader.next(timeout_s=5) == RunDelta(0, "hello")
    finally:
        reader.close()


async def _async_ping(target: RedisTarget) -> bool:
    redis_client = async_client(target, socket_connect_timeout=2.0)
    try:
        return bool(await redis_client.ping())
    finally:
        await redis_client.aclose()


def _lost_messages(ctx: Any) -> list[UUID]:
    """Runs stored and marked sent, with no message anywhere: what the promoted replica
    lacks of what the old master took just before it died (asynchronous replication), or
    what a worker held and dropped when its connection broke. Only the reconciler can
    bring them back: at once if it sees the failover, else after the dispatch grace."""
    from runtime.prepare import prepare_execution
    from schema.store.runs import submit_run

    ids = []
    for i in range(RUNS, RUNS + LOST):
        parsed, prepared = prepare_execution(ctx.runtime, _request(i))
        ids.append(submit_run(ctx.engine, parsed, prepared.turn_config.model_dump(mode="json")).run_id)
    return ids


def test_runs_ride_out_a_sentinel_failover_of_the_broker(
    sentinels: SentinelGroup, db_url: str, tmp_path: Any
) -> None:
    env = {**default_timings(), **sentinels.env()}
    settings = Settings(database_url=db_url, broker_url=sentinels.url, sentinel_master=MASTER_NAME)
    target = RedisTarget(sentinels.url, MASTER_NAME)
    ctx = build_context(settings)
    cluster = Cluster(db_url, tmp_path)
    try:
        assert _deltas_flow(target)
        cluster.start_worker("w1", concurrency=RUNS // 2, env=env)
        cluster.start_worker("w2", concurrency=RUNS // 2, env=env)
        cluster.start_beat(env=env)
        wait_ready(cluster, "w1", "w2", app=ctx.dispatch.app)
        run_ids = [client.submit(_request(i), ctx=ctx).run_id for i in range(RUNS)]
        wait_until(lambda: _committed(ctx.engine) >= RUNS, timeout_s=WAIT_S, what="the first rounds to commit")

        run_ids += _lost_messages(ctx)
        killed_at = time.time()
        sentinels.kill("master")
        switched_at = sentinels.wait_switched()
        switched = datetime.fromtimestamp(switched_at, UTC)
        _wait_all_completed(ctx.engine, run_ids)
        done_at = time.time()

        per_run = rows(ctx.engine, "SELECT run_id, count(*) AS n, count(DISTINCT boundary_seq) AS b "
                                   "FROM rounds GROUP BY run_id")
        assert sorted((r["n"], r["b"]) for r in per_run) == [(ROUNDS, ROUNDS)] * len(run_ids)
        outputs = rows(ctx.engine, "SELECT output FROM runs ORDER BY output")
        assert sorted(r["output"] for r in outputs) == sorted(f"done {i}" for i in range(RUNS + LOST))
        report = cli(db_url, "audit", "--json")
        assert report.returncode == 0, report.stdout + report.stderr
        found = json.loads(report.stdout)
        assert found["clean"] and found["runs_checked"] == len(run_ids), found
        assert not [p for p in found["problems"] if p["severity"] == "error"], found["problems"]

        # The clients made from the settings follow the promoted replica.
        assert _deltas_flow(target)
        assert asyncio.run(_async_ping(target))
        first = rows(ctx.engine, "SELECT min(created_at) AS t FROM rounds WHERE created_at > :m", m=switched)[0]["t"]
        # Beat saw the failover (another server holds the epoch key) and re-sent the lost
        # runs on that pass, not a dispatch grace (30 s) later.
        beat = cluster.logs("beat")
        changed = [i for i, e in enumerate(beat) if e.get("event") == "broker_reset_detected"
                   and e.get("cause") == "changed"]
        assert changed, "beat did not notice the failover"
        healed = {e.get("run_id") for e in beat[changed[0]:] if e.get("event") == "run_redispatched"}
        assert {str(r) for r in run_ids[RUNS:]} <= healed
        print(
            f"\nsentinel failover: new master {switched_at - killed_at:.2f} s after the SIGKILL; first round "
            f"committed {(first - switched).total_seconds():.2f} s after Sentinel named it; every run completed "
            f"{done_at - switched_at:.2f} s after it; epoch key on the new master: "
            f"{sync_client(target).exists(BROKER_EPOCH_KEY) == 1}; broker resets seen by beat: "
            f"{sum(e.get('event') == 'broker_reset_detected' for e in beat)}; re-dispatched by beat: "
            f"{sum(e.get('event') == 'run_redispatched' for e in beat)}"
        )
    finally:
        cluster.stop_all()
        ctx.engine.dispose()


def _wait_all_completed(engine: Any, run_ids: list[UUID]) -> None:
    def done() -> bool:
        got = rows(engine, "SELECT count(*) AS n FROM runs WHERE status = 'completed'")
        return bool(got[0]["n"] == len(run_ids))

    wait_until(done, timeout_s=WAIT_S, interval_s=0.1, what="every run to complete")


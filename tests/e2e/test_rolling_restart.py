"""A rolling restart of every process type under load: the API, beat, the webhook deliverer
and each worker are stopped with SIGTERM (as a deployment's rollout does) and replaced one
after another while runs submitted through the API are in flight. 0 runs lost: every run
completes with its own answer and one committed round per boundary, every run's
``run_completed`` webhook arrives (a delivery repeated across the deliverer's restart keeps
its delivery id), and ``aidawork audit`` finds no error."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from schema.store.audit import audit
from tests.support.api import A, ApiServer
from tests.support.cluster import Cluster, wait_exit, wait_ready
from tests.support.db import rows, wait_terminal
from tests.support.requests import echo_rounds_request
from tests.support.wait import wait_until
from tests.support.webhook_receiver import LoopbackReceiver, loopback_receiver

SECRET = "whsec-rolling-0123456789abcdef"
ROUNDS = 5  # 4 tool rounds, then the answer
WAVE = 6  # runs submitted before each restart
WAIT_S = 120.0


@pytest.fixture
def receiver() -> Iterator[LoopbackReceiver]:
    with loopback_receiver() as got:
        yield got


def hooks_env(receiver: LoopbackReceiver) -> dict[str, str]:
    return {"AIDAWORK_WEBHOOK_URLS": receiver.url + "/", "AIDAWORK_WEBHOOK_SECRET": SECRET,
            "AIDAWORK_WEBHOOK_POLL_S": "0.2", "AIDAWORK_WEBHOOK_BACKOFF_S": "0.2",
            "AIDAWORK_WEBHOOK_BACKOFF_MAX_S": "0.5"}


def request(i: int, receiver: LoopbackReceiver) -> dict[str, Any]:
    """Rounds of 300 ms, so that every restart lands while rounds are in flight."""
    body = echo_rounds_request(i, ROUNDS, latency_ms=300, answer_latency_ms=300)
    body["webhook"] = {"url": f"{receiver.url}/runs"}
    del body["owner"]  # the API token's owner (team-a)
    return body


def restart(cluster: Cluster, old: str, new: str, start: Any) -> None:
    """SIGTERM ``old`` (a warm shutdown: a worker finishes its rounds in flight), wait for
    it to exit cleanly, then start ``new`` in its place."""
    cluster.signal(old, signal.SIGTERM)
    assert wait_exit(cluster, old) == 0, (cluster.log_dir / f"{old}.log").read_text()[-2000:]
    start(new)


def test_a_rolling_restart_of_every_process_type_loses_no_run(
    cluster: Cluster, ctx: Any, receiver: LoopbackReceiver, tmp_path: Path
) -> None:
    env = hooks_env(receiver)
    cluster.start_worker("w1", concurrency=4, env=env)
    cluster.start_worker("w2", concurrency=4, env=env)
    cluster.start_beat("beat1", env=env)
    cluster.start_webhooks("hooks1", env=env)
    wait_ready(cluster, "w1", "w2")
    run_ids: list[UUID] = []

    def submit(api: ApiServer) -> None:
        for _ in range(WAVE):
            created = api.http.post("/v1/runs", json=request(len(run_ids), receiver), headers=A)
            assert created.status_code == 201, created.text
            run_ids.append(UUID(created.json()["run_id"]))

    api = ApiServer(cluster.db_url, tmp_path / "api1.log", env)
    try:
        api.wait_ready()
        submit(api)
        # The API: the old one drains (uvicorn's graceful shutdown, which then re-raises the
        # signal: the exit status says SIGTERM), the new one takes requests.
        api.proc.send_signal(signal.SIGTERM)
        assert api.proc.wait(timeout=30) == -signal.SIGTERM
        assert "Finished server process" in api.log_path.read_text()
        api.stop()
        api = ApiServer(cluster.db_url, tmp_path / "api2.log", env)
        api.wait_ready()
        submit(api)
        restart(cluster, "beat1", "beat2", lambda name: cluster.start_beat(name, env=env))
        restart(cluster, "hooks1", "hooks2", lambda name: cluster.start_webhooks(name, env=env))
        submit(api)
        for old, new in (("w1", "w3"), ("w2", "w4")):
            restart(cluster, old, new, lambda name: cluster.start_worker(name, concurrency=4, env=env))
            wait_ready(cluster, new)
            submit(api)
    finally:
        api.stop()

    finished = {run_id: wait_terminal(ctx.engine, run_id, timeout_s=WAIT_S) for run_id in run_ids}
    assert [r["status"] for r in finished.values()] == ["completed"] * len(run_ids)
    assert [r["output"] for r in finished.values()] == [f"done {i}" for i in range(len(run_ids))]
    committed = rows(ctx.engine, "SELECT run_id, count(*) AS n, count(DISTINCT boundary_seq) AS b, "
                     "min(boundary_seq) AS lo, max(boundary_seq) AS hi FROM rounds "
                     "WHERE run_id = ANY(:ids) GROUP BY run_id", ids=run_ids)
    assert sorted((r["n"], r["b"], r["lo"], r["hi"]) for r in committed) == [(ROUNDS, ROUNDS, 0, ROUNDS - 1)] * len(
        run_ids)

    # Every run's last webhook arrived; one sent twice (the deliverer stopped between the
    # receiver's 200 and its own record of it) kept its delivery id.
    def all_completed_arrived() -> bool:
        done = {b["run_id"] for b in receiver.bodies("/runs") if b["kind"] == "run_completed"}
        return done == {str(r) for r in run_ids}

    wait_until(all_completed_arrived, timeout_s=WAIT_S, interval_s=0.2, what="every run_completed webhook")
    ids: dict[tuple[str, int], set[str]] = {}
    for got in receiver.got:
        body = json.loads(got.body)
        ids.setdefault((body["run_id"], body["seq"]), set()).add(got.headers["AIDAWORK-Delivery"])
    assert all(len(d) == 1 for d in ids.values()), ids

    report = audit(ctx.engine, owner="team-a")
    assert report.runs_checked >= len(run_ids)
    assert report.clean and report.errors == 0, report.problems
    print(f"\nrolling restart: {len(run_ids)} runs x {ROUNDS} rounds, API, beat, deliverer and 2 workers "
          f"restarted, 0 lost; audit: {report.warnings} warning(s)")

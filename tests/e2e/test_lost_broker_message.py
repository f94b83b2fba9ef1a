from __future__ import annotations

import redis

from tests.support.cluster import Cluster, events
from tests.support.db import round_rows, run_row, wait_terminal
from tests.support.env import BROKER_URL
from tests.support.queues import queued_rounds
from tests.support.requests import scripted_request
from worker import client


def test_run_whose_task_was_lost_in_the_broker_is_resent_and_completes(cluster: Cluster, ctx) -> None:
    broker = redis.Redis.from_url(BROKER_URL)
    submitted = client.submit(
        scripted_request([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "3"}]), ctx=ctx
    )
    assert queued_rounds(broker) == 1  # the doorbell rang, nobody is listening
    broker.flushdb()  # ... and the message is gone
    assert queued_rounds(broker) == 0
    assert run_row(ctx.engine, submitted.run_id)["status"] == "queued"

    cluster.start_worker("w1")
    cluster.start_beat()
    run = wait_terminal(ctx.engine, submitted.run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "3"
    assert [r["boundary_seq"] for r in round_rows(ctx.engine, submitted.run_id)] == [0, 1]

    # Round 0 ran because the reconciler sent it again.
    resent = events(cluster, "beat", "run_redispatched", run_id=submitted.run_id, boundary_seq=0)
    assert resent, "no run_redispatched for round 0 in beat's log"
    claims = events(cluster, "w1", "round_claimed", run_id=submitted.run_id, boundary_seq=0)
    assert len(claims) == 1
    assert claims[0]["timestamp"] > resent[0]["timestamp"]

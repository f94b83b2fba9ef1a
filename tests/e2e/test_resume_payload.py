"""A ``resume_round`` task whose payload is not a list of resumes (a number, an object,
null, NaN inside, too deep, a list of junk), sent to a real worker through the real
broker: each is refused with one structured ``resume_payload_refused`` WARNING naming
the field, no traceback, the message acknowledged, nothing stored, and the worker goes on
running rounds."""

from __future__ import annotations

import math
from typing import Any

import redis

from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import wait_terminal
from tests.support.env import BROKER_URL, broker_app
from tests.support.queues import queued_rounds
from tests.support.requests import RESUME, scripted_request
from tests.support.suspensions import assert_unchanged, snapshot
from tests.support.wait import wait_until
from worker import client
from worker.ops.celery_app import RESUME_ROUND_TASK, round_queue


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


# payload -> the field its refusal names
PAYLOADS: list[tuple[Any, str]] = [
    (5, "resumes"),
    ({}, "resumes"),
    (None, "resumes"),
    ({"run_id": RESUME["run_id"]}, "resumes"),
    ([], "resumes"),
    ([5], "resumes[0]"),
    ([{"bogus": 1}], "resumes[0].run_id"),
    ([{**RESUME, "proof": math.nan}], "resumes[0].proof"),
    (nested(500), "resumes" + "[0]" * 64),
]


def test_a_malformed_resume_payload_is_refused_logged_once_and_acknowledged(cluster: Cluster, ctx) -> None:
    broker = redis.Redis.from_url(BROKER_URL)
    cluster.start_worker("w1", concurrency=2)
    wait_ready(cluster, "w1")
    before = snapshot(ctx)

    for payload, _ in PAYLOADS:
        broker_app().send_task(RESUME_ROUND_TASK, args=[payload], queue=round_queue(0))

    refused = wait_until(
        lambda: (lines := events(cluster, "w1", "resume_payload_refused")) and len(lines) >= len(PAYLOADS) and lines,
        timeout_s=60,
        what="every malformed payload to be refused",
    )
    assert sorted(line["field"] for line in refused) == sorted(field for _, field in PAYLOADS)
    assert {line["level"] for line in refused} == {"warning"}
    assert all(line["reason"] and line["task_id"] for line in refused)
    # Acknowledged: nothing waits in the queue. A worker of 2 threads takes no more
    # messages than it has acknowledged plus 2 (prefetch 1 per thread), so 9 refused
    # messages all taken means each was acknowledged.
    wait_until(
        lambda: queued_rounds(broker) == 0,
        timeout_s=30,
        what="the refused messages to be acknowledged",
    )
    assert_unchanged(ctx, before, "malformed resume payloads")

    # The worker is unharmed: a run sent now completes on it.
    submitted = client.submit(
        scripted_request([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "3"}]), ctx=ctx
    )
    assert wait_terminal(ctx.engine, submitted.run_id)["status"] == "completed"
    log = (cluster.log_dir / "w1.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert not events(cluster, "w1", "round_crashed") and not events(cluster, "w1", "round_dropped")

"""Celery task events only while a monitor asks for them (worker.ops.celery_app): a real
worker sends none for its rounds until an ``enable_events`` broadcast (what Flower sends
every 5 s), and then one ``task-received`` and one ``task-succeeded`` per round.

The events are read where Flower reads them, on the broker's ``celeryev`` fanout (Redis
pub/sub), subscribed before the first run. One worker's events reach Redis in the order it
sent them, so had the first run's rounds sent any, they would come before the second's."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from tests.support.cluster import Cluster, node_name, wait_ready
from tests.support.db import wait_terminal
from tests.support.env import BROKER_URL, TEST_REDIS_DB, WAIT_S, broker_app
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client


def _task_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The task events of one ``celeryev`` pub/sub message (kombu's envelope; with
    worker.engine.consumer a ``task.multi`` list, with Celery's own consumer one event)."""
    envelope = json.loads(message["data"])
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    events = json.loads(body)
    return [e for e in (events if isinstance(events, list) else [events]) if e.get("type", "").startswith("task-")]


def test_a_worker_sends_no_task_events_until_a_monitor_enables_them(cluster: Cluster, ctx: Any) -> None:
    pubsub = redis.Redis.from_url(BROKER_URL).pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe(f"/{TEST_REDIS_DB}.celeryev/*")  # kombu's fanout channels of this database
    pubsub.get_message(ignore_subscribe_messages=False, timeout=5)
    received: list[dict[str, Any]] = []
    try:
        cluster.start_worker("w1", concurrency=2)
        wait_ready(cluster, "w1")
        two_rounds = scripted_request([{"tool_calls": [{"name": "echo", "args": {"text": "x"}}]}, {"content": "ok"}])
        quiet = client.submit(two_rounds, ctx=ctx).run_id
        assert wait_terminal(ctx.engine, quiet)["status"] == "completed"

        node = node_name("w1")
        replies = broker_app().control.enable_events(reply=True, timeout=10, destination=[node])
        assert replies == [{node: {"ok": "task events enabled"}}]
        heard = client.submit(two_rounds, ctx=ctx).run_id
        assert wait_terminal(ctx.engine, heard)["status"] == "completed"

        def both_rounds_succeeded() -> bool:
            message = pubsub.get_message(timeout=0.2)
            while message is not None:
                if message["type"] == "pmessage":
                    received.extend(_task_events(message))
                message = pubsub.get_message(timeout=0)
            return sum(e["type"] == "task-succeeded" for e in received) >= 2

        wait_until(both_rounds_succeeded, timeout_s=WAIT_S, interval_s=0, what="the second run's task events")
    finally:
        pubsub.close()

    got = [e for e in received if e["type"] == "task-received"]
    # Every round task the worker received was the second run's: none of the first run's.
    assert sorted(e["args"] for e in got) == [f"['{heard}', 0]", f"['{heard}', 1]"], received
    assert str(quiet) not in json.dumps(received)
    succeeded = {e["uuid"] for e in received if e["type"] == "task-succeeded"}
    assert succeeded == {e["uuid"] for e in got}
    assert {e["hostname"] for e in received} == {node}

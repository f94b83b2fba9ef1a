"""The worker's broker transport reuses one Redis client per channel (worker/broker.py)
and still publishes and consumes through a real Redis; it keeps no unacked copies there."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any
from uuid import uuid4

import pytest
import redis
import structlog
from kombu import Queue

from runtime.shares import broker_priority, queue_index
from schema.wire.route import Route
from tests.support.cluster import Cluster, wait_exit, wait_ready
from tests.support.env import BROKER_URL, broker_app
from tests.support.queues import queued_rounds
from tests.support.wait import wait_until
from worker import broker
from worker.app import ROUNDS_QUEUE, RUN_ROUND_TASK, Dispatcher, round_queue


def test_a_channel_reuses_its_redis_client_and_still_moves_messages(redis_clean: None) -> None:
    with broker_app().connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, broker.Channel)
        first = channel._create_client()
        assert channel._create_client() is first  # not rebuilt per operation
        assert first.connection is not None  # one connection of its own, not one per command
        queue = Queue("aidawork.test_broker_client", channel=channel)
        queue.declare()
        with conn.Producer(channel) as producer:
            for i in range(3):
                producer.publish({"i": i}, routing_key=queue.name, serializer="json")
        got = [queue.get(no_ack=True).payload for _ in range(3)]
        queue.delete()
    assert got == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_threads_sharing_a_channels_client_each_get_their_own_replies(redis_clean: None) -> None:
    """The channel's one connection is shared by the round threads that publish on it:
    each command's reply goes to the thread that sent it."""
    with broker_app().connection_for_write() as conn:
        client = conn.default_channel._create_client()
        key = "aidawork.test_broker_client.shared"
        client.delete(key)
        lengths: list[list[int]] = [[] for _ in range(4)]

        def push(mine: list[int], n: int) -> None:
            for i in range(50):
                client.rpush(key, f"{n}:{i}")
                mine.append(int(client.llen(key)))

        threads = [threading.Thread(target=push, args=(lengths[n], n)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        items = [item.decode() for item in client.lrange(key, 0, -1)]
        client.delete(key)
    assert sorted(items) == sorted(f"{n}:{i}" for n in range(4) for i in range(50))
    # Every reply was a list length (never another thread's OK or item), and each
    # thread saw the list grow.
    for mine in lengths:
        assert len(mine) == 50 and mine == sorted(mine) and all(1 <= x <= 200 for x in mine)


def test_a_taken_message_is_kept_in_the_workers_memory_only_and_put_back_when_it_stops(cluster: Cluster) -> None:
    """No ack emulation in Redis (worker.app): a worker holding a message it has not
    acknowledged (a round sent with a countdown, held until its eta) leaves no copy of it
    in Redis, and a graceful stop puts it back in its queue."""
    broker = redis.Redis.from_url(BROKER_URL)
    cluster.start_worker("w1", concurrency=2)
    wait_ready(cluster, "w1")
    args = [str(uuid4()), 0]
    broker_app().send_task(RUN_ROUND_TASK, args=args, queue=round_queue(0), countdown=600)
    wait_until(lambda: queued_rounds(broker) == 0, timeout_s=30, what="the worker to take the message")
    assert not list(broker.scan_iter(match="unacked*")), "an unacked copy was written to Redis"

    cluster.signal("w1", signal.SIGTERM)
    assert wait_exit(cluster, "w1") == 0
    assert queued_rounds(broker) == 1  # put back, not lost and not duplicated
    key = next(broker.scan_iter(match=f"{round_queue(0)}*"))
    body = json.loads(broker.lindex(key, 0))
    assert body["headers"]["task"] == RUN_ROUND_TASK and body["headers"]["argsrepr"] == repr(args)


def _queued_messages(broker: redis.Redis) -> list[dict]:
    return [json.loads(m) for key in broker.scan_iter(match=f"{ROUNDS_QUEUE}.*") for m in broker.lrange(key, 0, -1)]


def test_a_round_is_published_as_celerys_send_task_publishes_it(redis_clean: None) -> None:
    """The dispatcher publishes a round once, on a pooled producer (worker.app): the very
    message ``send_task`` makes, on the same queue and priority step."""
    app = broker_app()
    run_id, route = uuid4(), Route("team-publish", priority=7)
    Dispatcher(app, 4, declare_queues=False).round(run_id, 3, route)
    args = [str(run_id), 3]
    queue = round_queue(queue_index(route, run_id, 3, 4))
    app.send_task(RUN_ROUND_TASK, args=args, queue=queue, priority=broker_priority(7), argsrepr=repr(args),
                  kwargsrepr="{}", declare=[])

    broker = redis.Redis.from_url(BROKER_URL)
    keys = list(broker.scan_iter(match=f"{ROUNDS_QUEUE}.*"))
    assert [k.decode() for k in keys] == [f"{queue}\x06\x16{broker_priority(7)}"]
    ours, celerys = _queued_messages(broker)
    for message in (ours, celerys):
        headers = message["headers"]
        assert headers.pop("root_id") == headers.pop("id") == message["properties"]["correlation_id"]
        headers.pop("origin")
    assert ours["headers"] == celerys["headers"]
    assert ours["headers"]["argsrepr"] == repr(args) and ours["headers"]["parent_id"] is None
    assert ours["body"] == celerys["body"]  # args, no kwargs, no callbacks
    for field in ("priority", "delivery_info", "delivery_mode", "body_encoding"):
        assert ours["properties"][field] == celerys["properties"][field], field


def test_a_publish_that_fails_goes_again_through_send_task_and_its_retries(
    redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = broker_app()
    sends: list[str] = []
    real = app.amqp.send_task_message

    def fails_first(producer: Any, name: str, message: Any, **options: Any) -> Any:
        sends.append(f"retry={options.get('retry')}")
        if len(sends) == 1:
            raise redis.exceptions.ConnectionError("the broker went away mid-publish")
        return real(producer, name, message, **options)

    monkeypatch.setattr(app.amqp, "send_task_message", fails_first)
    run_id = uuid4()
    with structlog.testing.capture_logs() as logs:
        Dispatcher(app, 4, declare_queues=False).round(run_id, 0, Route("team-publish"))
    # The first try without retries; then send_task's, which retries (PUBLISH_RETRY_POLICY).
    assert sends == ["retry=False", "retry=None"]
    assert [(e["event"], e["error"]) for e in logs if e["log_level"] == "warning"] == [
        ("publish_retried", "ConnectionError")
    ]
    (message,) = _queued_messages(redis.Redis.from_url(BROKER_URL))
    assert message["headers"]["argsrepr"] == repr([str(run_id), 0])

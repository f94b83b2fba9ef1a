"""The worker's broker transport reuses one Redis client per channel (worker/engine/broker.py)
and still publishes and consumes through a real Redis; it keeps no unacked copies there;
and under a backlog it takes messages in batches, in the order of one BRPOP each."""

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
from tests.support.env import BROKER_URL, broker_app, stock_broker
from tests.support.queues import queued_rounds
from tests.support.wait import wait_until
from worker.engine import broker
from worker.ops.celery_app import ROUNDS_QUEUE, RUN_ROUND_TASK, Dispatcher, round_queue

# The tests of worker.engine.broker's channel (its client, its batches) through the app's
# connection: with AIDAWORK_STOCK_BROKER the app uses kombu's stock transport, which has
# neither. The batch scripts themselves are tested in both modes (called directly).
ours = pytest.mark.skipif(
    stock_broker(), reason="AIDAWORK_STOCK_BROKER: the app uses kombu's stock Redis transport, not worker.engine.broker"
)


@ours
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


@ours
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
    """No ack emulation in Redis (worker.ops.celery_app): a worker holding a message it has not
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
    """The dispatcher publishes a round once, on a pooled producer (worker.ops.celery_app): the very
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


# Batched intake (worker.engine.broker.Channel._take_more): messages published to three round
# queues at several priorities, taken by a kombu consumer on the worker's transport.
BATCH_QUEUES = [round_queue(i) for i in range(3)]
# (queue index, priority) of each message, in publishing order.
BATCH_MESSAGES = [(0, 0), (0, 9), (0, 5), (0, 0), (0, 9), (0, 0), (1, 5), (1, 5), (1, 0), (2, 9), (2, 0), (2, 0),
                  (2, 5)]


def _take_all(
    prefetch: int, *, ack: bool, expected: int, publish: bool = True, scripts: set[str] | None = None
) -> tuple[list[tuple[int, int]], int, int]:
    """Publish BATCH_MESSAGES (queue index, priority), consume with ``prefetch`` slots
    until ``expected`` arrived and nothing more comes: the (queue, number) pairs in the
    order delivered, how many BRPOPs were sent, and how many messages were left in Redis
    (before the channel closes and puts back what it holds). ``scripts``: given, it gets
    the batch scripts the channel ran (``EVAL LMPOP``, ``EVAL RPOP``)."""
    got: list[tuple[int, int]] = []
    brpops = 0
    original = broker.Channel._brpop_start

    def counted(self: broker.Channel, timeout: float | None = None) -> None:
        nonlocal brpops
        brpops += 1
        original(self, timeout)

    def on_message(body: dict[str, Any], message: Any) -> None:
        got.append((body["queue"], body["n"]))
        if ack:
            message.ack()

    with broker_app().connection_for_write() as conn:
        channel = conn.channel()
        queues = [Queue(name, channel=channel) for name in BATCH_QUEUES]
        with conn.Producer(channel) as producer:
            for n, (q, priority) in enumerate(BATCH_MESSAGES if publish else []):
                producer.publish({"queue": q, "n": n}, routing_key=BATCH_QUEUES[q], priority=priority,
                                 serializer="json")
        broker.Channel._brpop_start = counted  # type: ignore[method-assign]
        try:
            with conn.Consumer(queues, channel=channel, callbacks=[on_message]) as consumer:
                consumer.qos(prefetch_count=prefetch)
                while True:
                    try:
                        conn.drain_events(timeout=0.5 if len(got) >= expected else 10)
                    except TimeoutError:
                        break
        finally:
            broker.Channel._brpop_start = original  # type: ignore[method-assign]
        left = queued_rounds(redis.Redis.from_url(BROKER_URL))
        if scripts is not None:
            scripts.update(command for command, _, _ in channel._packed if command.startswith("EVAL"))
        channel.close()
    return got, brpops, left


@ours
@pytest.mark.parametrize("script", ["EVAL LMPOP", "EVAL RPOP"])
def test_batched_intake_takes_messages_in_the_order_one_brpop_each_takes_them(
    script: str, redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both batch scripts: LMPOP's (Redis >= 7.0) and the RPOP walk it falls back to
    (forced here with the module's switch, as a Redis < 7.0 would)."""
    monkeypatch.setattr(broker, "USE_LMPOP", script == "EVAL LMPOP")
    scripts: set[str] = set()
    batched, batched_brpops, _ = _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES), scripts=scripts)
    assert scripts == {script}
    monkeypatch.setattr(broker, "BATCH_MAX", 0)
    one_by_one, single_brpops, _ = _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES))

    assert sorted(batched) == sorted((q, n) for n, (q, _) in enumerate(BATCH_MESSAGES))  # each once
    assert batched == one_by_one
    assert batched_brpops < len(BATCH_MESSAGES) <= single_brpops
    # What one BRPOP each does: the queues take turns, and within a queue the most urgent
    # step first (step 0), in publishing order within a step.
    assert len({q for q, _ in one_by_one[:3]}) == 3
    for q in range(3):
        mine = [n for queue, n in one_by_one if queue == q]
        assert mine == sorted(mine, key=lambda n: (BATCH_MESSAGES[n][1], n))


@ours
def test_batched_intake_takes_no_more_than_the_free_prefetch_slots(redis_clean: None) -> None:
    got, _, left = _take_all(prefetch=3, ack=False, expected=3)
    assert len(got) == 3
    assert left == len(BATCH_MESSAGES) - 3


@ours
def test_a_batch_whose_delivery_fails_puts_the_rest_back_in_order(
    redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer raising on a batched message (the fourth taken) loses nothing: the
    messages after it are back at the head of their queues, and a later consumer takes
    them in the order it would have."""
    from kombu.transport import virtual

    expected, _, _ = _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES))
    seen = 0
    original = virtual.Transport._deliver

    def fails_on_fourth(self: Any, message: Any, queue: str) -> None:
        nonlocal seen
        seen += 1
        if seen == 4:
            raise RuntimeError("the consumer failed")
        original(self, message, queue)

    monkeypatch.setattr(virtual.Transport, "_deliver", fails_on_fourth)
    with pytest.raises(RuntimeError, match="the consumer failed"):
        _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES))
    monkeypatch.setattr(virtual.Transport, "_deliver", original)
    # The three delivered were acknowledged and the fourth went with its consumer's error
    # (as a message taken by BRPOP would); the rest came back, each queue's in its order.
    rest, _, left = _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES) - 4, publish=False)
    assert left == 0 and sorted(rest) == sorted(expected[4:])
    for q in range(3):
        assert [n for queue, n in rest if queue == q] == [n for queue, n in expected[4:] if queue == q]


@ours
def test_a_server_older_than_redis_7_gets_the_rpop_script(redis_clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel reads the server's version once (INFO server): below LMPOP_SINCE its
    batches walk the keys with RPOP, and take the same order."""
    expected, _, _ = _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES))
    monkeypatch.setattr(broker, "LMPOP_SINCE", (99, 0))  # as if this server were older than LMPOP
    scripts: set[str] = set()
    got, _, _ = _take_all(prefetch=20, ack=True, expected=len(BATCH_MESSAGES), scripts=scripts)
    assert scripts == {"EVAL RPOP"}
    assert got == expected


def test_redis_versions_are_read_as_numbers() -> None:
    assert broker.redis_version("7.0.15") == (7, 0, 15)
    assert broker.redis_version("6.2.14") < broker.LMPOP_SINCE <= broker.redis_version("7.0.0")
    assert broker.redis_version("10.0.1") > broker.LMPOP_SINCE  # numbers, not text
    assert broker.redis_version("") == () < broker.LMPOP_SINCE


def _script_order(client: redis.Redis, script: str, layout: list[list[list[str]]], prefix: str,
                  limit: int) -> tuple[list[tuple[int, bytes]], list[list[list[bytes]]]]:
    """Run a batch script on ``layout`` (per queue, per step, the messages from oldest to
    newest) under keys named ``prefix``: the (key index, message) pairs taken, and what
    every key still holds."""
    steps = len(layout[0])
    keys = [f"{prefix}.{q}.{s}" for q in range(len(layout)) for s in range(steps)]
    for key, messages in zip(keys, [m for queue in layout for m in queue], strict=True):
        client.delete(key)
        if messages:
            client.lpush(key, *messages)  # kombu publishes with LPUSH, BRPOP takes from the right
    taken = client.eval(script, len(keys), *keys, len(layout), steps, limit)
    left = [[client.lrange(keys[q * steps + s], 0, -1)[::-1] for s in range(steps)] for q in range(len(layout))]
    client.delete(*keys)
    return [(int(i), m) for i, m in zip(taken[::2], taken[1::2], strict=True)], left


def test_the_lmpop_script_takes_what_the_rpop_script_takes_in_the_same_order(redis_clean: None) -> None:
    """Random layouts (queues x priority steps, some keys empty, one queue alone holding
    several steps' messages), any limit: the two scripts pop the same messages from the
    same keys in the same order, and leave the same messages behind."""
    import random

    client = redis.Redis.from_url(BROKER_URL)
    rng = random.Random(33)
    alone = 0
    for case in range(300):
        queues, steps = rng.randint(1, 5), rng.randint(1, 4)
        fill = rng.random()
        layout = [[[f"{case}:{q}:{s}:{n}" for n in range(rng.randint(0, 4))] if rng.random() < fill else []
                   for s in range(steps)] for q in range(queues)]
        limit = rng.randint(1, 24)
        rpop = _script_order(client, broker.TAKE_MORE_RPOP_LUA, layout, "aidawork.test.rpop", limit)
        lmpop = _script_order(client, broker.TAKE_MORE_LUA, layout, "aidawork.test.lmpop", limit)
        assert lmpop == rpop, (case, layout, limit)
        alone += sum(1 for queue in layout if any(queue)) == 1 and sum(map(len, layout[0])) > 1
    assert alone > 10  # the COUNT path (one queue left) was exercised

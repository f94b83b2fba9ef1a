"""The worker's broker transport reuses one Redis client per channel (worker/broker.py)
and still publishes and consumes through a real Redis."""

from __future__ import annotations

from kombu import Queue

from tests.support.env import broker_app
from worker import broker


def test_a_channel_reuses_its_redis_client_and_still_moves_messages(redis_clean: None) -> None:
    with broker_app().connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, broker.Channel)
        first = channel._create_client()
        assert channel._create_client() is first  # not rebuilt per operation
        queue = Queue("aidawork.test_broker_client", channel=channel)
        queue.declare()
        with conn.Producer(channel) as producer:
            for i in range(3):
                producer.publish({"i": i}, routing_key=queue.name, serializer="json")
        got = [queue.get(no_ack=True).payload for _ in range(3)]
        queue.delete()
    assert got == [{"i": 0}, {"i": 1}, {"i": 2}]

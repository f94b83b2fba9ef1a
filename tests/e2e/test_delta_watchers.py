"""Deltas are published only while a reader watches (worker.ops.deltas): with nobody
watching a publisher makes no PUBLISH; a reader that subscribes (and announces itself)
gets the deltas from then on; once the readers' key is gone, publishing stops again; a
publisher that missed a reader's notice finds the key on its next read.

What a silent subscriber (one that never announces itself) receives shows whether a
PUBLISH was made: after the publisher has handled a delta (``flush``), the test publishes a
marker on the same channel, so the first message the subscriber gets is the delta if it
was published, the marker if not."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import uuid4

import pytest
import redis
from redis.client import PubSub

from tests.support.env import BROKER_URL
from tests.support.wait import wait_until
from worker.ops import deltas
from worker.ops.deltas import DeltaPublisher, DeltaSubscription, RunDelta, channel

MARKER = b"marker"


@pytest.fixture
def silent(redis_clean: None) -> Iterator[tuple[str, PubSub]]:
    """A run's channel and a subscriber to it that does not announce itself."""
    run = str(uuid4())
    pubsub = redis.Redis.from_url(BROKER_URL).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel(run))
    pubsub.get_message(ignore_subscribe_messages=False, timeout=5)  # the confirmation
    yield run, pubsub
    pubsub.close()


def _published(publisher: DeltaPublisher, run: str, delta: RunDelta, pubsub: PubSub) -> bool:
    """Publish ``delta`` (as a round does), then whether it reached the channel."""
    publisher.publish(run, delta)  # type: ignore[arg-type]  # a UUID's text names the same channel
    publisher.flush(timeout_s=5)
    redis.Redis.from_url(BROKER_URL).publish(channel(run), MARKER)
    message = pubsub.get_message(timeout=5)
    while message is not None and message["type"] != "message":
        message = pubsub.get_message(timeout=5)
    assert message is not None, "not even the marker arrived"
    if message["data"] == MARKER:
        return False
    assert deltas.decode(message["data"]) == delta
    assert pubsub.get_message(timeout=5)["data"] == MARKER  # type: ignore[index]
    return True


def _unwatched_publisher(run: str, pubsub: PubSub) -> DeltaPublisher:
    """A publisher whose first delta, with nobody watching, is dropped."""
    publisher = DeltaPublisher(BROKER_URL)
    assert not _published(publisher, run, RunDelta(0, "nobody"), pubsub)
    return publisher


def test_nobody_watching_no_publish_then_a_reader_gets_the_deltas_until_it_is_gone(
    silent: tuple[str, PubSub], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, pubsub = silent
    publisher = _unwatched_publisher(run, pubsub)
    assert not publisher.watched and publisher.unwatched == 1
    # Dropped on the round's thread now, with no Redis command and nothing to wait for.
    assert not _published(publisher, run, RunDelta(0, "still nobody"), pubsub)
    assert publisher.unwatched == 2

    reader = DeltaSubscription(BROKER_URL, uuid4())  # any run: a reader makes every publisher publish
    try:
        wait_until(lambda: publisher.watched, timeout_s=10, what="the publisher to receive the reader's notice")
        assert _published(publisher, run, RunDelta(1, "watched"), pubsub)
    finally:
        reader.close()
    assert publisher.unwatched == 2

    # The reader gone, its key expires (deleted here); the publisher's next read finds none.
    redis.Redis.from_url(BROKER_URL).delete(deltas.WATCHERS_KEY)
    monkeypatch.setattr(deltas, "WATCH_CHECK_S", 0.0)
    assert not _published(publisher, run, RunDelta(2, "gone"), pubsub)
    assert not publisher.watched


def test_a_publisher_that_missed_the_notice_finds_the_readers_key(
    silent: tuple[str, PubSub], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, pubsub = silent
    publisher = _unwatched_publisher(run, pubsub)
    monkeypatch.setattr(deltas, "WATCH_CHECK_S", 0.0)
    # A reader's key, without its notice (as if the publisher's subscription was down).
    redis.Redis.from_url(BROKER_URL).set(deltas.WATCHERS_KEY, b"1", ex=deltas.WATCH_TTL_S)
    assert not _published(publisher, run, RunDelta(0, "read again"), pubsub)  # dropped, and the key read
    wait_until(lambda: publisher.watched, timeout_s=10, what="the publisher to read the readers' key")
    assert _published(publisher, run, RunDelta(1, "found"), pubsub)


def test_a_reader_keeps_the_key_alive_while_it_reads(redis_clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(BROKER_URL)
    reader = DeltaSubscription(BROKER_URL, uuid4())
    try:
        assert 0 < client.ttl(deltas.WATCHERS_KEY) <= deltas.WATCH_TTL_S
        client.delete(deltas.WATCHERS_KEY)
        monkeypatch.setattr(deltas, "WATCH_REFRESH_S", 0.0)
        assert reader.next(0) is None
        assert client.exists(deltas.WATCHERS_KEY)  # renewed by the read
    finally:
        reader.close()

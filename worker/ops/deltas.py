"""Token deltas: a model call's text as it streams, published live through Redis pub/sub
(the broker's Redis), one channel per run, and never written to PostgreSQL.

- The worker publishes (``DeltaPublisher``, one per process and broker URL): the round's
  thread only puts the delta on a bounded in-memory queue; one daemon thread sends what is
  queued in a pipeline, every ``COALESCE_S`` at most; before its commit a round that
  streamed waits (``FLUSH_S`` at most) until its deltas are sent, so they reach Redis
  before the round's durable events do. A round never waits for Redis, and a Redis error or a full queue
  drops deltas (logged at debug): they are ephemeral, and the durable ``model_responded``
  event carries the whole response anyway.
- A message is JSON ``{"kind", "round", "attempt", "delta"}``; ``kind`` is
  ``model_delta`` or ``model_stream_restarted`` (sent before the first delta of a round
  whose earlier attempt may have streamed: a client discards what it showed of it).
- Only while someone watches: a process publishes deltas only while a reader has said it
  watches (``announce_watcher``): readers keep the key ``WATCHERS_KEY`` alive (a TTL
  refreshed while they read) and, when they subscribe, publish a notice on
  ``watchers_channel`` (one per Redis database), which each publisher receives on a
  subscription of its own, so it publishes from that moment on. A publisher that nobody
  watches drops its deltas without a Redis command; it reads the key (one ``EXISTS``) at
  most once per ``WATCH_CHECK_S`` while its rounds stream, which both stops it publishing
  once the last reader is gone (the key expired) and starts it again if it missed a
  notice (a reconnect). So a round costs no ``PUBLISH`` with nobody watching; a reader
  that arrives mid-round gets that round's deltas from about then on (the durable
  ``model_responded`` carries the whole text anyway).
- Readers (the HTTP API's stream, ``client.events(..., deltas=True)``) keep the order
  they receive, and drop a delta of a round whose ``model_responded`` they have passed on
  already (``DeltaOrder``): deltas are published before the round commits, so this only
  drops the odd delta that lost the race with the durable event it is part of.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, Literal, NotRequired, Protocol, TypedDict
from uuid import UUID

import redis
import structlog
from redis.client import PubSub

from schema.wire.json import JsonMapping
from worker.ops.redis_clients import RedisTarget, sync_client

log = structlog.get_logger("aidawork.deltas")

CHANNEL_PREFIX = "aidawork:deltas:"
CHANNEL_PATTERN = CHANNEL_PREFIX + "*"
MODEL_DELTA: Final = "model_delta"
MODEL_STREAM_RESTARTED: Final = "model_stream_restarted"
QUEUE_LIMIT = 10_000  # deltas waiting for the publisher thread at most; more are dropped
_BATCH = 500
COALESCE_S = 0.005
FLUSH_S = 0.25  # the longest a round waits for its deltas to be sent
# Readers watching (see the module's docstring): a key alive while any reader reads, and a
# channel to say one started. Neither matches CHANNEL_PATTERN.
WATCHERS_KEY = "aidawork:delta-watchers"
WATCH_TTL_S = 10  # the key's life after a reader's last refresh
WATCH_REFRESH_S = 3.0  # a reader refreshes the key this often while it reads
WATCH_CHECK_S = 1.0  # a publisher reads the key at most this often, and only while it has deltas

DeltaKind = Literal["model_delta", "model_stream_restarted"]


class DeltaData(TypedDict):
    """The ``data`` of a delta's SSE message."""

    round: int
    delta: NotRequired[str]  # not in a model_stream_restarted


def channel(run_id: UUID | str) -> str:
    return f"{CHANNEL_PREFIX}{run_id}"


def watchers_channel(db: int) -> str:
    """Where readers of Redis database ``db`` say they started watching (pub/sub channels
    are shared by every database of a server; the key is the database's own)."""
    return f"aidawork:delta-watchers:{db}"


def redis_db(client: object) -> int:
    """The database number a redis-py client (sync or asyncio) was made for."""
    pool = getattr(client, "connection_pool", None)
    return int(getattr(pool, "connection_kwargs", {}).get("db", 0) or 0)


def announce_watcher(client: redis.Redis, *, started: bool) -> None:
    """A reader watches (see the module's docstring): the key's TTL renewed, and when it
    ``started`` (subscribed), the publishers told at once."""
    pipe = client.pipeline(transaction=False)
    pipe.set(WATCHERS_KEY, b"1", ex=WATCH_TTL_S)
    if started:
        pipe.publish(watchers_channel(redis_db(client)), b"1")
    pipe.execute()


@dataclass(frozen=True)
class RunDelta:
    """A piece of a round's model text as it streamed (``kind`` ``model_delta``), or the
    notice that the round's stream starts over (``model_stream_restarted``, no text)."""

    round: int
    delta: str = ""
    kind: DeltaKind = "model_delta"
    attempt: int = 0

    @property
    def restarted(self) -> bool:
        return self.kind == MODEL_STREAM_RESTARTED

    def sse_data(self) -> DeltaData:
        """The ``data`` of its SSE message: ``{"round", "delta"}`` or ``{"round"}``."""
        return {"round": self.round} if self.restarted else {"round": self.round, "delta": self.delta}


def encode(delta: RunDelta) -> str:
    return json.dumps(
        {"kind": delta.kind, "round": delta.round, "attempt": delta.attempt, "delta": delta.delta},
        ensure_ascii=False,
    )


def decode(raw: object) -> RunDelta | None:
    """The delta a message carries, or None for anything else on the channel."""
    if not isinstance(raw, str | bytes | bytearray):  # what json.loads refuses with a TypeError
        return None
    try:
        body = json.loads(raw)
        kind = body["kind"]
        if kind not in (MODEL_DELTA, MODEL_STREAM_RESTARTED):
            return None
        return RunDelta(round=int(body["round"]), delta=str(body.get("delta", "")), kind=kind,
                        attempt=int(body.get("attempt", 0)))
    except (ValueError, TypeError, KeyError):
        return None


class DeltaOrder:
    """What a reader passes on: every delta of a round until the round's
    ``model_responded`` has been passed on, none after it."""

    def __init__(self) -> None:
        self.responded_round = -1

    def responded(self, kind: str, data: JsonMapping) -> None:
        seq = data.get("boundary_seq")
        if kind == "model_responded" and isinstance(seq, int):
            self.responded_round = max(self.responded_round, seq)

    def keeps(self, delta: RunDelta) -> bool:
        return delta.round > self.responded_round


def ends_stream_of(held: list[RunDelta], kind: str, data: JsonMapping) -> bool:
    """Whether this durable event is the response of the round the ``held`` deltas
    stream (or a later one): they go out before it."""
    seq = data.get("boundary_seq")
    return bool(held) and kind == "model_responded" and isinstance(seq, int) and seq >= held[0].round


class DeltaSink(Protocol):
    def publish(self, run_id: UUID, delta: RunDelta) -> None: ...

    def flush(self, timeout_s: float) -> None: ...


class DeltaPublisher:
    """Publishes deltas from any thread without blocking it (see the module docstring)."""

    def __init__(self, where: RedisTarget | str) -> None:
        self._where = RedisTarget.of(where)
        self._redis = sync_client(self._where, socket_timeout=2.0, socket_connect_timeout=2.0)
        # Whether a reader watches: unknown until the key is first read (so the first deltas
        # are queued, and the publisher thread reads it before sending them).
        self.watched = True
        self._checked_at = float("-inf")  # monotonic time of the last read of the key
        self._notices = 0  # watch notices received (a read of the key older than one is stale)
        self._pending: deque[tuple[str, RunDelta]] = deque()  # appends and pops are atomic
        self._waiting = threading.Event()
        self._urgent = threading.Event()  # a flush is waiting: no coalescing
        self._done = threading.Condition()
        self._queued = itertools.count(1)  # next() is atomic: the n-th delta queued
        self._sent = 0  # deltas sent (or failed) by the publisher thread, in queue order
        self._last = 0  # the number of the latest delta queued
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0
        self.unwatched = 0  # deltas not published: nobody watched

    def publish(self, run_id: UUID, delta: RunDelta) -> None:
        if self._thread is None:
            self._start()
        if not self.watched:
            self.unwatched += 1
            if time.monotonic() - self._checked_at >= WATCH_CHECK_S:
                self._waiting.set()  # the publisher thread reads the key again
            return
        if len(self._pending) >= QUEUE_LIMIT:
            self.dropped += 1
            log.debug("model_delta_dropped", reason="queue_full")
            return
        with self._lock:  # numbered in queue order
            self._last = next(self._queued)
            self._pending.append((channel(run_id), delta))
        if not self._waiting.is_set():
            self._waiting.set()

    def flush(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every delta queued so far has been sent: a
        round calls it before it commits, so its deltas go out before its durable events."""
        target = self._last
        if self._sent >= target:
            return
        self._urgent.set()
        with self._done:
            self._done.wait_for(lambda: self._sent >= target, timeout=timeout_s)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                threading.Thread(target=self._listen, name="aidawork-delta-watchers", daemon=True).start()
                self._thread = threading.Thread(target=self._run, name="aidawork-deltas", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._waiting.wait()
            # A few ms of coalescing: one pipeline carries the deltas of every round
            # streaming meanwhile, rather than a wake-up and a round trip for each.
            self._urgent.wait(COALESCE_S)
            self._urgent.clear()
            self._waiting.clear()
            self._check_watched()
            while self._pending:
                batch = [self._pending.popleft() for _ in range(min(_BATCH, len(self._pending)))]
                if self.watched:
                    self._send(batch)
                else:
                    self.unwatched += len(batch)
                with self._done:
                    self._sent += len(batch)
                    self._done.notify_all()

    def _check_watched(self) -> None:
        """Read ``WATCHERS_KEY`` if the last read is ``WATCH_CHECK_S`` old (publisher thread)."""
        now = time.monotonic()
        if now - self._checked_at < WATCH_CHECK_S:
            return
        notices = self._notices
        try:
            watched = bool(self._redis.exists(WATCHERS_KEY))
        except Exception:  # Redis unreachable: publishing fails too, and says so
            watched = True
        self._checked_at = now
        if watched or notices == self._notices:  # no notice came while the key was read
            self.watched = watched

    def _listen(self) -> None:
        """Receive the readers' watch notices (a thread of its own, on one connection)."""
        client = sync_client(self._where, socket_connect_timeout=2.0, socket_keepalive=True)
        name = watchers_channel(redis_db(client))
        while True:
            pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8
            try:
                pubsub.subscribe(name)
                for message in pubsub.listen():  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8
                    if message.get("type") == "message":
                        self._notices += 1
                        self.watched = True
            except Exception as exc:
                log.debug("delta_watchers_listen_failed", error=type(exc).__name__)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()
            time.sleep(1.0)  # then subscribe again; meanwhile the key is read every WATCH_CHECK_S

    def _send(self, batch: list[tuple[str, RunDelta]]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for name, delta in batch:
                pipe.publish(name, encode(delta))
            pipe.execute()
        except Exception as exc:  # ephemeral: a client sees the durable event anyway
            self.dropped += len(batch)
            log.debug("model_delta_publish_failed", deltas=len(batch), error=type(exc).__name__)


_publishers: dict[RedisTarget, DeltaPublisher] = {}
_publishers_lock = threading.Lock()


def publisher_for(where: RedisTarget | str) -> DeltaPublisher:
    """This process's publisher for the broker's Redis ``where`` (one connection pool)."""
    target = RedisTarget.of(where)
    with _publishers_lock:
        found = _publishers.get(target)
        if found is None:
            found = _publishers[target] = DeltaPublisher(target)
        return found


class DeltaSubscription:
    """One reader's subscription to one run's deltas (``client.events(..., deltas=True)``),
    synchronous. Best effort: with Redis unreachable it yields nothing."""

    def __init__(self, where: RedisTarget | str, run_id: UUID, *, ready_timeout_s: float = 2.0) -> None:
        self._client = sync_client(where, socket_connect_timeout=ready_timeout_s)
        self._pubsub: PubSub | None = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8
        self._announced_at = 0.0
        try:
            self._pubsub.subscribe(channel(run_id))
            # The confirmation, then the publishers told: from here on (once they have the
            # notice, a moment later) no delta of the run is missed.
            self._pubsub.get_message(ignore_subscribe_messages=False, timeout=ready_timeout_s)
            announce_watcher(self._client, started=True)
            self._announced_at = time.monotonic()
        except redis.RedisError as exc:
            log.warning("delta_subscription_failed", error=type(exc).__name__)
            self.close()

    def next(self, timeout_s: float) -> RunDelta | None:
        """The next delta received within ``timeout_s`` (0: only one already here)."""
        if self._pubsub is None:
            return None
        if time.monotonic() - self._announced_at >= WATCH_REFRESH_S:
            try:
                announce_watcher(self._client, started=False)
            except redis.RedisError as exc:
                log.warning("delta_subscription_failed", error=type(exc).__name__)
            self._announced_at = time.monotonic()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            except redis.RedisError as exc:
                log.warning("delta_subscription_failed", error=type(exc).__name__)
                self.close()
                return None
            if message is not None and message.get("type") == "message":
                found = decode(message["data"])
                if found is not None:
                    return found
            if time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
                self._client.close()
            except redis.RedisError:
                pass
            self._pubsub = None

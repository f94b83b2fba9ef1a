"""Live token deltas for the open event streams of one API process (``worker.ops.deltas``).

One Redis pub/sub connection per process, pattern-subscribed to every run's delta
channel, read by one asyncio task while at least one stream is open; each message goes
to the listeners of its run, and is dropped when no stream of this process follows that
run. A pattern subscription keeps this simple and correct (no subscribe / unsubscribe
racing the reader); the price is that an API process with any stream open receives the
deltas of every running run, which is small next to the durable event reads.

The workers publish deltas only while a reader watches (``worker.ops.deltas``): while it
has listeners, the reader says so when it subscribes and every ``WATCH_REFRESH_S``
(``announce``).

Deltas are best effort: with Redis unreachable a stream carries its durable events only,
and the reader retries the connection every ``RETRY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import structlog

from worker.ops.deltas import (
    CHANNEL_PATTERN,
    CHANNEL_PREFIX,
    WATCH_REFRESH_S,
    WATCH_TTL_S,
    WATCHERS_KEY,
    RunDelta,
    decode,
    redis_db,
    watchers_channel,
)
from worker.ops.redis_clients import RedisTarget, async_client

log = structlog.get_logger("aidawork.api")

LISTENER_LIMIT = 1000  # deltas a stream holds for a slow client; more are dropped
RETRY_S = 1.0
READY_WAIT_S = 1.0  # a stream that starts the reader waits this long for its subscription


async def announce(client: Any, *, started: bool) -> None:
    """``worker.ops.deltas.announce_watcher`` on an asyncio client: this process watches."""
    pipe = client.pipeline(transaction=False)
    pipe.set(WATCHERS_KEY, b"1", ex=WATCH_TTL_S)
    if started:
        pipe.publish(watchers_channel(redis_db(client)), b"1")
    await pipe.execute()


@dataclass(eq=False)
class DeltaListener:
    """One open stream's deltas, in the order received. ``wake`` is set on each one (the
    stream waits on it together with its durable events)."""

    run_id: str
    wake: asyncio.Event
    pending: asyncio.Queue[RunDelta] = field(default_factory=lambda: asyncio.Queue(LISTENER_LIMIT))

    def deliver(self, delta: RunDelta) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.pending.put_nowait(delta)
        self.wake.set()

    def drain(self) -> list[RunDelta]:
        out = []
        while not self.pending.empty():
            out.append(self.pending.get_nowait())
        return out


class DeltaHub:
    def __init__(self, where: RedisTarget | None) -> None:
        self._where = where
        self._listeners: dict[str, set[DeltaListener]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._down = False  # the last connection attempt failed: new streams do not wait

    async def join(self, run_id: UUID, wake: asyncio.Event) -> DeltaListener | None:
        """Follow ``run_id``'s deltas from now on; None when this process has no broker."""
        if self._where is None:
            return None
        listener = DeltaListener(str(run_id), wake)
        self._listeners.setdefault(listener.run_id, set()).add(listener)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._ready = asyncio.Event()
            self._task = loop.create_task(self._run(self._where), name="aidawork-delta-hub")
        if not self._down:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(READY_WAIT_S):
                    await self._ready.wait()  # so the stream misses no delta sent from now on
        return listener

    def leave(self, listener: DeltaListener | None) -> None:
        if listener is None:
            return
        found = self._listeners.get(listener.run_id)
        if found is not None:
            found.discard(listener)
            if not found:
                del self._listeners[listener.run_id]

    def _dispatch(self, message: Mapping[str, object]) -> None:
        name = message.get("channel")
        name = name.decode() if isinstance(name, bytes) else str(name)
        listeners = self._listeners.get(name.removeprefix(CHANNEL_PREFIX))
        if not listeners:
            return
        delta = decode(message["data"])
        if delta is not None:
            for listener in listeners:
                listener.deliver(delta)

    async def _run(self, where: RedisTarget) -> None:
        while self._listeners:
            client = async_client(where, socket_connect_timeout=2.0)
            pubsub = client.pubsub()
            announced_at: float | None = None  # subscribed, and the workers told (loop time)
            loop = asyncio.get_running_loop()
            try:
                await pubsub.psubscribe(CHANNEL_PATTERN)
                while self._listeners:
                    if announced_at is not None and loop.time() - announced_at >= WATCH_REFRESH_S:
                        await announce(client, started=False)
                        announced_at = loop.time()
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "psubscribe":
                        await announce(client, started=True)
                        announced_at = loop.time()
                        self._down = False
                        self._ready.set()
                    elif message["type"] == "pmessage":
                        self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._down, self._ready = True, asyncio.Event()
                log.warning("delta_subscription_failed", error=type(exc).__name__)
                await asyncio.sleep(RETRY_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8
                    await client.aclose()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

"""Event streams of the HTTP API (server-sent events): the wire format, the
``Last-Event-ID`` a client resumes from, one poller per API process for every open
stream, and the per-token cap on open streams.

A stream does not poll PostgreSQL itself. It subscribes to the ``EventHub`` with its run,
owner and cursor (the last seq it has sent); one asyncio task reads the tails of all
waiting subscribers in one query per tick (``owners.read_event_tails``) and hands each
its page. A subscriber is read for again only once its stream has taken the previous
page, so a slow client holds at most one page and costs no queries meanwhile. Each
subscriber keeps its own cursor, so a stream resumed from Last-Event-ID gets exactly the
events after it, whatever other streams of the same run are doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import structlog
from sqlalchemy.exc import OperationalError
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from schema.store.owners import EventTail, TailKey
from schema.wire import TERMINAL_EVENTS, RunEvent
from schema.wire.errors import ErrorCode
from worker.api.deltas import DeltaListener
from worker.api.errors import ApiError
from worker.ops.deltas import DeltaOrder, RunDelta, ends_stream_of

log = structlog.get_logger("aidawork.api")

TailReader = Callable[[Sequence[TailKey]], Mapping[TailKey, EventTail]]
PAGE_EVENTS = 500  # events per subscriber per tick at most
KEEPALIVE = ": keepalive\n\n"
_GONE = EventTail(events=[], ended=True)  # the run is not there (for this owner): the stream ends


# ASCII digits only (seq is a 32-bit column), blanks around it ignored; the OpenAPI
# document states the same pattern.
LAST_EVENT_ID_PATTERN = r"^\s*([0-9]{1,9})?\s*$"
_LAST_EVENT_ID = re.compile(LAST_EVENT_ID_PATTERN)


def parse_last_event_id(raw: str | None) -> int:
    found = None if raw is None else _LAST_EVENT_ID.fullmatch(raw)
    if raw is not None and found is None:
        raise ApiError(
            400, ErrorCode.REQUEST_INVALID, f"Last-Event-ID must be an event seq (got {raw[:40]!r})", "Last-Event-ID"
        )
    return int(found.group(1)) if found and found.group(1) else 0


def format_sse(event: RunEvent) -> str:
    """One SSE message. The JSON has no raw newlines (they are escaped inside strings),
    so ``data`` is a single line."""
    return f"id: {event.seq}\nevent: {event.kind.value}\ndata: {event.model_dump_json()}\n\n"


def format_delta_sse(delta: RunDelta) -> str:
    """A live delta as an SSE message with no ``id``: it is not part of the durable
    sequence, so a client's Last-Event-ID stays the last durable event it saw."""
    return f"event: {delta.kind}\ndata: {json.dumps(delta.sse_data(), ensure_ascii=False)}\n\n"


@dataclass(eq=False)
class Subscription:
    """One open stream's place in the hub. ``page`` is what the poller handed over and
    the stream has not taken yet; ``None`` in it means the read failed."""

    key: TailKey
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    page: EventTail | None = None
    failed: bool = False
    # Set with ``ready`` and by each live delta: what the stream waits on.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    want_read: bool = False  # the stream asked for a read now (``EventHub.read_soon``)
    fresh_read: bool = False  # ... and it has happened

    @property
    def waiting(self) -> bool:
        return not self.ready.is_set()

    def hand(self, page: EventTail | None) -> None:
        if page is None:
            self.failed = True
        else:
            self.page = page
            if page.events:
                self.key = self.key._replace(after_seq=page.events[-1].seq)
        self.ready.set()
        self.wake.set()


class EventHub:
    """Fans the tails of ``run_events`` out to every open stream of this process, with
    one read per tick for all of them. The poller task runs only while someone listens."""

    def __init__(self, read: TailReader, *, poll_s: float, page_events: int = PAGE_EVENTS) -> None:
        self._read, self.poll_s, self.page_events = read, poll_s, page_events
        self._subscribers: set[Subscription] = set()
        self._wake = asyncio.Event()
        self._polling = asyncio.Lock()  # one read at a time: a page is for the cursor it was read at
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, key: TailKey, wake: asyncio.Event | None = None) -> Subscription:
        """Start following ``key``; its first read happens at once. ``wake``: the event
        the stream waits on (shared with its live deltas)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            # Bound to this loop (tests run one loop per request).
            self._wake, self._polling = asyncio.Event(), asyncio.Lock()
            self._task = loop.create_task(self._run(), name="aidawork-event-hub")
        sub = Subscription(key) if wake is None else Subscription(key, wake=wake)
        self._subscribers.add(sub)
        self._wake.set()
        return sub

    def read_soon(self, sub: Subscription) -> None:
        """Read for ``sub`` now rather than at the next tick; ``sub.fresh_read`` says when
        that read has happened, whether or not it found events."""
        sub.want_read = True
        self._wake.set()

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    async def take(self, sub: Subscription) -> EventTail | None:
        """Wait for the next page handed to ``sub``; ``None``: the read failed."""
        await sub.ready.wait()
        if sub.failed:
            return None
        page, sub.page = sub.page, None
        sub.ready.clear()
        assert page is not None  # ready and not failed: a page was handed over
        if len(page.events) >= self.page_events:
            self._wake.set()  # a full page: the rest is there already, read it without waiting
        return page

    async def poll_once(self) -> None:
        """One tick: one read for every subscriber that is waiting for events."""
        async with self._polling:
            waiting = [(sub, sub.key) for sub in self._subscribers if sub.waiting]
            if not waiting:
                return
            tails = await self._read_tails(list(dict.fromkeys(key for _, key in waiting)))
            for sub, key in waiting:
                if sub not in self._subscribers:
                    continue  # its stream ended during the read
                if tails is None:
                    sub.hand(None)
                    continue
                tail = tails.get(key, _GONE)
                if tail.events or tail.ended:
                    sub.hand(tail)
                if sub.want_read:
                    sub.want_read, sub.fresh_read = False, True
                    sub.wake.set()

    async def _read_tails(self, keys: list[TailKey]) -> Mapping[TailKey, EventTail] | None:
        """The tails of ``keys`` (read in a worker thread), or ``None`` when the read failed."""
        try:
            # asyncio's executor, not anyio's: this task is not an anyio task, and a
            # cancelled read (shutdown) must not wait for the thread.
            return await asyncio.to_thread(self._read, keys)
        except OperationalError as exc:  # the clients reconnect with Last-Event-ID
            log.warning("event_poll_failed", keys=len(keys), error=str(exc.orig))
        except Exception:
            log.exception("event_poll_failed", keys=len(keys))
        return None

    async def _run(self) -> None:
        while self._subscribers:
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation
            # that arrives as the wake-up does, and the task would outlive close().
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.poll_once()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class DeltaGate:
    """The order of a stream's live deltas against its durable events. A delta of a
    round that has not streamed yet is held until the durable events committed before it
    (the end of the previous round) have been read and sent: one extra read per round
    that streams, asked for at once rather than at the next tick. A delta of a round whose
    ``model_responded`` has been sent is dropped (``DeltaOrder``)."""

    def __init__(self) -> None:
        self.order = DeltaOrder()
        self.streaming: int | None = None
        self.held: list[RunDelta] = []

    def admit(self, deltas: Sequence[RunDelta]) -> tuple[list[RunDelta], bool]:
        """What to send now, and whether a read must come first for what is held now."""
        now, asked = [], False
        for delta in deltas:
            if not self.held and delta.round != self.streaming:
                self.streaming, asked = delta.round, True
            if self.held or asked:
                self.held.append(delta)
            elif self.order.keeps(delta):
                now.append(delta)
        return now, asked

    def release(self) -> list[RunDelta]:
        out = [d for d in self.held if self.order.keeps(d)]
        self.held = []
        return out


def page_text(page: EventTail, gate: DeltaGate) -> tuple[list[str], bool]:
    """A page of durable events as SSE text (held deltas go out before their round's
    response), and whether the stream ends with it."""
    out = []
    for event in page.events:
        if ends_stream_of(gate.held, event.kind, event.data):
            out += [format_delta_sse(delta) for delta in gate.release()]
        out.append(format_sse(event))
        gate.order.responded(event.kind, event.data)
        if event.kind in TERMINAL_EVENTS:
            return out, True
    return out, page.ended and not page.events  # ended: its terminal event was at or before the cursor


async def follow(
    hub: EventHub,
    sub: Subscription,
    *,
    keepalive_s: float,
    disconnected: Callable[[], Awaitable[bool]] | None = None,
    deltas: DeltaListener | None = None,
) -> AsyncIterator[str]:
    """The SSE text of ``sub``'s run from its cursor until its terminal event, with a
    keepalive comment after ``keepalive_s`` without events. ``disconnected`` is asked at
    each keepalive: Starlette watches for a disconnect itself only below ASGI spec 2.4.

    With ``deltas``, the live deltas are sent between the durable events in the order
    ``DeltaGate`` keeps."""
    gate = DeltaGate()
    while True:
        with anyio.move_on_after(min(keepalive_s, 2 * hub.poll_s) if gate.held else keepalive_s) as quiet:
            await sub.wake.wait()
        sub.wake.clear()
        now, asked = gate.admit(deltas.drain() if deltas is not None else ())
        for delta in now:
            yield format_delta_sse(delta)
        if asked:
            hub.read_soon(sub)
        fresh, sub.fresh_read = sub.fresh_read, False
        if sub.ready.is_set():
            page = await hub.take(sub)
            if page is None:
                return  # the read failed; the client reconnects with Last-Event-ID
            text, ended = page_text(page, gate)
            for message in text:
                yield message
            if ended:
                return
            fresh = True
        if gate.held and (fresh or quiet.cancelled_caught):
            for delta in gate.release():  # read since they came (or the read is late)
                yield format_delta_sse(delta)
        elif quiet.cancelled_caught:
            if disconnected is not None and await disconnected():
                return
            yield KEEPALIVE


class EventStreamResponse(StreamingResponse):
    """An SSE stream that leaves the hub and calls ``release`` (its stream slot) when it
    ends, however it ends: run over, client gone, server shutting down."""

    def __init__(
        self,
        hub: EventHub,
        sub: Subscription,
        *,
        release: Callable[[], None],
        keepalive_s: float,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
        deltas: DeltaListener | None = None,
    ) -> None:
        self._hub, self._sub, self._release = hub, sub, release
        stream = follow(hub, sub, keepalive_s=keepalive_s, disconnected=disconnected, deltas=deltas)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(stream, media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._hub.unsubscribe(self._sub)
            self._release()


class StreamSlots:
    """Open event streams per token (by digest), at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[bytes, int] = {}

    def acquire(self, token_digest: bytes) -> bool:
        held = self._open.get(token_digest, 0)
        if held >= self.limit:
            return False
        self._open[token_digest] = held + 1
        return True

    def release(self, token_digest: bytes) -> None:
        held = self._open.get(token_digest, 0) - 1
        if held > 0:
            self._open[token_digest] = held
        else:
            self._open.pop(token_digest, None)

    def held(self, token_digest: bytes) -> int:
        return self._open.get(token_digest, 0)

"""The event hub without a database: one read per tick for every waiting stream, each
stream from its own cursor, a slow stream not read for until it has taken its page, a
failed read ending the streams, and the per-token stream slots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import anyio
from sqlalchemy.exc import OperationalError

from schema.store.owners import EventTail, TailKey
from schema.wire import RunEvent
from worker.api.streams import KEEPALIVE, EventHub, StreamSlots, follow

OWNER = "team-a"


class FakeStore:
    """run_events in memory; records every read (the keys it was asked for)."""

    def __init__(self) -> None:
        self.events: dict[UUID, list[RunEvent]] = {}
        self.ended: set[UUID] = set()
        self.reads: list[list[TailKey]] = []
        self.fail = False

    def add_run(self) -> UUID:
        run_id = uuid4()
        self.events[run_id] = []
        self.append(run_id, "run_queued")
        return run_id

    def append(self, run_id: UUID, kind: str, data: dict[str, Any] | None = None) -> None:
        seq = len(self.events[run_id]) + 1
        event = RunEvent(run_id=run_id, seq=seq, kind=kind, data=data or {}, created_at=datetime.now(UTC))
        self.events[run_id].append(event)
        if kind in ("run_completed", "run_failed", "run_cancelled"):
            self.ended.add(run_id)

    def read(self, keys: Sequence[TailKey]) -> Mapping[TailKey, EventTail]:
        self.reads.append(list(keys))
        if self.fail:
            raise OperationalError("SELECT", {}, Exception("connection refused"))
        return {
            key: EventTail([e for e in self.events[key.run_id] if e.seq > key.after_seq], key.run_id in self.ended)
            for key in keys
            if key.run_id in self.events and key.owner == OWNER
        }


def run(fn: Any) -> Any:
    return anyio.run(fn)


def test_many_streams_share_one_read_per_tick() -> None:
    store = FakeStore()
    runs = [store.add_run() for _ in range(10)]

    async def go() -> None:
        hub = EventHub(store.read, poll_s=3600)  # ticks below: the first wake-up, then by hand
        subs = [hub.subscribe(TailKey(r, OWNER, 0)) for r in runs for _ in range(3)]
        with anyio.fail_after(5):
            pages = [await hub.take(sub) for sub in subs]
        assert all(p is not None and [e.kind.value for e in p.events] == ["run_queued"] for p in pages)
        assert len(store.reads) == 1
        assert sorted(store.reads[0]) == sorted(TailKey(r, OWNER, 0) for r in runs)  # 30 streams, 10 keys

        for r in runs[:4]:
            store.append(r, "run_cancelled")
        await hub.poll_once()
        assert len(store.reads) == 2 and sorted(store.reads[1]) == sorted(TailKey(r, OWNER, 1) for r in runs)
        assert sum(not sub.waiting for sub in subs) == 12  # the 3 streams of each of the 4 ended runs
        await hub.close()

    run(go)


def test_each_stream_resumes_from_its_own_cursor() -> None:
    store = FakeStore()
    run_id = store.add_run()
    for kind in ("model_responded", "tool_completed", "model_responded", "run_completed"):
        store.append(run_id, kind)

    async def go() -> list[list[str]]:
        hub = EventHub(store.read, poll_s=0.01)

        async def stream(after_seq: int) -> list[str]:
            sub = hub.subscribe(TailKey(run_id, OWNER, after_seq))
            try:
                return [chunk async for chunk in follow(hub, sub, keepalive_s=60)]
            finally:
                hub.unsubscribe(sub)

        out: list[list[str]] = [[], [], []]

        async def into(i: int, after_seq: int) -> None:
            out[i] = await stream(after_seq)

        async with anyio.create_task_group() as tg:
            for i, after_seq in enumerate((0, 3, 5)):
                tg.start_soon(into, i, after_seq)
        return out

    from_start, from_three, after_end = run(go)
    assert [line.split("\n")[0] for line in from_start] == [f"id: {n}" for n in range(1, 6)]
    assert [line.split("\n")[0] for line in from_three] == ["id: 4", "id: 5"]
    assert after_end == []  # the terminal event was at the cursor: an empty stream that ends


def test_a_stream_that_has_not_taken_its_page_is_not_read_for() -> None:
    store = FakeStore()
    slow_run, fast_run = store.add_run(), store.add_run()

    async def go() -> None:
        hub = EventHub(store.read, poll_s=3600)
        slow = hub.subscribe(TailKey(slow_run, OWNER, 0))
        fast = hub.subscribe(TailKey(fast_run, OWNER, 0))
        with anyio.fail_after(5):
            await hub.take(fast)  # the slow client has not taken its page
        store.append(slow_run, "model_responded")
        await hub.poll_once()
        assert store.reads[1] == [TailKey(fast_run, OWNER, 1)]
        page = await hub.take(slow)
        assert page is not None and [e.seq for e in page.events] == [1]  # its first page, nothing lost
        await hub.close()

    run(go)


def test_a_failed_read_ends_the_waiting_streams() -> None:
    store = FakeStore()
    run_id = store.add_run()
    store.fail = True

    async def go() -> list[str]:
        hub = EventHub(store.read, poll_s=0.01)
        sub = hub.subscribe(TailKey(run_id, OWNER, 0))
        return [chunk async for chunk in follow(hub, sub, keepalive_s=60)]

    assert run(go) == []  # ends: the client reconnects with Last-Event-ID


def test_a_run_that_is_not_there_for_the_owner_ends_the_stream() -> None:
    store = FakeStore()
    run_id = store.add_run()

    async def go() -> list[str]:
        hub = EventHub(store.read, poll_s=0.01)
        sub = hub.subscribe(TailKey(run_id, "team-b", 0))
        return [chunk async for chunk in follow(hub, sub, keepalive_s=60)]

    assert run(go) == []


def test_a_quiet_stream_gets_keepalives_and_the_poller_stops_with_its_last_stream() -> None:
    store = FakeStore()
    run_id = store.add_run()

    async def go() -> None:
        hub = EventHub(store.read, poll_s=0.01)
        sub = hub.subscribe(TailKey(run_id, OWNER, 1))
        chunks = follow(hub, sub, keepalive_s=0.05)
        assert await chunks.__anext__() == KEEPALIVE
        assert hub._task is not None and not hub._task.done()
        await chunks.aclose()
        hub.unsubscribe(sub)
        with anyio.fail_after(5):
            while not hub._task.done():
                await anyio.sleep(0.01)
        reads = len(store.reads)
        await anyio.sleep(0.05)
        assert len(store.reads) == reads  # no stream, no reads

    run(go)


def test_stream_slots_are_counted_per_token() -> None:
    slots = StreamSlots(limit=2)
    a, b = b"a" * 32, b"b" * 32

    assert slots.acquire(a) and slots.acquire(a) and not slots.acquire(a)
    assert slots.acquire(b)
    slots.release(a)
    assert slots.held(a) == 1 and slots.acquire(a)
    for _ in range(2):
        slots.release(a)
    assert slots.held(a) == 0 and slots.held(b) == 1


def test_a_full_page_is_followed_by_the_next_at_once() -> None:
    page_events = 2
    store = FakeStore()
    run_id = store.add_run()
    for _ in range(4):
        store.append(run_id, "model_responded")
    store.append(run_id, "run_completed")

    def paged(keys: Sequence[TailKey]) -> Mapping[TailKey, EventTail]:
        tails = store.read(keys)
        return {k: EventTail(t.events[:page_events], t.ended) for k, t in tails.items()}

    async def go() -> list[str]:
        hub = EventHub(paged, poll_s=3600, page_events=page_events)  # only wake-ups can tick
        sub = hub.subscribe(TailKey(run_id, OWNER, 0))
        with anyio.fail_after(5):
            return [chunk async for chunk in follow(hub, sub, keepalive_s=3600)]

    assert [c.split("\n")[0] for c in run(go)] == [f"id: {n}" for n in range(1, 7)]

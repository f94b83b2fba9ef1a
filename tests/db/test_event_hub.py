"""The API's event hub on a real PostgreSQL: however many streams are open, each tick is
one statement for all of them (counted on the hub's own engine), every stream still gets
its events in order and ends with its run, and another owner's stream ends at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from sqlalchemy import Engine, event

from schema.store import owners as owner_store
from schema.store import runs as run_store
from schema.store.owners import EventTail, TailKey
from schema.store.tx import make_engine
from tests.support.store import submit
from worker.api.streams import EventHub, follow

RUNS, STREAMS_PER_RUN, QUIET_TICKS = 20, 3, 5


def test_many_streams_cost_one_statement_per_tick(engine: Engine, db_url: str) -> None:
    runs = [submit(engine, owner="team-a").run_id for _ in range(RUNS)]
    hub_engine = make_engine(db_url, pool_size=2)
    statements: list[str] = []
    reads: list[Sequence[TailKey]] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    def read(keys: Sequence[TailKey]) -> Mapping[TailKey, EventTail]:
        reads.append(keys)
        return owner_store.read_event_tails(hub_engine, keys)

    event.listen(hub_engine, "before_cursor_execute", count)
    hub = EventHub(read, poll_s=0.01)
    streams: dict[int, list[str]] = {}

    async def stream(i: int, key: TailKey) -> None:
        sub = hub.subscribe(key)
        streams[i] = []
        try:
            async for chunk in follow(hub, sub, keepalive_s=3600):
                streams[i].append(chunk.split("\n")[1])  # "event: <kind>"
        finally:
            hub.unsubscribe(sub)

    async def until(predicate: Any) -> None:
        with anyio.fail_after(30):
            while not predicate():
                await anyio.sleep(0.01)

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:
            for i, run_id in enumerate(runs * STREAMS_PER_RUN):
                tg.start_soon(stream, i, TailKey(run_id, "team-a", 0))
            tg.start_soon(stream, -1, TailKey(runs[0], "team-b", 0))  # not theirs: ends at once
            await until(lambda: all(streams.get(i) for i in range(RUNS * STREAMS_PER_RUN)))  # run_queued each
            quiet_from = len(reads)
            await until(lambda: len(reads) >= quiet_from + QUIET_TICKS)
            quiet = reads[quiet_from + 1 : quiet_from + QUIET_TICKS]
            # Every quiet tick reads every open stream's tail, 3 streams of a run sharing one key.
            assert all(sorted(k.run_id for k in keys) == sorted(runs) for keys in quiet)
            for run_id in runs:
                await anyio.to_thread.run_sync(run_store.cancel_run, engine, run_id)

    anyio.run(scenario)
    hub_engine.dispose()

    assert len(statements) == len(reads)  # one statement per tick, for 61 streams
    assert streams.pop(-1) == []
    assert all(kinds == ["event: run_queued", "event: run_cancelled"] for kinds in streams.values())

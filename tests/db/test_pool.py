"""Each process's connection pool is sized from the concurrency it runs with, capped, and
threads wait for a connection instead of failing ("too many clients")."""

from __future__ import annotations

import threading

from sqlalchemy import text

from schema.store.tx import make_engine
from tests.support.env import BROKER_URL
from worker.engine.bootstrap import build_context, pool_size_for
from worker.ops.settings import Settings


def test_the_pool_follows_the_threads_and_stops_at_the_cap() -> None:
    assert [pool_size_for(t, 20) for t in (1, 4, 18, 64, 512)] == [3, 6, 20, 20, 20]
    assert pool_size_for(4, 2) == 2


def test_a_context_sizes_its_pool_from_the_threads_it_is_given(db_url: str) -> None:
    settings = Settings(database_url=db_url, broker_url=BROKER_URL, worker_concurrency=4, database_pool_max=12)
    for threads, expected in ((None, 6), (64, 12), (2, 4)):
        ctx = build_context(settings, threads)
        try:
            assert ctx.engine.pool.size() == expected  # type: ignore[attr-defined]
        finally:
            ctx.engine.dispose()


def test_threads_beyond_the_pool_wait_for_a_connection_and_all_succeed(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=2, pool_timeout_s=60)
    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            with engine.connect() as conn:
                value = conn.execute(text("SELECT :i FROM pg_sleep(0.05)"), {"i": i}).scalar_one()
            with lock:
                results.append(value)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert sorted(results) == list(range(16))
        assert engine.pool.checkedout() == 0 and engine.pool.size() == 2  # type: ignore[attr-defined]
    finally:
        engine.dispose()

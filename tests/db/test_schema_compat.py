"""Compatibility levels against a real PostgreSQL (``schema.store.compat``): a worker registers
with its code level and is refused, writing nothing, once the schema needs a higher one; only
live workers of a lower level block a breaking migration; a lease keeper whose level is raised
under it refuses every claim from then on and says so once."""

from __future__ import annotations

from uuid import uuid4

import pytest
from sqlalchemy import Engine, text

from schema.store import workers as worker_store
from schema.store.compat import CODE_LEVEL, SchemaIncompatible, live_workers_below_txn, raise_level_sql
from tests.support.db import rows
from worker.engine.leases import LeaseKeeper


def raise_schema_level(engine: Engine, level: int) -> None:
    with engine.begin() as conn:
        conn.execute(text(raise_level_sql(level)))


def test_the_migrated_schema_needs_level_1_and_a_worker_records_its_level(engine: Engine) -> None:
    assert rows(engine, "SELECT min_code_level, revision FROM schema_compat") == [
        {"min_code_level": 1, "revision": "0021"}
    ]
    worker_store.register_worker(engine, "w")
    assert rows(engine, "SELECT name, code_level FROM workers") == [{"name": "w", "code_level": CODE_LEVEL}]


def test_a_worker_older_than_the_schema_is_refused_and_not_registered(engine: Engine) -> None:
    raise_schema_level(engine, CODE_LEVEL + 1)
    with pytest.raises(SchemaIncompatible) as refused:
        worker_store.register_worker(engine, "old")
    assert (refused.value.code_level, refused.value.schema_level) == (CODE_LEVEL, CODE_LEVEL + 1)
    assert refused.value.retryable  # a round it was sent is for a newer worker
    assert rows(engine, "SELECT name FROM workers") == []
    worker_store.register_worker(engine, "new", code_level=CODE_LEVEL + 1)
    assert rows(engine, "SELECT name FROM workers") == [{"name": "new"}]


def test_a_level_is_never_lowered_by_a_later_migration(engine: Engine) -> None:
    raise_schema_level(engine, CODE_LEVEL + 2)
    raise_schema_level(engine, CODE_LEVEL + 1)
    assert rows(engine, "SELECT min_code_level FROM schema_compat") == [{"min_code_level": CODE_LEVEL + 2}]


def test_only_live_workers_of_a_lower_level_block_a_breaking_migration(engine: Engine) -> None:
    worker_store.register_worker(engine, "live-old")
    stopped = worker_store.register_worker(engine, "stopped-old")
    worker_store.stop_worker(engine, stopped)
    dead = worker_store.register_worker(engine, "dead-old")
    worker_store.register_worker(engine, "live-new", code_level=CODE_LEVEL + 1)
    with engine.begin() as conn:
        conn.execute(text("UPDATE workers SET heartbeat_at = now() - interval '120 seconds' WHERE id = :id"),
                     {"id": dead})
        # Registered by a release before levels existed: no level, read as 0.
        conn.execute(text("INSERT INTO workers (id, name) VALUES (:id, 'live-unknown')"), {"id": uuid4()})
    with engine.connect() as conn:
        below = live_workers_below_txn(conn, CODE_LEVEL + 1, live_s=60)
        assert [(w.name, w.code_level) for w in below] == [("live-old", CODE_LEVEL), ("live-unknown", 0)]
        assert live_workers_below_txn(conn, CODE_LEVEL, live_s=60) == [below[1]]


def test_a_lease_keeper_refuses_claims_once_the_level_is_raised_under_it(engine: Engine) -> None:
    keeper = LeaseKeeper(engine, lease_s=30, interval_s=3600)  # no beats of its own during the test
    told: list[str] = []
    keeper.on_incompatible(lambda: told.append("stop"))
    worker_id = keeper.register()
    keeper.check_schema_level()
    assert keeper.worker_id == worker_id and told == []

    raise_schema_level(engine, CODE_LEVEL + 1)
    keeper.check_schema_level()
    with pytest.raises(SchemaIncompatible) as refused:
        _ = keeper.worker_id  # what every claim names as its holder
    assert refused.value.schema_level == CODE_LEVEL + 1
    keeper.check_schema_level()
    assert told == ["stop"]  # once
    keeper.stop()

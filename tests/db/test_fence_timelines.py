"""Fences are unique across PostgreSQL timelines (``schema.store.claims.next_fence_sql``):
after a promotion every fence the new primary issues exceeds any the old one issued, so
the holder of a claim lost with the old primary's unreplicated WAL never matches again.
The promotion itself is exercised in tests/e2e/test_postgres_failover.py."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from runtime.prepare import prepare_execution
from schema.store import runs as run_store
from schema.store.claims import TIMELINE_SQL, next_fence_sql
from tests.support.requests import scripted_request
from tests.support.store import RUNTIME, claim, expire_lease


def _next(engine: Engine, fence: int, timeline: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT {next_fence_sql(':fence', ':timeline')}"),
                                {"fence": fence, "timeline": timeline}).scalar_one())


@pytest.mark.parametrize(("fence", "timeline", "expected"), [
    (0, 1, 1), (41, 1, 42),  # timeline 1: plain fence + 1
    (41, 2, 1 << 40), ((1 << 40) + 7, 2, (1 << 40) + 8),  # timeline 2: above anything timeline 1 issued
    ((1 << 40) + 7, 3, 2 << 40),
])
def test_the_next_fence_is_above_every_fence_of_earlier_timelines(
    engine: Engine, fence: int, timeline: int, expected: int
) -> None:
    assert _next(engine, fence, timeline) == expected


def test_the_timeline_read_in_sql_is_the_servers(engine: Engine) -> None:
    with engine.connect() as conn:
        got = conn.execute(text(f"SELECT {TIMELINE_SQL}")).scalar_one()
        checkpoint = conn.execute(text("SELECT timeline_id FROM pg_control_checkpoint()")).scalar_one()
    assert got == checkpoint >= 1


def test_claims_on_the_first_timeline_count_fences_from_one(engine: Engine) -> None:
    with engine.connect() as conn:
        if conn.execute(text(f"SELECT {TIMELINE_SQL}")).scalar_one() != 1:
            pytest.skip("the shared server has been promoted at least once: its fences start higher")
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}]))
    run = run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"))
    first = claim(engine, run.run_id)
    assert first is not None and first.fence == 1
    expire_lease(engine, run.run_id)
    second = claim(engine, run.run_id)
    assert second is not None and second.fence == 2

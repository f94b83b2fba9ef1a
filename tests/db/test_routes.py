"""A run's route (owner, the owner's weight, the run's priority) against a real
PostgreSQL: stored at submit and returned by the very statements that hand a run to a
sender (submit, the claim, the reconciler's pass), so routing costs a round no read."""

from __future__ import annotations

from sqlalchemy import Engine, text

from schema.store import leases as lease_store
from schema.store.store import Store
from schema.wire.route import Route
from tests.support.db import run_row
from tests.support.store import claim, submit


def set_weight(engine: Engine, owner: str, weight: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO owners (owner, weight) VALUES (:o, :w) ON CONFLICT (owner) DO UPDATE SET weight = :w"),
            {"o": owner, "w": weight},
        )


def test_submit_stores_the_priority_and_reads_the_owners_weight_in_its_transaction(engine: Engine) -> None:
    set_weight(engine, "team-heavy", 3)
    heavy = submit(engine, owner="team-heavy", priority=8)
    plain = submit(engine, owner="team-plain")
    assert heavy.route == Route("team-heavy", 3, 8)
    assert plain.route == Route("team-plain", 1, 5)  # no owners row: weight 1; default priority 5
    assert run_row(engine, heavy.run_id)["priority"] == 8


def test_the_claim_returns_the_route_of_the_next_round(engine: Engine) -> None:
    run = submit(engine, owner="team-heavy", priority=2)
    set_weight(engine, "team-heavy", 4)  # raised after submit: the next claim sees it
    c = claim(engine, run.run_id)
    assert c is not None and c.route == Route("team-heavy", 4, 2)
    assert Store(engine).route_of(run.run_id) == Route("team-heavy", 4, 2)


def test_the_reconcilers_resend_routes_as_the_first_send(engine: Engine) -> None:
    set_weight(engine, "team-heavy", 2)
    run = submit(engine, owner="team-heavy", priority=9)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET dispatched_at = now() - interval '1 minute'"))
    (due,) = lease_store.due_for_dispatch(engine, grace_s=5)
    assert (due.run_id, due.route) == (run.run_id, run.route)

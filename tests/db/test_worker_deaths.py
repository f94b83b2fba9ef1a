"""Whose fault a death is, against a real PostgreSQL: a claim after the round's holder
died executing it charges the round an attempt only if no worker that never held the
round died around the same time. A storm of kills (a lost node, an OOM wave, a rolling
SIGKILL) kills workers whatever they run, so it spends no round's budget; a poison round
kills only the workers that run it, so it still does."""

from __future__ import annotations

from uuid import UUID

import pytest
from sqlalchemy import Engine, text

from schema.store import workers as worker_store
from schema.store.store import Store
from schema.wire.claim import Claim
from tests.support.db import rows, run_row
from tests.support.store import HOLDER, claim, expire_lease, record, start_execution, submit
from worker.engine.leases import LeaseKeeper

LEASE_S = 5.0


def register(engine: Engine, name: str) -> UUID:
    return worker_store.register_worker(engine, name)


def last_heard(engine: Engine, worker: UUID, seconds_ago: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE workers SET heartbeat_at = now() - make_interval(secs => :s) WHERE id = :id"),
            {"id": worker, "s": seconds_ago},
        )


def died(engine: Engine, c: Claim, holder: UUID, *, seconds_ago: float) -> None:
    """The holder of ``c`` went silent ``seconds_ago`` and its lease on the round ran out."""
    last_heard(engine, holder, seconds_ago)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = :id"),
                     {"id": c.run_id})


def executing(engine: Engine, holder: UUID) -> Claim:
    """A fresh run claimed by ``holder``, whose execution of round 0 has started."""
    run = submit(engine)
    c = claim(engine, run.run_id, lease_s=LEASE_S, holder=holder)
    assert c is not None
    start_execution(engine, c)
    return c


def reclaim(engine: Engine, c: Claim, holder: UUID) -> Claim:
    again = claim(engine, c.run_id, lease_s=LEASE_S, holder=holder)
    assert again is not None
    return again


@pytest.mark.parametrize("bystander_silent_s", [28, 12], ids=["died_before_the_holder", "died_after_the_holder"])
def test_a_death_while_a_worker_that_never_held_the_round_died_too_spends_no_attempt(
    engine: Engine, bystander_silent_s: float
) -> None:
    holder, bystander, next_holder = (register(engine, n) for n in ("holder", "bystander", "next"))
    c = executing(engine, holder)
    died(engine, c, holder, seconds_ago=20)
    last_heard(engine, bystander, bystander_silent_s)  # within two leases (10 s) of the holder

    again = reclaim(engine, c, next_holder)
    assert (again.attempt, again.claims) == (1, 0)  # nor does it count toward the backstop
    assert run_row(engine, c.run_id)["round_holders"] == [holder, next_holder]


def test_a_death_while_every_other_worker_lives_spends_an_attempt(engine: Engine) -> None:
    holder, bystander, next_holder = (register(engine, n) for n in ("holder", "bystander", "next"))
    c = executing(engine, holder)
    died(engine, c, holder, seconds_ago=4)
    last_heard(engine, bystander, 1)  # alive: it heartbeated a second ago

    again = reclaim(engine, c, next_holder)
    assert (again.attempt, again.claims) == (2, 1)


def test_the_rounds_own_earlier_holders_are_no_excuse(engine: Engine) -> None:
    # A poison round: each holder dies executing it. The dead holders all held the round,
    # so none of their deaths excuses another, and the budget is spent one per death.
    holders = [register(engine, f"w{i}") for i in range(4)]
    c = executing(engine, holders[0])
    attempts = [(c.attempt, c.claims)]
    for i in range(1, 4):
        died(engine, c, holders[i - 1], seconds_ago=6)
        c = reclaim(engine, c, holders[i])
        start_execution(engine, c)
        attempts.append((c.attempt, c.claims))
    assert attempts == [(1, 0), (2, 1), (3, 2), (4, 3)]


def test_a_holder_that_dies_before_executing_counts_only_toward_the_backstop(engine: Engine) -> None:
    holder, next_holder = register(engine, "holder"), register(engine, "next")
    c = claim(engine, submit(engine).run_id, lease_s=LEASE_S, holder=holder)
    assert c is not None  # its execution never started
    died(engine, c, holder, seconds_ago=6)
    again = reclaim(engine, c, next_holder)
    assert (again.attempt, again.claims) == (1, 1)


def test_claims_after_a_give_back_cost_nothing(engine: Engine) -> None:
    # An unavailable dependency (an MCP server not reached yet, the database) gives the
    # round back, as often as it takes: that never fails the run, however long it lasts.
    holder = register(engine, "holder")
    c = executing(engine, holder)
    for _ in range(12):
        assert Store(engine).release_lease(c.run_id, c.fence, round_at_fault=False)
        c = reclaim(engine, c, holder)
    assert (c.attempt, c.claims) == (1, 0)


def test_a_worker_that_stopped_on_purpose_is_no_excuse(engine: Engine) -> None:
    holder, deployed, next_holder = (register(engine, n) for n in ("holder", "deployed", "next"))
    c = executing(engine, holder)
    died(engine, c, holder, seconds_ago=10)
    last_heard(engine, deployed, 10)
    worker_store.stop_worker(engine, deployed)  # a warm shutdown, not a death

    assert reclaim(engine, c, next_holder).attempt == 2


@pytest.mark.parametrize("bystander_silent_s", [45, 8], ids=["long_before", "long_after"])
def test_deaths_far_from_the_holders_are_no_excuse(engine: Engine, bystander_silent_s: float) -> None:
    holder, bystander, next_holder = (register(engine, n) for n in ("holder", "bystander", "next"))
    c = executing(engine, holder)
    died(engine, c, holder, seconds_ago=30)
    last_heard(engine, bystander, bystander_silent_s)  # more than two leases from the holder

    assert reclaim(engine, c, next_holder).attempt == 2


def test_a_holder_missing_from_the_registry_is_charged_as_before(engine: Engine) -> None:
    bystander = register(engine, "bystander")
    c = executing(engine, HOLDER)  # never registered (or forgotten)
    expire_lease(engine, c.run_id)
    last_heard(engine, bystander, 10)

    assert reclaim(engine, c, register(engine, "next")).attempt == 2


def test_a_round_that_raised_is_charged_even_while_workers_die(engine: Engine) -> None:
    holder, bystander, next_holder = (register(engine, n) for n in ("holder", "bystander", "next"))
    c = executing(engine, holder)
    assert Store(engine).release_lease(c.run_id, c.fence, round_at_fault=True)  # a bug: it raised
    last_heard(engine, holder, 10)  # (as if it had died as well)
    last_heard(engine, bystander, 10)

    assert reclaim(engine, c, next_holder).attempt == 2


def test_a_commit_forgets_the_rounds_holders(engine: Engine) -> None:
    holder, next_holder = register(engine, "holder"), register(engine, "next")
    c = executing(engine, holder)
    Store(engine).commit_round(record(c, outcome="continue", status="running"))
    assert run_row(engine, c.run_id)["round_holders"] == []
    following = claim(engine, c.run_id, boundary_seq=1, lease_s=LEASE_S, holder=next_holder)
    assert following is not None and run_row(engine, c.run_id)["round_holders"] == [next_holder]


def test_the_lease_heartbeat_keeps_an_idle_worker_alive_and_a_stop_is_recorded(engine: Engine) -> None:
    keeper = LeaseKeeper(engine, lease_s=30, interval_s=3600)  # no beats of its own during the test
    worker = keeper.register()
    assert keeper.register() == worker  # once per process
    last_heard(engine, worker, 100)
    keeper.beat_once()  # holds no round, and still says it is alive
    (row,) = rows(engine, "SELECT heartbeat_at > now() - interval '5 seconds' AS fresh, stopped_at FROM workers")
    assert row["fresh"] and row["stopped_at"] is None
    keeper.stop()
    assert rows(engine, "SELECT stopped_at IS NOT NULL AS stopped FROM workers")[0]["stopped"]


def test_workers_silent_for_a_day_are_forgotten(engine: Engine) -> None:
    old, recent = register(engine, "old"), register(engine, "recent")
    last_heard(engine, old, worker_store.FORGET_AFTER_S + 60)
    assert worker_store.forget_old_workers(engine) == 1
    assert [r["id"] for r in rows(engine, "SELECT id FROM workers")] == [recent]

"""A dead worker's runs, against a real PostgreSQL: beat's statement (``take_over_dead_holders``)
expires the lease of every run whose current holder has been silent past the dead limit and
marks it dispatched at once, without waiting for the lease; a live holder's runs are left
alone. The claim that follows counts the death exactly as it would at the lease's end."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Engine, text

from schema.store import workers as worker_store
from schema.store.leases import due_for_dispatch, take_over_dead_holders
from schema.wire.claim import Claim
from tests.support.db import rows, run_row
from tests.support.store import claim, start_execution, submit

LEASE_S = 30.0
DEAD_AFTER_S = 3.0


def register(engine: Engine, name: str, heartbeat_s: float | None = 1.0) -> UUID:
    return worker_store.register_worker(engine, name, heartbeat_s=heartbeat_s)


def last_heard(engine: Engine, worker: UUID, seconds_ago: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE workers SET heartbeat_at = now() - make_interval(secs => :s) WHERE id = :id"),
            {"id": worker, "s": seconds_ago},
        )


def executing(engine: Engine, holder: UUID) -> Claim:
    """A fresh run claimed by ``holder`` (a lease of LEASE_S), its round 0 executing."""
    c = claim(engine, submit(engine).run_id, lease_s=LEASE_S, holder=holder)
    assert c is not None
    start_execution(engine, c)
    return c


def take_over(engine: Engine, dead_after_s: float | None = DEAD_AFTER_S):  # type: ignore[no-untyped-def]
    return take_over_dead_holders(engine, dead_after_s=dead_after_s, lease_s=LEASE_S)


def lease(engine: Engine, run_id: UUID) -> dict[str, object]:
    return rows(
        engine,
        "SELECT lease_expires_at > now() + interval '20 seconds' AS long, lease_expires_at <= now() AS expired, "
        "dispatched_at > now() - interval '1 second' AS dispatched_now FROM runs WHERE id = :id",
        id=run_id,
    )[0]


def test_a_run_held_by_a_dead_worker_is_due_at_once_and_one_held_by_a_live_worker_is_not(engine: Engine) -> None:
    dead, live, other = (register(engine, n) for n in ("dead", "live", "other"))
    lost, kept = executing(engine, dead), executing(engine, live)
    last_heard(engine, dead, DEAD_AFTER_S + 1)  # killed: its lease still has ~30 s to run
    last_heard(engine, live, 0.5)
    assert lease(engine, lost.run_id)["long"]

    found = take_over(engine)
    assert found.newly_dead == [dead]
    assert [(due.run_id, due.boundary_seq, due.resume, holder) for due, holder in found.sent] == [
        (lost.run_id, 0, False, dead)
    ]
    assert found.backing_off == []
    assert lease(engine, lost.run_id) == {"long": False, "expired": True, "dispatched_now": True}
    assert lease(engine, kept.run_id)["long"]
    assert take_over(engine).sent == []  # done once: its lease has run out now

    # Another worker's claim takes it at once, and charges the death as a lease's end would:
    # the execution started, no worker that never held the round died.
    again = claim(engine, lost.run_id, lease_s=LEASE_S, holder=other)
    assert again is not None and (again.fence, again.attempt, again.claims) == (lost.fence + 1, 2, 1)
    assert claim(engine, kept.run_id, lease_s=LEASE_S, holder=other) is None  # its holder lives


def test_a_worker_silent_for_less_than_the_limit_or_stopped_on_purpose_keeps_its_runs(engine: Engine) -> None:
    slow, stopped = register(engine, "slow"), register(engine, "stopped")
    # Older code (no heartbeat promised: it beats every lease_s / 3), and a worker whose
    # heartbeats are further apart than half the limit: silence says nothing before the lease.
    old, sparse = register(engine, "old", heartbeat_s=None), register(engine, "sparse", heartbeat_s=2.0)
    held = [executing(engine, w) for w in (slow, stopped, old, sparse)]
    last_heard(engine, slow, DEAD_AFTER_S - 1)
    for silent in (stopped, old, sparse):
        last_heard(engine, silent, DEAD_AFTER_S + 1)
    worker_store.stop_worker(engine, stopped)  # a warm shutdown: its silence says nothing

    found = take_over(engine)
    assert (found.newly_dead, found.sent, found.backing_off) == ([], [], [])
    assert all(lease(engine, c.run_id)["long"] for c in held)


def test_no_limit_finds_nobody_dead(engine: Engine) -> None:
    # Beat's probe while it cannot trust silence yet (just started, or the database was away).
    dead = register(engine, "dead")
    c = executing(engine, dead)
    last_heard(engine, dead, 60)
    assert take_over(engine, None).sent == []
    assert lease(engine, c.run_id)["long"]


def test_a_round_that_failed_before_keeps_its_backoff(engine: Engine) -> None:
    first, second, third = (register(engine, n) for n in ("first", "second", "third"))
    c = executing(engine, first)
    last_heard(engine, first, DEAD_AFTER_S + 1)
    assert len(take_over(engine).sent) == 1
    c = claim(engine, c.run_id, lease_s=LEASE_S, holder=second)
    assert c is not None and c.attempt == 2
    start_execution(engine, c)  # ... and its second holder dies executing it too
    last_heard(engine, second, DEAD_AFTER_S + 1)

    found = take_over(engine)
    assert found.sent == [] and found.backing_off == [(c.run_id, second)]
    assert lease(engine, c.run_id)["expired"]
    # The reconciler sends it once its backoff (grace_s x 1, from the expiry) has passed.
    assert due_for_dispatch(engine, grace_s=10) == []
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET lease_expires_at = lease_expires_at - interval '11 seconds', "
                          "dispatched_at = dispatched_at - interval '11 seconds'"))
    assert [d.run_id for d in due_for_dispatch(engine, grace_s=10)] == [c.run_id]
    assert claim(engine, c.run_id, lease_s=LEASE_S, holder=third) is not None


def test_a_worker_killed_with_the_holder_excuses_the_early_claim(engine: Engine) -> None:
    # A lost node: the holder and a worker that never held the round die together. The
    # round is claimed seconds later, long before a lease has passed: beat's mark is what
    # tells the claim that the bystander died, so the round is charged nothing.
    holder, bystander, next_holder = (register(engine, n) for n in ("holder", "bystander", "next"))
    c = executing(engine, holder)
    last_heard(engine, holder, DEAD_AFTER_S + 1)
    last_heard(engine, bystander, DEAD_AFTER_S + 0.5)

    assert sorted(take_over(engine).newly_dead) == sorted([holder, bystander])
    again = claim(engine, c.run_id, lease_s=LEASE_S, holder=next_holder)
    assert again is not None and (again.attempt, again.claims) == (1, 0)


def test_a_worker_that_heartbeats_after_its_mark_is_alive_again(engine: Engine) -> None:
    # Paused past the limit (SIGSTOP), then resumed: its heartbeat outdates beat's mark, so
    # its silence excuses no later death; the round of a holder dying alone is charged.
    holder, paused, next_holder = (register(engine, n) for n in ("holder", "paused", "next"))
    last_heard(engine, paused, DEAD_AFTER_S + 1)
    assert take_over(engine).newly_dead == [paused]
    last_heard(engine, paused, 0)  # it resumed

    c = executing(engine, holder)
    last_heard(engine, holder, DEAD_AFTER_S + 1)
    assert take_over(engine).newly_dead == [holder]
    again = claim(engine, c.run_id, lease_s=LEASE_S, holder=next_holder)
    assert again is not None and again.attempt == 2
    dead_at = rows(engine, "SELECT id FROM workers WHERE dead_at >= heartbeat_at")
    assert [r["id"] for r in dead_at] == [holder]
    assert run_row(engine, c.run_id)["round_holders"] == [holder, next_holder]

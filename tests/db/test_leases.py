"""Leases against a real PostgreSQL: a heartbeat whose snapshot of held rounds predates
a commit, a release or a new claim must be a no-op, so it cannot re-arm a lease that
was given back and make the next claim wait for the lease to expire."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, text
from structlog.testing import capture_logs

from schema.store import leases as lease_store
from schema.store import rounds as round_store
from schema.store.store import Store
from schema.wire.claim import Claim
from tests.support.db import rows, run_row
from tests.support.store import claim, expire_lease, record, submit
from tests.support.wait import wait_until
from worker.engine.leases import LeaseKeeper


def lease_of(engine: Engine, run_id: UUID) -> dict[str, Any]:
    return rows(
        engine,
        "SELECT lease_expires_at IS NULL AS cleared, lease_expires_at > now() AS live FROM runs WHERE id = :id",
        id=run_id,
    )[0]


def continued(c: Claim) -> Any:
    return record(c, outcome="continue", status="running")


def test_heartbeat_taken_before_a_commit_cannot_rearm_the_lease(engine: Engine) -> None:
    run = submit(engine)
    held = claim(engine, run.run_id)
    assert held is not None
    stale_snapshot = [(held.run_id, held.fence)]  # the heartbeat thread read its holdings here

    Store(engine).commit_round(continued(held))  # round 0 committed: lease cleared
    kept = lease_store.extend_leases(engine, stale_snapshot, lease_s=30)  # the heartbeat's statement lands now

    assert kept == set()
    assert lease_of(engine, run.run_id)["cleared"]
    following = claim(engine, run.run_id, boundary_seq=1)
    assert following is not None, "the next round's claim was refused by a re-armed lease"
    assert following.fence == held.fence + 1


def test_heartbeat_taken_before_a_release_cannot_rearm_the_lease(engine: Engine) -> None:
    run = submit(engine)
    held = claim(engine, run.run_id)
    assert held is not None
    stale_snapshot = [(held.run_id, held.fence)]

    assert Store(engine).release_lease(held.run_id, held.fence, round_at_fault=False)  # given back
    assert lease_store.extend_leases(engine, stale_snapshot, lease_s=30) == set()

    assert lease_of(engine, run.run_id)["cleared"]
    retried = claim(engine, run.run_id, boundary_seq=0)
    assert retried is not None and retried.fence == held.fence + 1


def test_heartbeat_taken_before_a_suspension_and_its_resume_cannot_rearm_the_lease(engine: Engine) -> None:
    run = submit(engine)
    held = claim(engine, run.run_id)
    assert held is not None
    stale_snapshot = [(held.run_id, held.fence)]
    Store(engine).commit_round(record(held, outcome="suspend", status="suspended"))
    # Every input arrived: the run is 'running' again at the same boundary and the same
    # fence, with no lease; only the resume's claim may take it.
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE runs SET status = 'running' WHERE id = %s", (run.run_id,))

    assert lease_store.extend_leases(engine, stale_snapshot, lease_s=30) == set()
    assert lease_of(engine, run.run_id)["cleared"]


def test_heartbeat_of_a_superseded_claim_cannot_extend_the_new_holders_lease(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id, lease_s=30)
    assert first is not None
    Store(engine).commit_round(continued(first))
    second = claim(engine, run.run_id, boundary_seq=1, lease_s=1)
    assert second is not None
    before = run_row(engine, run.run_id)["lease_expires_at"]

    assert lease_store.extend_leases(engine, [(first.run_id, first.fence)], lease_s=600) == set()
    assert run_row(engine, run.run_id)["lease_expires_at"] == before


def test_heartbeat_keeps_a_held_lease_even_after_it_expired_unclaimed(engine: Engine) -> None:
    # A holder that missed a beat (a long GC pause) but was not taken over keeps its claim.
    run = submit(engine)
    held = claim(engine, run.run_id, lease_s=1)
    assert held is not None
    expire_lease(engine, run.run_id)
    assert lease_store.extend_leases(engine, [(held.run_id, held.fence)], lease_s=60) == {held.run_id}
    assert lease_of(engine, run.run_id)["live"]


def _waiting_on_a_row_lock(engine: Engine) -> bool:
    return bool(
        rows(
            engine,
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query LIKE '%lease_expires_at = now()%'",
        )
    )


def test_lease_keeper_beat_racing_a_commit_leaves_no_lease_and_reports_no_loss(engine: Engine) -> None:
    # The interleaving is forced with the run row's lock: the commit's transaction holds
    # it, so the keeper's heartbeat (snapshot already taken) waits inside its UPDATE;
    # the round leaves ``holding`` and commits; only then does the heartbeat's statement
    # evaluate - against the committed row.
    keeper = LeaseKeeper(engine, lease_s=30, interval_s=3600)  # no beats of its own during the test
    run = submit(engine)
    held = claim(engine, run.run_id)
    assert held is not None
    beat = threading.Thread(target=keeper.beat_once)
    with capture_logs() as logs, engine.connect() as commit_conn:
        commit_tx = commit_conn.begin()
        with keeper.holding(held.run_id, held.fence):
            round_store.commit_round_txn(commit_conn, continued(held))  # row locked until commit_tx commits
            beat.start()
            wait_until(lambda: _waiting_on_a_row_lock(engine), what="the heartbeat to wait on the run row")
        commit_tx.commit()
        beat.join(timeout=30)
    keeper.stop()

    assert not beat.is_alive()
    assert lease_of(engine, run.run_id)["cleared"]
    assert not [entry for entry in logs if entry["event"] == "lease_lost"]
    following = claim(engine, run.run_id, boundary_seq=1)
    assert following is not None, "the next round's claim was refused by a re-armed lease"


def test_lease_keeper_reports_a_lease_taken_over_while_held(engine: Engine) -> None:
    keeper = LeaseKeeper(engine, lease_s=30, interval_s=3600)
    run = submit(engine)
    held = claim(engine, run.run_id)
    assert held is not None
    with capture_logs() as logs, keeper.holding(held.run_id, held.fence):
        expire_lease(engine, run.run_id)
        assert claim(engine, run.run_id) is not None  # another worker took it over
        keeper.beat_once()
    keeper.stop()
    assert [(e["event"], e["claim_fence"]) for e in logs if e["event"] == "lease_lost"] == [
        ("lease_lost", held.fence)
    ]


def _refusals(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["log_level"], e["reason"]) for e in logs if e["event"] == "claim_refused"]


def test_refused_claim_of_a_live_run_is_a_warning_naming_the_reason(ctx: Any) -> None:
    from schema.wire import RoundTask
    from worker.engine.round import RoundDisposition, execute_round

    run = submit(ctx.engine)
    held = claim(ctx.engine, run.run_id)  # another worker holds round 0
    assert held is not None
    with capture_logs() as logs:
        assert execute_round(ctx, RoundTask(run_id=run.run_id, boundary_seq=0)) is RoundDisposition.DROPPED
        assert execute_round(ctx, RoundTask(run_id=run.run_id, boundary_seq=3)) is RoundDisposition.DROPPED
    assert _refusals(logs) == [("warning", "leased_by_live_holder"), ("warning", "run_at_another_boundary")]

    Store(ctx.engine).commit_round(record(held))  # the run ends
    with capture_logs() as logs:
        assert execute_round(ctx, RoundTask(run_id=run.run_id, boundary_seq=0)) is RoundDisposition.DROPPED
    assert _refusals(logs) == [("info", "run_ended")]


def test_a_round_given_back_to_wait_for_its_rate_limit_is_not_due_before_its_countdown(engine: Engine) -> None:
    waiting, failed = submit(engine), submit(engine)
    for run in (waiting, failed):
        held = claim(engine, run.run_id)
        assert held is not None
        after_s = 60.0 if run is waiting else None
        assert Store(engine).release_lease(held.run_id, held.fence, round_at_fault=False, dispatch_after_s=after_s)
    # Both stamps moved back ten seconds, past the grace: only the plain release is due;
    # the rate-limited one was re-sent with a countdown and counts as dispatched then.
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET dispatched_at = dispatched_at - interval '10 seconds'"))
    due = {d.run_id for d in lease_store.due_for_dispatch(engine, grace_s=1)}
    assert due == {failed.run_id}
    assert rows(engine, "SELECT dispatched_at > now() + interval '40 seconds' AS later FROM runs WHERE id = :id",
                id=waiting.run_id)[0]["later"]


def test_the_claim_is_heartbeated_while_a_cold_state_is_built(ctx: Any, monkeypatch: Any) -> None:
    """A cold state's build (the whole history, the model's SDK client) may outlast a
    short lease: the lease keeper holds the claim from the claim on, so a heartbeat during
    the build keeps the lease, no other worker can take the run meanwhile, and the round
    commits under its own claim."""
    from schema.wire import RoundTask
    from worker.engine import round as round_module
    from worker.engine.round import RoundDisposition, execute_round

    run = submit(ctx.engine)
    build = round_module._state_after_claim
    during: dict[str, Any] = {}

    def slow_build(worker_ctx: Any, cached: Any, c: Claim) -> Any:
        expire_lease(ctx.engine, c.run_id)  # the build has outlasted the lease
        ctx.leases.beat_once()  # what the heartbeat thread does meanwhile
        during["lease"] = lease_of(ctx.engine, c.run_id)
        during["rival"] = claim(ctx.engine, c.run_id)  # another worker's delivery of the same round
        return build(worker_ctx, cached, c)

    monkeypatch.setattr(round_module, "_state_after_claim", slow_build)
    assert execute_round(ctx, RoundTask(run_id=run.run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    assert during["lease"]["live"], "the lease ran out while the state was built"
    assert during["rival"] is None, "another worker took the run while its state was built"
    assert run_row(ctx.engine, run.run_id)["claim_fence"] == 1

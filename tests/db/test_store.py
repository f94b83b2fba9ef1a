"""The store against a real PostgreSQL: claims, fences, leases, reconcile, Root order."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, text

from schema.store import leases as lease_store
from schema.store import runs as run_store
from schema.store.errors import FenceLost, RootNotFound
from schema.store.store import Store
from schema.store.tx import run_transaction
from schema.wire.claim import Claim
from tests.support.db import rows, run_row
from tests.support.store import HOLDER, claim, expire_lease, record, submit


def table_counts(engine: Engine) -> dict[str, int]:
    names = ["rounds", "messages", "tool_invocations", "run_events", "model_calls"]
    return {n: rows(engine, f"SELECT count(*) AS n FROM {n}")[0]["n"] for n in names}


def test_two_workers_racing_to_claim_exactly_one_wins(engine: Engine) -> None:
    run = submit(engine)
    barrier = threading.Barrier(8)
    results: list[Claim | None] = []

    def race() -> None:
        barrier.wait()
        results.append(claim(engine, run.run_id))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert winners[0].fence == 1
    row = run_row(engine, run.run_id)
    assert (row["claim_fence"], row["round_attempts"], row["round_claims"], row["status"]) == (1, 0, 0, "running")
    assert winners[0].attempt == 1


def test_stale_fence_commit_changes_nothing(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None
    expire_lease(engine, run.run_id)
    second = claim(engine, run.run_id)
    assert second is not None and second.fence == first.fence + 1
    before_row, before_counts = run_row(engine, run.run_id), table_counts(engine)

    with pytest.raises(FenceLost) as caught:
        Store(engine).commit_round(record(first))
    assert caught.value.fence == first.fence and caught.value.run_id == run.run_id
    assert run_row(engine, run.run_id) == before_row
    assert table_counts(engine) == before_counts

    with pytest.raises(FenceLost):
        Store(engine).record_model_call_started(run.run_id, 0, first.attempt, first.fence, "req")
    assert table_counts(engine) == before_counts

    Store(engine).commit_round(record(second))
    row = run_row(engine, run.run_id)
    assert (row["status"], row["boundary_seq"], row["output"]) == ("completed", 1, "done")
    assert [r["claim_fence"] for r in rows(engine, "SELECT claim_fence FROM rounds")] == [second.fence]


def test_live_lease_blocks_a_second_claim_and_an_expired_one_does_not(engine: Engine) -> None:
    run = submit(engine)
    assert claim(engine, run.run_id) is not None
    assert claim(engine, run.run_id) is None
    expire_lease(engine, run.run_id)
    assert claim(engine, run.run_id) is not None


def test_claim_at_a_boundary_the_run_has_left_is_refused(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None
    Store(engine).commit_round(record(first, outcome="continue", status="running"))
    before = run_row(engine, run.run_id)
    assert claim(engine, run.run_id, boundary_seq=0) is None  # a duplicate delivery of round 0
    assert run_row(engine, run.run_id) == before
    assert claim(engine, run.run_id, boundary_seq=1) is not None


def test_heartbeat_extends_only_leases_still_held(engine: Engine) -> None:
    a, b = submit(engine), submit(engine)
    ca, cb = claim(engine, a.run_id, lease_s=1), claim(engine, b.run_id, lease_s=1)
    assert ca and cb
    expire_lease(engine, b.run_id)
    assert claim(engine, b.run_id) is not None  # b taken over: fence moved on
    kept = lease_store.extend_leases(engine, [(a.run_id, ca.fence), (b.run_id, cb.fence)], lease_s=60)
    assert kept == {a.run_id}
    leased = rows(engine, "SELECT lease_expires_at > now() + interval '30 seconds' AS long FROM runs WHERE id = :id",
                  id=a.run_id)
    assert leased[0]["long"]


def test_reconcile_finds_expired_leases_and_lost_messages_but_not_live_runs(engine: Engine) -> None:
    lost, crashed, live = submit(engine), submit(engine), submit(engine)
    assert claim(engine, crashed.run_id) is not None
    assert claim(engine, live.run_id) is not None
    expire_lease(engine, crashed.run_id)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET dispatched_at = now() - interval '1 minute'"))
    due = {d.run_id: (d.boundary_seq, d.resume) for d in lease_store.due_for_dispatch(engine, grace_s=5)}
    assert due == {lost.run_id: (0, False), crashed.run_id: (0, False)}
    # Marked as dispatched: a second reconciler right after finds nothing to send.
    assert lease_store.due_for_dispatch(engine, grace_s=5) == []


def test_later_run_of_a_root_waits_for_the_earlier_one(engine: Engine) -> None:
    first = submit(engine)
    second = submit(engine, root_id=str(first.root_id))
    assert (second.root_id, second.root_seq) == (first.root_id, 1)
    assert claim(engine, second.run_id) is None
    c1 = claim(engine, first.run_id)
    assert c1 is not None
    assert Store(engine).commit_round(record(c1)).next_runs == (second.run_id,)
    # The Root's next run reads the messages the first one wrote (a warm claim loads the delta).
    c2 = Store(engine).claim_round(second.run_id, 0, lease_s=30, after_position=0, cold=False, holder=HOLDER)
    assert c2 is not None and [m.position for m in c2.new_messages] == [1]
    assert c2.input is None and c2.config is None  # warm claims do not ship the config again


def test_submit_to_an_unknown_root_stores_nothing(engine: Engine) -> None:
    with pytest.raises(RootNotFound):
        submit(engine, root_id="00000000-0000-0000-0000-000000000001")
    assert rows(engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0


def test_cancel_fences_out_the_holder(engine: Engine) -> None:
    run = submit(engine)
    held = claim(engine, run.run_id)
    assert held is not None
    cancelled, _ = run_store.cancel_run(engine, run.run_id)
    assert cancelled
    with pytest.raises(FenceLost):
        Store(engine).commit_round(record(held))
    row = run_row(engine, run.run_id)
    assert (row["status"], row["error_code"], row["boundary_seq"]) == ("cancelled", "CANCELLED", 0)
    assert run_store.cancel_run(engine, run.run_id) == (False, ())


def test_fail_claimed_run_releases_the_roots_next_run(engine: Engine) -> None:
    first = submit(engine)
    second = submit(engine, root_id=str(first.root_id))
    c1 = claim(engine, first.run_id)
    assert c1 is not None
    assert Store(engine).fail_claimed_run(first.run_id, c1.fence, "X", "boom") == (second.run_id,)
    assert run_row(engine, first.run_id)["status"] == "failed"
    kinds = [r["kind"] for r in rows(engine, "SELECT kind FROM run_events WHERE run_id = :id ORDER BY seq",
                                     id=first.run_id)]
    assert kinds == ["run_queued", "run_failed"]


def test_transaction_retries_a_real_serialization_failure(engine: Engine) -> None:
    run = submit(engine)
    attempts: list[int] = []

    def txn(conn: Any) -> int:
        attempts.append(1)
        conn.execute(text("SELECT claim_fence FROM runs WHERE id = :id"), {"id": run.run_id}).scalar_one()
        if len(attempts) == 1:
            # Another transaction commits a change to the row this snapshot has read...
            with engine.begin() as other:
                other.execute(text("UPDATE runs SET round_attempts = 7 WHERE id = :id"), {"id": run.run_id})
        # ... so updating it under REPEATABLE READ raises 40001 on the first attempt.
        return conn.execute(
            text("UPDATE runs SET claim_fence = claim_fence + 1 WHERE id = :id RETURNING claim_fence"),
            {"id": run.run_id},
        ).scalar_one()

    fence = run_transaction(engine, txn, isolation_level="REPEATABLE READ", name="test")
    assert len(attempts) == 2
    assert fence == 1
    assert run_row(engine, run.run_id)["round_attempts"] == 7


def test_non_retryable_errors_are_not_retried(engine: Engine) -> None:
    attempts: list[int] = []

    def txn(conn: Any) -> None:
        attempts.append(1)
        conn.execute(text("SELECT 1/0"))

    with pytest.raises(Exception, match="division by zero"):
        run_transaction(engine, txn)
    assert len(attempts) == 1

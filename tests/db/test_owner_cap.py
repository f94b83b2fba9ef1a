"""The concurrency cap: owners.running, the locked counter, equals the owner's running
runs after every transition, and concurrent claims never take more slots than the cap."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Engine, text

from schema.store import claims as claim_store
from schema.store import limits
from schema.store import runs as run_store
from schema.store.errors import FenceLost
from schema.store.store import Store
from schema.wire import RoundTask
from schema.wire.owners import OwnerLimitsChange, OwnerLimitsInvalid
from tests.support.db import rows
from tests.support.store import claim, expire_lease, record, submit
from tests.support.suspensions import BODY_A, READ_ONE, run_row, suspended_run
from worker import client
from worker.engine.resume import execute_resume
from worker.engine.round import RoundDisposition, execute_round

OWNER = "team-test"


def counter(engine: Engine, owner: str = OWNER) -> tuple[int, int]:
    """(owners.running, the owner's runs with status running)."""
    row = rows(
        engine,
        "SELECT (SELECT running FROM owners WHERE owner = :o) AS counted, "
        "(SELECT count(*) FROM runs WHERE owner = :o AND status = 'running') AS actual",
        o=owner,
    )[0]
    return int(row["counted"]), int(row["actual"])


def assert_in_step(engine: Engine, what: str) -> None:
    counted, actual = counter(engine)
    assert counted == actual, f"after {what}: owners.running {counted}, running runs {actual}"


def test_every_transition_keeps_the_counter_equal_to_the_running_runs(ctx: Any) -> None:
    engine = ctx.engine
    finished = submit(engine)
    c = claim(engine, finished.run_id)
    assert c is not None
    # A cap set while a run is running counts it.
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=5))
    assert counter(engine) == (1, 1)
    Store(engine).commit_round(record(c))
    assert_in_step(engine, "finish")

    # A stale-fence commit changes nothing.
    stale_run = submit(engine)
    first = claim(engine, stale_run.run_id)
    assert first is not None
    expire_lease(engine, stale_run.run_id)
    second = claim(engine, stale_run.run_id)  # a reclaim of a running run takes no second slot
    assert second is not None
    assert counter(engine) == (1, 1)
    with pytest.raises(FenceLost):
        Store(engine).commit_round(record(first))
    assert_in_step(engine, "stale-fence commit")
    Store(engine).fail_claimed_run(stale_run.run_id, second.fence, "X", "failed by test")
    assert_in_step(engine, "fail")

    # Suspend frees the slot, the delivery takes one again, the resume's commit ends it.
    suspended = suspended_run(ctx, READ_ONE, ["read_files"])
    assert counter(engine) == (0, 0)
    receipt = client.deliver(suspended, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert counter(engine) == (1, 1)
    assert execute_resume(ctx, receipt.resumes) is RoundDisposition.COMMITTED
    assert_in_step(engine, "resume")
    assert execute_round(ctx, RoundTask(run_id=suspended, boundary_seq=1)) is RoundDisposition.COMMITTED
    assert run_row(ctx, suspended)["status"] == "completed"
    assert_in_step(engine, "finish after resume")

    # Cancel: a running run gives its slot back; a queued or suspended one has none.
    running = submit(engine)
    assert claim(engine, running.run_id) is not None
    queued = submit(engine)
    parked = suspended_run(ctx, READ_ONE, ["read_files"])
    for run_id in (running.run_id, queued.run_id, parked):
        assert run_store.cancel_run(engine, run_id)[0]
        assert_in_step(engine, f"cancel {run_id}")

    # A poison round failed at its claim (attempts spent) gives its slot back too.
    poison = submit(engine)
    held = claim(engine, poison.run_id)
    assert held is not None
    Store(engine).record_model_call_started(held.run_id, 0, held.attempt, held.fence, "req")
    expire_lease(engine, poison.run_id)
    one_attempt = replace(ctx, settings=ctx.settings.model_copy(update={"max_round_attempts": 1}))
    assert execute_round(one_attempt, RoundTask(run_id=poison.run_id, boundary_seq=0)) is RoundDisposition.RUN_FAILED
    assert_in_step(engine, "poison")
    assert counter(engine) == (0, 0)


def test_concurrent_claims_of_a_capped_owner_never_exceed_the_cap(engine: Engine) -> None:
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=3))
    run_ids = [submit(engine).run_id for _ in range(24)]
    won: list[UUID] = []
    gate = threading.Barrier(8)

    def worker(mine: list[UUID]) -> None:
        gate.wait()
        for run_id in mine:
            if claim(engine, run_id) is not None:
                won.append(run_id)

    threads = [threading.Thread(target=worker, args=(run_ids[i::8] + run_ids,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 3
    assert counter(engine) == (3, 3)
    refusal = Store(engine).explain_refused_claim(next(r for r in run_ids if r not in won), 0, resume=False)
    assert refusal.reason == claim_store.OWNER_AT_CAPACITY


def test_a_freed_slot_hands_the_owners_next_queued_run_in_submission_order(engine: Engine) -> None:
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=1))
    first, second, third = (submit(engine).run_id for _ in range(3))
    c = claim(engine, first)
    assert c is not None and claim(engine, second) is None
    assert Store(engine).commit_round(record(c)).next_runs == (second,)
    assert claim(engine, second) is not None and claim(engine, third) is None
    assert counter(engine) == (1, 1)


def test_a_budget_without_a_window_is_refused_and_nothing_is_stored(engine: Engine) -> None:
    with pytest.raises(OwnerLimitsInvalid) as refused:
        limits.set_owner_limits(engine, "fresh", OwnerLimitsChange.of(token_budget=1000))
    assert refused.value.field == "budget_window"
    assert rows(engine, "SELECT * FROM owners") == []
    limits.set_owner_limits(engine, "fresh", OwnerLimitsChange.of(token_budget=1000, budget_window="1d"))
    raised = limits.set_owner_limits(engine, "fresh", OwnerLimitsChange.of(token_budget=5000))
    assert (raised.token_budget, raised.budget_window) == (5000, "1d")
    cleared = limits.set_owner_limits(engine, "fresh", OwnerLimitsChange.of(token_budget=None))
    assert (cleared.token_budget, cleared.budget_window) == (None, None)


def test_a_run_parked_for_its_budget_gives_its_slot_back(ctx: Any) -> None:
    from schema.store.store import Store

    engine = ctx.engine
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=1))
    parked, waiting = submit(engine), submit(engine)
    c = claim(engine, parked.run_id)
    assert c is not None and counter(engine) == (1, 1)
    assert claim(engine, waiting.run_id) is None  # the one slot is taken

    Store(engine).park_for_budget(c.run_id, c.fence, c.boundary_seq, {"budget_window": "1h"})
    assert_in_step(engine, "parking for the budget")
    assert counter(engine) == (0, 0)
    assert claim(engine, waiting.run_id) is not None  # the slot it gave back


def test_a_run_ready_to_resume_with_the_cap_full_waits_queued_ahead_of_younger_runs(ctx: Any) -> None:
    engine = ctx.engine
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=1))
    suspended = suspended_run(ctx, READ_ONE, ["read_files"])  # holds no slot
    busy = submit(engine)
    held = claim(engine, busy.run_id)
    assert held is not None and counter(engine) == (1, 1)  # the one slot
    younger = submit(engine)

    # Its input arrives while the cap is full: it waits queued, in submission order.
    receipt = client.deliver(suspended, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert receipt.stored and receipt.resumes == []
    assert run_row(ctx, suspended)["status"] == "queued"
    assert_in_step(engine, "a delivery with the cap full")

    # The freed slot goes to it (it is older than the younger run), as a resume.
    committed = Store(engine).commit_round(record(held))
    assert committed.next_runs == (suspended,)
    due = Store(engine).due_of(suspended)
    assert (due.resume, due.boundary_seq, due.route.owner) == (True, 0, OWNER)
    assert claim(engine, younger.run_id) is None  # not its turn: the older run waits for that slot
    resumes = Store(engine).pending_resumes(suspended)
    assert execute_resume(ctx, resumes) is RoundDisposition.COMMITTED
    assert_in_step(engine, "the resume from the queue")
    assert counter(engine) == (1, 1)
    assert execute_round(ctx, RoundTask(run_id=suspended, boundary_seq=1)) is RoundDisposition.COMMITTED
    assert run_row(ctx, suspended)["status"] == "completed"
    assert claim(engine, younger.run_id) is not None  # and then the younger one


def test_a_freed_slot_sends_both_the_owners_next_and_the_roots_next_run(engine: Engine) -> None:
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=2))
    first, other = submit(engine), submit(engine)
    c1, c2 = claim(engine, first.run_id), claim(engine, other.run_id)
    assert c1 is not None and c2 is not None
    follow_up = submit(engine, root_id=str(first.root_id))  # waits for its Root's turn
    waiting = submit(engine)  # waits for a slot
    committed = Store(engine).commit_round(record(c1))
    # One slot freed: the owner's next queued run and the Root's next are both sent; their
    # claims decide, under the cap, which one starts (the older one: the follow-up).
    assert set(committed.next_runs) == {follow_up.run_id, waiting.run_id}
    assert claim(engine, waiting.run_id) is None
    assert claim(engine, follow_up.run_id) is not None
    assert_in_step(engine, "two runs sent for one slot")


def test_a_drifted_counter_is_recounted_by_the_reconcilers_repair(engine: Engine) -> None:
    limits.set_owner_limits(engine, OWNER, OwnerLimitsChange.of(max_running=3))
    limits.set_owner_limits(engine, "team-other", OwnerLimitsChange.of(max_running=3))
    held = claim(engine, submit(engine).run_id)
    assert held is not None and counter(engine) == (1, 1)
    assert limits.repair_running_counters(engine) == {}  # nothing drifted: nothing written
    with engine.begin() as conn:  # e.g. a claim that began before the owner's row existed
        conn.execute(text("UPDATE owners SET running = 0 WHERE owner = :o"), {"o": OWNER})
    assert limits.repair_running_counters(engine) == {OWNER: (0, 1)}
    assert counter(engine) == (1, 1) and counter(engine, "team-other") == (0, 0)
    assert limits.repair_running_counters(engine) == {}

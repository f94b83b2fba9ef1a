"""The poison budget against a real PostgreSQL: only an execution of the round that
started and did not finish because of the round (its worker died executing it, or it
raised) spends an attempt; a claim alone, a lost claim or an unavailable dependency
never does. Repeated failures are re-sent with a backoff."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from runtime.errors import ModelUnavailable
from schema.store import leases as lease_store
from schema.store.errors import FenceLost
from schema.store.store import Store
from schema.wire import RoundTask
from schema.wire.claim import Claim
from tests.support.db import rows, run_row
from tests.support.store import HOLDER, claim, expire_lease, record, start_execution, submit
from worker.engine.round import ROUND_ATTEMPTS_EXHAUSTED, RoundDisposition, execute_round, round_at_fault


def reclaim(engine: Engine, c: Claim, boundary_seq: int = 0) -> Claim:
    expire_lease(engine, c.run_id)  # its worker died: the lease runs out
    again = claim(engine, c.run_id, boundary_seq)
    assert again is not None
    return again


def test_holders_that_die_before_executing_spend_no_attempt(engine: Engine) -> None:
    run = submit(engine)
    c = claim(engine, run.run_id)
    assert c is not None
    for _ in range(5):  # killed between the claim and the model call, again and again
        c = reclaim(engine, c)
    assert (c.attempt, c.claims) == (1, 5)  # five deaths toward the backstop, none excused
    assert run_row(engine, run.run_id)["round_attempts"] == 0


def test_holders_that_die_executing_spend_one_attempt_each(engine: Engine) -> None:
    run = submit(engine)
    c = claim(engine, run.run_id)
    assert c is not None
    attempts = [c.attempt]
    for _ in range(3):
        start_execution(engine, c)  # the round's execution started ...
        c = reclaim(engine, c)  # ... and its worker died in it
        attempts.append(c.attempt)
    assert attempts == [1, 2, 3, 4]
    calls = rows(engine, "SELECT attempt, claim_fence FROM model_calls ORDER BY id")
    assert [(r["attempt"], r["claim_fence"]) for r in calls] == [(1, 1), (2, 2), (3, 3)]


def test_a_claim_taken_over_counts_once_for_the_execution_it_started(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None
    start_execution(engine, first)
    second = reclaim(engine, first)  # the paused first holder is taken over: one attempt
    assert second.attempt == 2
    third = reclaim(engine, second)  # the second died before executing: none
    assert third.attempt == 2
    with pytest.raises(FenceLost):  # the first holder, resumed, cannot mark anything
        start_execution(engine, first)
    assert reclaim(engine, third).attempt == 2


def test_release_after_an_unavailable_dependency_spends_no_attempt_but_a_bug_does(engine: Engine) -> None:
    run = submit(engine)
    c = claim(engine, run.run_id)
    assert c is not None
    start_execution(engine, c)
    assert Store(engine).release_lease(c.run_id, c.fence, round_at_fault=False)
    c2 = claim(engine, run.run_id)
    assert c2 is not None and c2.attempt == 1
    start_execution(engine, c2)
    assert Store(engine).release_lease(c2.run_id, c2.fence, round_at_fault=True)
    c3 = claim(engine, run.run_id)
    assert c3 is not None and c3.attempt == 2


def test_commit_resets_the_budget_for_the_next_round(engine: Engine) -> None:
    run = submit(engine)
    c = claim(engine, run.run_id)
    assert c is not None
    start_execution(engine, c)
    c = reclaim(engine, c)
    assert (c.attempt, c.claims) == (2, 1)
    start_execution(engine, c)
    Store(engine).commit_round(record(c, outcome="continue", status="running"))
    following = claim(engine, run.run_id, boundary_seq=1)
    assert following is not None and (following.attempt, following.claims) == (1, 0)


def test_errors_of_unavailable_dependencies_are_not_the_rounds_fault() -> None:
    assert not round_at_fault(ModelUnavailable("provider down"))
    assert not round_at_fault(OperationalError("SELECT 1", {}, Exception("connection refused")))
    assert not round_at_fault(FenceLost(run_id=uuid4(), fence=1))
    assert round_at_fault(RuntimeError("a bug in the round"))


def _set(engine: Engine, run_id: Any, sql: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE runs SET {sql} WHERE id = :id"), {"id": run_id})


def test_reconciler_backs_off_a_round_whose_execution_failed_before(engine: Engine) -> None:
    fresh, repeat = submit(engine), submit(engine)
    for run in (fresh, repeat):
        c = claim(engine, run.run_id)
        assert c is not None
        start_execution(engine, c)  # both died executing, just now
        _set(engine, run.run_id, "lease_expires_at = now() - interval '1 second', "
                                 "dispatched_at = now() - interval '1 hour'")
    _set(engine, repeat.run_id, "round_attempts = 2")  # ... and the second had failed twice before

    # The first failure is retried at once; the third waits (2^2 - 1) x grace_s = 30 s.
    assert {d.run_id for d in lease_store.due_for_dispatch(engine, grace_s=10)} == {fresh.run_id}
    _set(engine, repeat.run_id, "lease_expires_at = now() - interval '31 seconds'")
    assert {d.run_id for d in lease_store.due_for_dispatch(engine, grace_s=10)} == {repeat.run_id}


def test_round_whose_holders_keep_dying_before_executing_fails_the_run(ctx: Any) -> None:
    # Backstop: a round that kills every worker before its execution is marked must end.
    max_attempts = ctx.settings.max_round_attempts
    run = submit(ctx.engine)
    _set(ctx.engine, run.run_id, f"round_claims = {3 * max_attempts}, status = 'running', "
                                 "lease_expires_at = now() - interval '1 second'")  # and its last holder died
    assert execute_round(ctx, RoundTask(run_id=run.run_id, boundary_seq=0)) is RoundDisposition.RUN_FAILED
    row = run_row(ctx.engine, run.run_id)
    assert (row["status"], row["error_code"]) == ("failed", ROUND_ATTEMPTS_EXHAUSTED)
    assert rows(ctx.engine, "SELECT count(*) AS n FROM model_calls")[0]["n"] == 0


def test_a_resume_starts_executing_at_its_claim(ctx: Any) -> None:
    # A resume calls no model: its claim marks the execution, so a resume that kills its
    # worker spends attempts like any round.
    from tests.support.suspensions import ready_read_one

    run_id, resumes = ready_read_one(ctx)

    def claim_resume() -> Claim | None:
        return Store(ctx.engine).claim_round(
            run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER,
            resume_of=[r.invocation_id for r in resumes],
        )

    first = claim_resume()
    assert first is not None and first.attempt == 1
    assert run_row(ctx.engine, run_id)["execution_fence"] == first.fence
    expire_lease(ctx.engine, run_id)
    second = claim_resume()
    assert second is not None and second.attempt == 2


def test_a_worker_takes_back_a_claim_it_could_not_release_at_once_and_for_free(engine: Engine) -> None:
    # The database went away mid-round: the round gave up (not its fault), and its
    # release failed too, so the lease is still live and the execution mark still set.

    run = submit(engine)
    c = claim(engine, run.run_id)
    assert c is not None
    start_execution(engine, c)

    assert claim(engine, run.run_id) is None  # anyone else waits for the lease
    other_fence = Store(engine).claim_round(
        run.run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER, held_fence=c.fence + 7
    )
    assert other_fence is None  # a fence this process never held takes nothing
    again = Store(engine).claim_round(
        run.run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER, held_fence=c.fence
    )
    assert again is not None and again.fence == c.fence + 1
    assert again.attempt == c.attempt  # giving up for an outage spent nothing
    assert run_row(engine, run.run_id)["round_attempts"] == 0

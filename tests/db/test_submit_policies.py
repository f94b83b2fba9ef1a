"""Idempotent submit and double-texting (root_policy) in the store, on a real PostgreSQL:
one run per owner and key under concurrency, a reused key refused, an expired key
reusable, and reject / interrupt / rollback decided under the Root's lock."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import pytest
from sqlalchemy import Engine, text

from runtime.prepare import prepare_execution
from schema.store import claims as claim_store
from schema.store import runs as run_store
from schema.store.errors import FenceLost, IdempotencyKeyReused, RootBusy
from schema.store.runs import Submitted
from schema.store.store import Store
from schema.wire.record import MessageRecord
from tests.support.db import rows, run_row
from tests.support.requests import scripted_request
from tests.support.store import RUNTIME, claim, expire_lease, record
from worker.client import request_digest

T = TypeVar("T")


def submit(engine: Engine, *, ttl_s: int = 86_400, **fields: Any) -> Submitted:
    """Submit as worker.client.submit stores (the same digest), without the broker."""
    overrides = {k: fields.pop(k) for k in ("idempotency_key", "root_policy") if k in fields}
    raw = {**scripted_request([{"content": "done"}], **fields), **overrides}
    request, prepared = prepare_execution(RUNTIME, raw)
    return run_store.submit_run(
        engine, request, prepared.turn_config.model_dump(mode="json"),
        request_digest=request_digest(request), idempotency_ttl_s=ttl_s,
    )


def counts(engine: Engine) -> dict[str, int]:
    names = ["roots", "runs", "run_checkpoints", "run_events", "messages"]
    found = {n: rows(engine, f"SELECT count(*) AS n FROM {n}")[0]["n"] for n in names}
    found["next_run_seq"] = rows(engine, "SELECT coalesce(sum(next_run_seq), 0) AS n FROM roots")[0]["n"]
    return found


def race(n: int, fn: Callable[[], T]) -> list[T | BaseException]:
    """``fn`` in ``n`` threads released at once; each one's result or error."""
    barrier, results, lock = threading.Barrier(n), [], threading.Lock()

    def go() -> None:
        barrier.wait()
        try:
            result: T | BaseException = fn()
        except BaseException as exc:
            result = exc
        with lock:
            results.append(result)

    threads = [threading.Thread(target=go) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def commit_messages(engine: Engine, run_id: UUID, positions: range, *, finish: bool) -> None:
    """Claim the run and commit one round writing messages at ``positions``."""
    c = claim(engine, run_id)
    assert c is not None
    messages = tuple(MessageRecord(p, {"role": "user", "content": f"m{p}"}, f"d{p}") for p in positions)
    base = record(c) if finish else record(c, outcome="continue", status="running")
    Store(engine).commit_round(dataclasses.replace(base, messages=messages, events=base.events if finish else ()))


def running_root(engine: Engine) -> tuple[Submitted, Submitted]:
    """A Root whose first run completed (messages 0, 1) and whose second is running
    (messages 2, 3 committed, a round in flight)."""
    first = submit(engine)
    commit_messages(engine, first.run_id, range(0, 2), finish=True)
    second = submit(engine, root_id=str(first.root_id))
    commit_messages(engine, second.run_id, range(2, 4), finish=False)
    assert claim(engine, second.run_id, boundary_seq=1) is not None
    return first, second


# --- idempotent submit -----------------------------------------------------------------


def test_concurrent_same_key_submits_store_exactly_one_run(engine: Engine) -> None:
    results = race(8, lambda: submit(engine, idempotency_key="order-42"))
    assert all(isinstance(r, Submitted) for r in results), results
    submitted = [r for r in results if isinstance(r, Submitted)]
    assert len({s.run_id for s in submitted}) == 1
    assert sorted(s.existing for s in submitted) == [False] + [True] * 7
    assert counts(engine)["runs"] == 1 and counts(engine)["roots"] == 1


def test_same_key_same_body_returns_the_run_and_stores_nothing(engine: Engine) -> None:
    first = submit(engine, idempotency_key="k1")
    before = counts(engine)
    again = submit(engine, idempotency_key="k1")
    assert (again.run_id, again.root_id, again.root_seq, again.existing) == (
        first.run_id, first.root_id, first.root_seq, True,
    )
    assert counts(engine) == before
    # Another owner's key is its own.
    other = submit(engine, idempotency_key="k1", owner="team-other")
    assert other.run_id != first.run_id and not other.existing


def test_same_key_different_body_is_refused_and_stores_nothing(engine: Engine) -> None:
    first = submit(engine, idempotency_key="k2")
    before = counts(engine)
    with pytest.raises(IdempotencyKeyReused) as refused:
        submit(engine, idempotency_key="k2", text_input="something else")
    assert refused.value.code == "IDEMPOTENCY_KEY_REUSED" and refused.value.run_id == first.run_id
    with pytest.raises(IdempotencyKeyReused):
        submit(engine, idempotency_key="k2", root_policy="reject")
    assert counts(engine) == before


def test_a_key_older_than_the_ttl_is_cleared_and_reused(engine: Engine) -> None:
    old = submit(engine, idempotency_key="k3", ttl_s=60)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET created_at = now() - interval '61 seconds' WHERE id = :id"),
                     {"id": old.run_id})
    # Even a different body: the expired key binds nothing any more.
    fresh = submit(engine, idempotency_key="k3", ttl_s=60, text_input="a new day")
    assert fresh.run_id != old.run_id and not fresh.existing
    assert run_row(engine, old.run_id)["idempotency_key"] is None
    assert submit(engine, idempotency_key="k3", ttl_s=60, text_input="a new day").run_id == fresh.run_id


# --- double-texting ----------------------------------------------------------------------


def test_reject_on_a_busy_root_stores_nothing(engine: Engine) -> None:
    first = submit(engine)
    before = counts(engine)
    with pytest.raises(RootBusy) as refused:
        submit(engine, root_id=str(first.root_id), root_policy="reject")
    assert refused.value.code == "ROOT_BUSY" and refused.value.run_id == first.run_id
    assert counts(engine) == before
    commit_messages(engine, first.run_id, range(0, 2), finish=True)
    idle = submit(engine, root_id=str(first.root_id), root_policy="reject")
    assert idle.root_seq == 1 and run_row(engine, idle.run_id)["root_policy"] == "reject"


def events_of(engine: Engine, run_id: UUID) -> list[tuple[int, str]]:
    return [(r["seq"], r["kind"]) for r in rows(engine, "SELECT seq, kind FROM run_events WHERE run_id = :r "
                                                "ORDER BY seq", r=run_id)]


def in_flight(engine: Engine, run_id: UUID, boundary_seq: int = 1) -> Any:
    """The claim the run's round in flight holds (``running_root`` took it)."""
    row = run_row(engine, run_id)
    return _FakeClaim(run_id, boundary_seq, row["claim_fence"])


def interrupted_in_flight(engine: Engine) -> tuple[Submitted, Submitted, Any]:
    """``running_root``'s second run, an interrupt submitted to its Root while its round is
    in flight, and the claim that round holds."""
    _, second = running_root(engine)
    third = submit(engine, root_id=str(second.root_id), root_policy="interrupt")
    return second, third, in_flight(engine, second.run_id)


def test_interrupt_lets_the_round_in_flight_commit_then_ends_the_run_at_that_boundary(engine: Engine) -> None:
    second, third, held = interrupted_in_flight(engine)
    assert third.interrupted == (second.run_id,) and third.interrupting == (second.run_id,)
    row = run_row(engine, second.run_id)
    assert (row["status"], row["interrupted_by"]) == ("running", third.run_id)  # its round goes on
    assert claim(engine, third.run_id) is None  # the Root's turn is still the old run's

    # The round in flight commits (its tool calls are on record); the commit ends the run.
    messages = tuple(MessageRecord(p, {"role": "user", "content": f"m{p}"}, f"d{p}") for p in (4, 5))
    base = record(held, outcome="continue", status="running")
    committed = Store(engine).commit_round(dataclasses.replace(base, messages=messages, events=base.events))
    assert committed.interrupted and committed.next_runs == (third.run_id,)
    row = run_row(engine, second.run_id)
    assert (row["status"], row["error_code"], row["boundary_seq"]) == ("cancelled", "INTERRUPTED", 2)
    assert row["error_message"] == f"interrupted by run {third.run_id}: its committed messages are kept"
    assert row["finished_at"] is not None and row["lease_expires_at"] is None
    # The round's own event, then the cancel, gapless.
    assert events_of(engine, second.run_id)[-2:] == [(row["event_seq"] - 1, "run_completed"),
                                                     (row["event_seq"], "run_cancelled")]
    c = claim(engine, third.run_id)
    assert c is not None and [m.position for m in c.new_messages] == [0, 1, 2, 3, 4, 5]


def test_interrupt_cancels_a_run_between_rounds_at_once(engine: Engine) -> None:
    first = submit(engine)
    commit_messages(engine, first.run_id, range(0, 2), finish=True)
    second = submit(engine, root_id=str(first.root_id))
    commit_messages(engine, second.run_id, range(2, 4), finish=False)  # at boundary 1, no round in flight
    third = submit(engine, root_id=str(second.root_id), root_policy="interrupt")
    assert third.interrupted == (second.run_id,) and third.interrupting == ()
    row = run_row(engine, second.run_id)
    assert (row["status"], row["error_code"], row["interrupted_by"]) == ("cancelled", "INTERRUPTED", third.run_id)
    assert str(third.run_id) in row["error_message"]
    assert claim(engine, second.run_id, boundary_seq=1) is None  # its sent round finds it ended
    c = claim(engine, third.run_id)
    assert c is not None and [m.position for m in c.new_messages] == [0, 1, 2, 3]


def test_a_round_that_ends_the_run_keeps_its_own_ending(engine: Engine) -> None:
    second, third, held = interrupted_in_flight(engine)
    final = dataclasses.replace(record(held), messages=(MessageRecord(4, {"role": "assistant", "content": "x"}, "d4"),))
    committed = Store(engine).commit_round(final)
    assert not committed.interrupted and committed.next_runs == (third.run_id,)
    row = run_row(engine, second.run_id)
    assert (row["status"], row["error_code"], row["output"]) == ("completed", None, "done")


def test_an_interrupted_run_whose_holder_died_is_ended_by_its_next_claim(engine: Engine) -> None:
    second, third, held = interrupted_in_flight(engine)
    expire_lease(engine, second.run_id)  # its holder died mid-round
    assert claim(engine, second.run_id, boundary_seq=1) is None
    refusal = Store(engine).explain_refused_claim(second.run_id, 1, resume=False)
    assert refusal.reason == claim_store.INTERRUPT_PENDING and refusal.run is not None
    assert Store(engine).end_interrupted_run(second.run_id, refusal.run["claim_fence"] + 1) == (False, ())
    ended, next_runs = Store(engine).end_interrupted_run(second.run_id, refusal.run["claim_fence"])
    assert ended and next_runs == (third.run_id,)
    row = run_row(engine, second.run_id)
    assert (row["status"], row["error_code"], row["boundary_seq"]) == ("cancelled", "INTERRUPTED", 1)
    assert row["error_message"] == f"interrupted by run {third.run_id}: its committed messages are kept"
    # The fence was bumped: the dead holder's round can never commit now.
    with pytest.raises(FenceLost):
        Store(engine).commit_round(record(held, outcome="continue", status="running"))
    assert Store(engine).end_interrupted_run(second.run_id, row["claim_fence"]) == (False, ())
    c = claim(engine, third.run_id)
    assert c is not None and [m.position for m in c.new_messages] == [0, 1, 2, 3]


def test_a_run_parked_for_its_budget_with_an_interrupt_pending_ends_instead(engine: Engine) -> None:
    second, third, held = interrupted_in_flight(engine)
    assert Store(engine).park_for_budget(second.run_id, held.fence, 1, {"budget_window": "1h"}) == (
        third.run_id,
    )
    row = run_row(engine, second.run_id)
    assert (row["status"], row["error_code"], row["budget_wait"]) == ("cancelled", "INTERRUPTED", None)
    assert events_of(engine, second.run_id)[-1] == (row["event_seq"], "run_cancelled")
    assert claim(engine, third.run_id) is not None


def test_rollback_cancels_the_active_run_and_drops_its_messages(engine: Engine) -> None:
    _, second = running_root(engine)
    third = submit(engine, root_id=str(second.root_id), root_policy="rollback")
    assert third.interrupted == (second.run_id,)
    row = run_row(engine, second.run_id)
    assert (row["status"], row["error_code"], row["interrupted_by"]) == ("cancelled", "ROLLED_BACK", third.run_id)
    assert rows(engine, "SELECT count(*) AS n FROM messages WHERE run_id = :r", r=second.run_id)[0]["n"] == 0
    # At once, round in flight or not: that round, under the old fence, cannot commit now.
    with pytest.raises(FenceLost):
        Store(engine).commit_round(record(_FakeClaim(second.run_id, 1, row["claim_fence"] - 1)))
    c = claim(engine, third.run_id)
    assert c is not None and [m.position for m in c.new_messages] == [0, 1]
    # The new run writes right after the kept messages: the Root stays gapless.
    commit_messages_under(engine, c, range(2, 3))


def test_two_concurrent_interrupts_one_interrupts_the_other_queues_behind_it(engine: Engine) -> None:
    _, second = running_root(engine)
    results = race(2, lambda: submit(engine, root_id=str(second.root_id), root_policy="interrupt"))
    submitted = sorted((r for r in results if isinstance(r, Submitted)), key=lambda s: s.root_seq)
    assert len(submitted) == 2, results
    winner, behind = submitted
    assert winner.interrupted == (second.run_id,) and behind.interrupted == ()
    assert run_row(engine, second.run_id)["interrupted_by"] == winner.run_id
    assert run_row(engine, winner.run_id)["status"] == "queued"
    # Root order: the interrupted run's round in flight commits, and the run ends there;
    # then the winner goes, and the other waits for it.
    assert claim(engine, winner.run_id) is None
    held = in_flight(engine, second.run_id)
    base = record(held, outcome="continue", status="running")
    committed = Store(engine).commit_round(dataclasses.replace(base, messages=()))
    assert committed.interrupted and committed.next_runs == (winner.run_id,)
    assert claim(engine, behind.run_id) is None
    assert claim(engine, winner.run_id) is not None


@dataclasses.dataclass(frozen=True)
class _FakeClaim:
    run_id: UUID
    boundary_seq: int
    fence: int


def commit_messages_under(engine: Engine, c: Any, positions: range) -> None:
    messages = tuple(MessageRecord(p, {"role": "user", "content": f"m{p}"}, f"d{p}") for p in positions)
    Store(engine).commit_round(dataclasses.replace(record(c), messages=messages))

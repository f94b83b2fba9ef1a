"""Spend budgets against a real PostgreSQL: the reservation in the ledger's "before the
call" statement under concurrency, the settlement in its "after the call" statement, a
dead holder's reservation released once, and parking and waking a run."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from runtime.budget import BudgetShortfall
from schema.store import budgets
from schema.store import runs as run_store
from schema.store.budgets import BudgetRefused
from schema.store.errors import FenceLost
from schema.store.store import Store
from schema.store.suspensions import suspended_with_all_inputs
from schema.wire.claim import Claim
from tests.support.db import rows, run_row
from tests.support.store import claim, expire_lease, submit

OWNER = "team-test"


def claimed(engine: Engine) -> Claim:
    c = claim(engine, submit(engine).run_id)
    assert c is not None
    return c


def start(engine: Engine, c: Claim, estimate: int) -> int:
    return Store(engine).record_model_call_started(c.run_id, c.boundary_seq, c.attempt, c.fence, "req", estimate)


def finish(engine: Engine, c: Claim, call_id: int, used: tuple[int, int]) -> None:
    Store(engine).record_model_call_finished(
        call_id, c.run_id, c.fence,
        response_digest="resp", input_tokens=used[0], output_tokens=used[1], error_code=None,
    )


def spend(engine: Engine) -> tuple[int, int]:
    found = rows(engine, "SELECT coalesce(sum(used), 0) AS u, coalesce(sum(reserved), 0) AS r FROM owner_spend "
                         "WHERE owner = :o", o=OWNER)[0]
    return int(found["u"]), int(found["r"])


def calls(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM model_calls ORDER BY id")


@pytest.mark.parametrize("window", sorted(budgets.BUDGET_WINDOWS_S))
def test_the_sql_window_is_the_python_window(engine: Engine, window: str) -> None:
    sql = f"SELECT now() AS at, {budgets.window_start_sql(':w')} AS start"
    with engine.connect() as conn:
        found = conn.execute(text(sql), {"w": window}).one()
    assert found.start == budgets.window_start(window, found.at)


def test_an_owner_without_a_budget_reserves_nothing(engine: Engine) -> None:
    c = claimed(engine)
    call_id = start(engine, c, 500)
    finish(engine, c, call_id, (10, 5))
    (call,) = calls(engine)
    assert (call["reserved_tokens"], call["spend_window_start"], call["reservation_open"]) == (None, None, False)
    assert rows(engine, "SELECT * FROM owner_spend") == []


def test_a_refused_reservation_writes_no_ledger_row_and_reserves_nothing(engine: Engine) -> None:
    budgets.set_owner_budget(engine, OWNER, 1000, "1h", "fail")
    first, second = claimed(engine), claimed(engine)
    start(engine, first, 700)
    with pytest.raises(BudgetRefused) as refused:
        start(engine, second, 400)
    shortfall = refused.value.shortfall
    assert (shortfall["on_budget"], shortfall["token_budget"], shortfall["reserved"], shortfall["estimate"]) == (
        "fail", 1000, 700, 400,
    )
    assert shortfall["window_ends_at"] - shortfall["window_start"] == timedelta(hours=1)
    assert [c["run_id"] for c in calls(engine)] == [first.run_id]  # no row for the refused call
    assert spend(engine) == (0, 700)
    with pytest.raises(BudgetRefused):  # an estimate above the whole budget: not even a spend row
        start(engine, second, 1001)


def test_settlement_replaces_the_reservation_by_the_real_usage(engine: Engine) -> None:
    budgets.set_owner_budget(engine, OWNER, 1000, "1d", "fail")
    c = claimed(engine)
    call_id = start(engine, c, 600)
    assert spend(engine) == (0, 600)
    finish(engine, c, call_id, (120, 30))
    assert spend(engine) == (150, 0)
    (call,) = calls(engine)
    assert (call["reserved_tokens"], call["reservation_open"]) == (600, False)


def test_eight_threads_never_reserve_past_the_budget(engine: Engine) -> None:
    """The reservation statement from 8 threads at once, each reserving and settling until
    refused: reserved + used never passes the budget, and every refusal wrote no row."""
    budget, estimate = 5000, 300
    budgets.set_owner_budget(engine, OWNER, budget, "1h", "fail")
    claims = [claimed(engine) for _ in range(8)]
    barrier = threading.Barrier(len(claims))
    peaks: list[int] = []
    errors: list[BaseException] = []

    def work(c: Claim) -> None:
        try:
            barrier.wait()
            while True:
                try:
                    call_id = start(engine, c, estimate)
                except BudgetRefused:
                    return
                peaks.append(sum(spend(engine)))
                finish(engine, c, call_id, (estimate - 60, 50))  # the real usage: below the estimate
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    used, reserved = spend(engine)
    assert reserved == 0
    assert used <= budget and max(peaks) <= budget
    assert used + estimate > budget  # it did spend the budget down to less than one call
    made = [c for c in calls(engine) if c["status"] == "succeeded"]
    assert len(made) == used // (estimate - 10)


def test_a_dead_holders_reservation_is_released_once(engine: Engine) -> None:
    budgets.set_owner_budget(engine, OWNER, 1000, "1h", "fail")
    c = claimed(engine)
    call_id = start(engine, c, 400)
    assert budgets.release_dead_reservations(engine) == 0  # its holder still holds the claim
    expire_lease(engine, c.run_id)  # the holder died with the call in flight
    assert budgets.release_dead_reservations(engine) == 1
    assert spend(engine) == (0, 0)
    assert budgets.release_dead_reservations(engine) == 0
    with pytest.raises(FenceLost):  # it was only paused: its call returns, taken over or not
        claim(engine, c.run_id)
        finish(engine, c, call_id, (100, 20))
    assert spend(engine) == (120, 0)  # the usage counts; the reservation is not released twice


def test_a_parked_run_waits_until_its_budget_is_raised(engine: Engine) -> None:
    budgets.set_owner_budget(engine, OWNER, 100, "1h", "wait")
    c = claimed(engine)
    with pytest.raises(BudgetRefused) as refused:
        start(engine, c, 300)
    wait = BudgetShortfall(**refused.value.shortfall).to_json()
    Store(engine).park_for_budget(c.run_id, c.fence, c.boundary_seq, wait)
    row = run_row(engine, c.run_id)
    assert (row["status"], row["lease_expires_at"], row["boundary_seq"]) == ("suspended", None, 0)
    (shown,) = run_store.get_run_view(engine, c.run_id).waiting_for
    assert (shown.kind, shown.token_budget, shown.estimate_tokens, shown.tool_call_id) == ("budget", 100, 300, None)
    with pytest.raises(FenceLost):  # a stale holder cannot park it again
        Store(engine).park_for_budget(c.run_id, c.fence, c.boundary_seq, wait)

    assert budgets.wake_budget_waits(engine) == []  # still short
    assert budgets.set_owner_budget(engine, OWNER, 250, "1h", "wait") == []  # raised, still short
    assert budgets.set_owner_budget(engine, OWNER, 400, "1h", "wait") == [(c.run_id, 0)]
    row = run_row(engine, c.run_id)
    assert (row["status"], row["budget_wait"]) == ("queued", None)
    assert run_store.get_run_view(engine, c.run_id).waiting_for == []
    again = claim(engine, c.run_id)
    assert again is not None and again.fence == c.fence + 1


def test_a_parked_run_wakes_when_its_window_rolls_over(engine: Engine) -> None:
    budgets.set_owner_budget(engine, OWNER, 100, "1h", "wait")
    c = claimed(engine)
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    wait = {"budget_window": "1h", "window_start": past, "window_ends_at": past, "token_budget": 100,
            "used": 100, "reserved": 0, "estimate": 300}
    Store(engine).park_for_budget(c.run_id, c.fence, c.boundary_seq, wait)
    assert budgets.budget_changed(engine, OWNER) == [(c.run_id, 0)]
    assert budgets.budget_changed(engine, OWNER) == []  # once


def test_a_parked_run_is_no_suspension_for_the_resume_repair(engine: Engine) -> None:
    budgets.set_owner_budget(engine, OWNER, 100, "1h", "wait")
    c = claimed(engine)
    wait = {"budget_window": "1h", "window_start": "2026-01-01T00:00:00+00:00",
            "window_ends_at": "2999-01-01T00:00:00+00:00", "token_budget": 100, "used": 0, "reserved": 0,
            "estimate": 300}
    Store(engine).park_for_budget(c.run_id, c.fence, c.boundary_seq, wait)
    with engine.begin() as conn:  # parked a while ago
        conn.execute(text("UPDATE runs SET updated_at = now() - interval '1 minute' WHERE id = :id"), {"id": c.run_id})
    assert suspended_with_all_inputs(engine) == []
    assert budgets.wake_budget_waits(engine) == []

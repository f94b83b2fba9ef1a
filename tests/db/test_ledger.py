"""The model-call ledger against a real PostgreSQL: every call that was paid for has its
outcome and usage on record, including a call whose holder lost its claim while the
call was in flight (marked stale), and recording it changes nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from schema.store import limits
from schema.store import runs as run_store
from schema.store.errors import FenceLost
from schema.store.store import Store
from schema.wire.claim import Claim
from schema.wire.owners import OwnerLimitsChange
from tests.support.db import rows
from tests.support.store import HOLDER, claim, expire_lease, submit

TABLES = ["runs", "rounds", "messages", "tool_invocations", "run_events", "run_checkpoints"]


def snapshot(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    out = {t: rows(engine, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}
    out["model_calls"] = rows(engine, "SELECT * FROM model_calls ORDER BY id")
    return out


def start(engine: Engine, c: Claim) -> int:
    return Store(engine).record_model_call_started(c.run_id, c.boundary_seq, c.attempt, c.fence, "req")


def finish(engine: Engine, c: Claim, call_id: int, *, tokens: tuple[int, int] = (120, 30)) -> None:
    Store(engine).record_model_call_finished(
        call_id, c.run_id, c.fence,
        response_digest="resp", input_tokens=tokens[0], output_tokens=tokens[1], error_code=None,
    )


def call_row(engine: Engine, call_id: int) -> dict[str, Any]:
    return rows(engine, "SELECT * FROM model_calls WHERE id = :id", id=call_id)[0]


def test_call_of_a_holder_taken_over_in_flight_is_recorded_stale_with_its_usage(engine: Engine) -> None:
    run = submit(engine)
    stale = claim(engine, run.run_id)
    assert stale is not None
    stale_call = start(engine, stale)  # the model call is in flight now...
    expire_lease(engine, run.run_id)  # ... its worker pauses past its lease ...
    current = claim(engine, run.run_id)  # ... and another worker takes the round over
    assert current is not None
    current_call = start(engine, current)
    finish(engine, current, current_call, tokens=(100, 10))
    before = snapshot(engine)

    with pytest.raises(FenceLost) as lost:
        finish(engine, stale, stale_call)  # the stale call returns: paid for, so recorded
    assert lost.value.fence == stale.fence

    recorded = call_row(engine, stale_call)
    assert (recorded["status"], recorded["stale"], recorded["input_tokens"], recorded["output_tokens"]) == (
        "succeeded", True, 120, 30,
    )
    assert recorded["response_digest"] == "resp" and recorded["finished_at"] is not None
    after = snapshot(engine)
    assert {k: v for k, v in after.items() if k != "model_calls"} == {
        k: v for k, v in before.items() if k != "model_calls"
    }, "a stale holder's ledger update changed something besides its own row"
    assert [c for c in after["model_calls"] if c["id"] != stale_call] == [
        c for c in before["model_calls"] if c["id"] != stale_call
    ]
    assert not call_row(engine, current_call)["stale"]

    view = run_store.get_run_view(engine, run.run_id)
    assert (view.model_calls, view.stale_model_calls, view.input_tokens, view.output_tokens) == (2, 1, 220, 40)


def test_ledger_update_touches_only_the_callers_own_started_row_and_only_once(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None
    first_call = start(engine, first)
    expire_lease(engine, run.run_id)
    second = claim(engine, run.run_id)
    assert second is not None
    second_call = start(engine, second)
    before = snapshot(engine)

    with pytest.raises(FenceLost):  # the stale holder naming the current holder's row
        finish(engine, first, second_call)
    with pytest.raises(FenceLost):  # the current holder naming the stale holder's row
        finish(engine, second, first_call)
    assert snapshot(engine) == before

    finish(engine, second, second_call, tokens=(5, 1))
    recorded = call_row(engine, second_call)
    with pytest.raises(FenceLost):  # a second outcome for one call is refused
        finish(engine, second, second_call, tokens=(999, 999))
    assert call_row(engine, second_call) == recorded
    assert (recorded["status"], recorded["stale"], recorded["input_tokens"]) == ("succeeded", False, 5)


def test_failed_call_of_a_stale_holder_is_recorded_stale_and_failed(engine: Engine) -> None:
    run = submit(engine)
    stale = claim(engine, run.run_id)
    assert stale is not None
    call_id = start(engine, stale)
    run_store.cancel_run(engine, run.run_id)  # the run is cancelled while the call is in flight
    with pytest.raises(FenceLost):
        Store(engine).record_model_call_finished(
            call_id, stale.run_id, stale.fence,
            response_digest=None, input_tokens=None, output_tokens=None, error_code="MODEL_UNAVAILABLE",
        )
    recorded = call_row(engine, call_id)
    assert (recorded["status"], recorded["stale"], recorded["error_code"]) == ("failed", True, "MODEL_UNAVAILABLE")


def test_the_ledgers_asynchronous_commit_stays_with_its_own_statements(engine: Engine) -> None:
    """The ledger rows commit without waiting for the WAL flush, set by each statement for
    its own transaction: the pooled connection they ran on keeps committing synchronously
    (a claim or a round's commit on it must wait for the flush)."""
    single = create_engine(engine.url.render_as_string(hide_password=False), pool_size=1, max_overflow=0)
    try:
        run = submit(single)
        held = claim(single, run.run_id)
        assert held is not None
        finish(single, held, start(single, held))
        with single.connect() as conn:  # the one connection both statements ran on
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
        (last,) = rows(engine, "SELECT status FROM model_calls WHERE run_id = :id", id=run.run_id)
        assert last["status"] == "succeeded"
    finally:
        single.dispose()


def warm_claim(engine: Engine, run_id: Any, digest: str | None = "expected") -> Claim | None:
    return Store(engine).claim_round(
        run_id, 0, lease_s=30, after_position=-1, cold=False, holder=HOLDER, start_call_digest=digest
    )


def test_a_warm_claim_writes_the_rounds_before_call_row_and_marks_its_execution(engine: Engine) -> None:
    run = submit(engine)
    c = warm_claim(engine, run.run_id)
    assert c is not None and c.started_call_id is not None
    started = call_row(engine, c.started_call_id)
    assert (started["status"], started["claim_fence"], started["attempt"], started["request_digest"]) == (
        "started", c.fence, 1, "expected"
    )
    assert run_store_row(engine, run.run_id)["execution_fence"] == c.fence  # its execution started at the claim
    # The "after" statement writes the request really sent.
    Store(engine).record_model_call_finished(
        c.started_call_id, c.run_id, c.fence, response_digest="resp", input_tokens=1, output_tokens=1,
        error_code=None, request_digest="sent",
    )
    assert call_row(engine, c.started_call_id)["request_digest"] == "sent"
    # Used, the row is no longer dropped as unused.
    Store(engine).drop_unused_model_call(c.started_call_id, c.run_id, c.fence)
    assert call_row(engine, c.started_call_id)["status"] == "succeeded"


def test_a_warm_claim_dies_and_its_successor_spends_an_attempt(engine: Engine) -> None:
    run = submit(engine)
    first = warm_claim(engine, run.run_id)
    assert first is not None and first.started_call_id is not None
    expire_lease(engine, run.run_id)  # its holder died: whether the call was made is unknown
    second = claim(engine, run.run_id)
    assert second is not None and second.attempt == 2 and second.earlier_model_calls == 1
    assert second.started_call_id is None  # a cold claim writes no call row


def test_no_call_row_at_the_claim_for_a_budgeted_owner_or_an_unused_call(engine: Engine) -> None:
    run = submit(engine)
    c = warm_claim(engine, run.run_id, digest=None)
    assert c is not None and c.started_call_id is None
    assert run_store_row(engine, run.run_id)["execution_fence"] is None
    # An owner with a token budget: its before-call row reserves the estimate, so it is
    # written by the call itself.
    limits.set_owner_limits(engine, "team-budget", OwnerLimitsChange.of(token_budget=1000, budget_window="1d"))
    budgeted = submit(engine, owner="team-budget")
    b = warm_claim(engine, budgeted.run_id)
    assert b is not None and b.started_call_id is None
    # A row the round never used is dropped: only calls that may have been made stay.
    other = submit(engine)
    o = warm_claim(engine, other.run_id)
    assert o is not None and o.started_call_id is not None
    Store(engine).drop_unused_model_call(o.started_call_id, o.run_id, o.fence)
    assert rows(engine, "SELECT id FROM model_calls WHERE run_id = :id", id=other.run_id) == []


def run_store_row(engine: Engine, run_id: Any) -> dict[str, Any]:
    return rows(engine, "SELECT * FROM runs WHERE id = :id", id=run_id)[0]

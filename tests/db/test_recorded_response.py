"""The accepted model response is durable before any tool runs, against a real PostgreSQL:
the ledger keeps the response of a call that succeeded, and the next claim of that round
hands it back - only a succeeded call's, only at the claimed boundary, the latest - so
a round redone after its holder died goes on from it without calling the model again."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import Engine

import worker.engine.round as round_module
from runtime.models.base import ModelRequest, ModelResponse
from schema.store.errors import FenceLost
from schema.store.store import Store
from schema.wire import RoundTask
from schema.wire.claim import Claim, RecordedResponse
from tests.support.db import model_calls, round_rows, run_row
from tests.support.requests import scripted_request
from tests.support.store import HOLDER, claim, expire_lease, record, submit
from tests.support.suspensions import ready_read_one
from worker import client
from worker.engine.round import RoundDisposition

ADD = {"content": None, "tool_calls": [{"id": "call_0_0", "name": "add", "args": {"a": 2.5, "b": 3}}]}
ECHO = {"content": "let me echo", "tool_calls": [{"id": "call_1_0", "name": "echo", "args": {"deep": [{"x": None}]}}]}


def call(engine: Engine, c: Claim, request_digest: str, *, response: dict[str, Any] | None, error: str | None = None,
         ) -> None:
    """One model call of holder ``c``, started and finished on the ledger."""
    call_id = Store(engine).record_model_call_started(c.run_id, c.boundary_seq, c.attempt, c.fence, request_digest)
    Store(engine).record_model_call_finished(
        call_id, c.run_id, c.fence,
        response_digest=None if error else "digest", input_tokens=10, output_tokens=2, error_code=error,
        response=response,
    )


def taken_over(engine: Engine, c: Claim, boundary_seq: int = 0) -> Claim:
    """``c``'s holder died: its lease runs out, and another worker claims the round."""
    expire_lease(engine, c.run_id)
    again = claim(engine, c.run_id, boundary_seq)
    assert again is not None
    return again


def test_a_claim_hands_back_the_latest_succeeded_response_of_its_boundary_only(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None and first.recorded_response is None

    # Died with its call on the wire: nothing was accepted, nothing to go on from.
    Store(engine).record_model_call_started(first.run_id, 0, first.attempt, first.fence, "req-0")
    second = taken_over(engine, first)
    assert second.recorded_response is None

    # A call that failed has no response to give back, whatever the caller passed.
    call(engine, second, "req-0", response=ADD, error="MODEL_ERROR")
    third = taken_over(engine, second)
    assert third.recorded_response is None
    assert run_row(engine, run.run_id)["execution_fence"] is None  # no execution started yet

    call(engine, third, "req-0", response=ADD)
    fourth = taken_over(engine, third)
    assert fourth.recorded_response == RecordedResponse("req-0", ADD)
    # The claim itself starts the execution: the round goes straight to its tools.
    assert run_row(engine, run.run_id)["execution_fence"] == fourth.fence

    # Two accepted responses at one boundary (the context changed between them): the latest.
    call(engine, fourth, "req-0-rebuilt", response=ECHO)
    fifth = taken_over(engine, fourth)
    assert fifth.recorded_response == RecordedResponse("req-0-rebuilt", ECHO)

    # Round 0 commits: the next round's claim has nothing of round 0's.
    Store(engine).commit_round(record(fifth, outcome="continue", status="running"))
    following = claim(engine, run.run_id, boundary_seq=1)
    assert following is not None and following.recorded_response is None
    assert run_row(engine, run.run_id)["execution_fence"] is None


def test_a_stale_holders_accepted_response_is_handed_back_too(engine: Engine) -> None:
    # Paid for by a holder that had lost its claim while the call was in flight: the
    # response is as good for the same request, and it is on the ledger.
    run = submit(engine)
    paused = claim(engine, run.run_id)
    assert paused is not None
    call_id = Store(engine).record_model_call_started(paused.run_id, 0, paused.attempt, paused.fence, "req")
    current = taken_over(engine, paused)
    assert current.recorded_response is None
    with pytest.raises(FenceLost):  # recorded all the same, marked stale
        Store(engine).record_model_call_finished(
            call_id, paused.run_id, paused.fence,
            response_digest="d", input_tokens=1, output_tokens=1, error_code=None, response=ADD,
        )
    (row,) = model_calls(engine, run.run_id)
    assert (row["status"], row["stale"], row["response"]) == ("succeeded", True, ADD)
    assert taken_over(engine, current).recorded_response == RecordedResponse("req", ADD)


def test_a_resume_claim_hands_back_no_response(ctx: Any) -> None:
    # The suspended round's call succeeded and is on the ledger; a resume calls no model.
    run_id, resumes = ready_read_one(ctx)
    assert [c["status"] for c in model_calls(ctx.engine, run_id)] == ["succeeded"]
    resumed = Store(ctx.engine).claim_round(
        run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER,
        resume_of=[r.invocation_id for r in resumes],
    )
    assert resumed is not None and resumed.recorded_response is None


def test_a_round_redone_after_its_holder_died_past_the_call_goes_on_from_the_recorded_response(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]
    run_id = client.submit(scripted_request(turns), ctx=ctx).run_id
    real = round_module.drive_react_loop

    def stopped_in_its_tools(deps: Any, state: Any, hooks: Any) -> Any:
        real(deps, state, hooks)
        raise SystemExit  # the worker stopped before the round committed

    monkeypatch.setattr(round_module, "drive_react_loop", stopped_in_its_tools)
    with pytest.raises(SystemExit):
        round_module.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0))
    monkeypatch.undo()
    (paid,) = model_calls(ctx.engine, run_id)
    assert paid["status"] == "succeeded" and paid["response"] is not None

    assert round_module.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    # No second call; the commit let go of the response (the messages hold it now).
    (settled,) = model_calls(ctx.engine, run_id)
    assert settled == {**paid, "response": None}
    (committed,) = round_rows(ctx.engine, run_id)
    assert committed["claim_fence"] == paid["claim_fence"] + 1
    assert committed["accepted_response_digest"] == ModelResponse.from_json(paid["response"]).digest()
    assert committed["accepted_response_digest"] == paid["response_digest"]  # no call ids were renamed


def test_a_response_no_jsonb_can_hold_fails_the_round_and_is_not_kept(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = client.submit(scripted_request([{"content": "unused"}]), ctx=ctx).run_id

    class NulModel:
        def complete(self, request: ModelRequest) -> ModelResponse:
            return ModelResponse(content="a\x00b")

    real = round_module.drive_react_loop
    monkeypatch.setattr(
        round_module,
        "drive_react_loop",
        lambda deps, state, hooks: real(dataclasses.replace(deps, model=NulModel()), state, hooks),
    )
    assert round_module.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    row = run_row(ctx.engine, run_id)
    assert (row["status"], row["error_code"]) == ("failed", "MODEL_RESPONSE_INVALID")
    (paid,) = model_calls(ctx.engine, run_id)
    assert (paid["status"], paid["response"]) == ("succeeded", None)

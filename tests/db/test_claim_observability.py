"""What the claim statement hands the worker's metrics and traces, in its one round trip:
the run's stored traceparent, the model calls earlier claims made at the boundary (a
call now is a duplicate) and the time since the previous round committed."""

from __future__ import annotations

from sqlalchemy import Engine

from runtime.prepare import prepare_execution
from schema.store import runs as run_store
from schema.store import telemetry
from schema.store.store import Store
from tests.support.requests import scripted_request
from tests.support.store import HOLDER, RUNTIME, claim, expire_lease, record

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_claim_returns_the_traceparent_stored_at_submit(engine: Engine) -> None:
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}]))
    run = run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"), TRACEPARENT)
    c = claim(engine, run.run_id)
    assert c is not None and c.trace_context == TRACEPARENT
    assert telemetry.run_trace_context(engine, run.run_id) == TRACEPARENT


def test_a_claim_after_a_holder_died_in_its_call_counts_that_call(engine: Engine) -> None:
    request, prepared = prepare_execution(
        RUNTIME, scripted_request([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "3"}])
    )
    run = run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"))
    first = claim(engine, run.run_id)
    assert first is not None and first.earlier_model_calls == 0 and first.trace_context is None
    assert first.queue_lag_s is None  # no previous round
    Store(engine).record_model_call_started(run.run_id, 0, first.attempt, first.fence, "req")
    expire_lease(engine, run.run_id)  # the holder died with its call on the wire
    second = claim(engine, run.run_id)
    assert second is not None and second.earlier_model_calls == 1


def test_the_next_rounds_claim_says_how_long_since_the_commit(engine: Engine) -> None:
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "a"}, {"content": "b"}]))
    run = run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"))
    first = claim(engine, run.run_id)
    assert first is not None
    Store(engine).commit_round(record(first, outcome="continue", status="running"))
    nxt = Store(engine).claim_round(run.run_id, 1, lease_s=30, after_position=-1, cold=True, holder=HOLDER)
    assert nxt is not None and nxt.queue_lag_s is not None and nxt.queue_lag_s >= 0
    assert nxt.earlier_model_calls == 0

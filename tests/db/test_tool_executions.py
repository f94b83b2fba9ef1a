"""The at-most-once record of a tool call against a real PostgreSQL: a start is written
only under the current claim, a second start (a re-executed round) gets the first one's
record instead, an operator's retry restarts the call once per answer, and a handler that
suspended before doing anything leaves no start behind."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from schema.store import effects
from schema.store.errors import FenceLost
from schema.store.store import Store
from tests.support.db import rows
from tests.support.store import claim, expire_lease, submit


def record(engine: Engine, run_id, call: str = "call_0_0") -> list[dict]:
    return rows(engine, "SELECT claim_fence, executions, status, result, retry_of FROM tool_executions "
                "WHERE run_id = :id AND tool_call_id = :call", id=run_id, call=call)


def test_a_re_executed_round_finds_the_start_of_a_call_that_never_ended(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None
    # it starts
    assert Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", first.fence, retry_of=None) is None
    expire_lease(engine, run.run_id)  # the worker died inside the handler
    second = claim(engine, run.run_id)
    assert second is not None

    found = Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", second.fence, retry_of=None)
    assert found == effects.ExecutionRecord(status=None, result=None, executions=1)
    # Another call of the same round is a call of its own.
    assert Store(engine).start_tool_execution(run.run_id, 0, "call_0_1", second.fence, retry_of=None) is None
    assert record(engine, run.run_id) == [
        {"claim_fence": first.fence, "executions": 1, "status": None, "result": None, "retry_of": None}
    ]


def test_a_recorded_end_is_what_a_later_execution_gets(engine: Engine) -> None:
    run = submit(engine)
    first = claim(engine, run.run_id)
    assert first is not None
    Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", first.fence, retry_of=None)
    Store(engine).finish_tool_execution(run.run_id, "call_0_0", first.fence, "completed", {"sent": 1})
    expire_lease(engine, run.run_id)  # died after the handler, before the round's commit
    second = claim(engine, run.run_id)
    assert second is not None
    found = Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", second.fence, retry_of=None)
    assert found == effects.ExecutionRecord(status="completed", result={"sent": 1}, executions=1)


def test_a_stale_holder_cannot_start_a_call(engine: Engine) -> None:
    run = submit(engine)
    stale = claim(engine, run.run_id)
    assert stale is not None
    expire_lease(engine, run.run_id)
    assert claim(engine, run.run_id) is not None
    with pytest.raises(FenceLost):
        Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", stale.fence, retry_of=None)
    assert record(engine, run.run_id) == []


def test_a_retry_restarts_the_call_once_per_answer(engine: Engine) -> None:
    run = submit(engine)
    c1 = claim(engine, run.run_id)
    assert c1 is not None
    Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", c1.fence, retry_of=None)
    expire_lease(engine, run.run_id)
    c2 = claim(engine, run.run_id)
    assert c2 is not None
    # An operator answered the wait "inv-1" with retry-tool: the call starts again ...
    assert Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", c2.fence, retry_of="inv-1") is None
    expire_lease(engine, run.run_id)  # ... and that worker dies inside the handler too
    c3 = claim(engine, run.run_id)
    assert c3 is not None
    # The same answer does not start it a third time: its outcome is unknown again.
    again = Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", c3.fence, retry_of="inv-1")
    assert again == effects.ExecutionRecord(status=None, result=None, executions=2)
    # A new answer (to the new wait) does.
    assert Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", c3.fence, retry_of="inv-2") is None
    assert record(engine, run.run_id)[0]["executions"] == 3


def test_a_handler_that_suspended_leaves_no_start(engine: Engine) -> None:
    run = submit(engine)
    c = claim(engine, run.run_id)
    assert c is not None
    Store(engine).start_tool_execution(run.run_id, 0, "call_0_0", c.fence, retry_of=None)
    Store(engine).finish_tool_execution(run.run_id, "call_0_0", c.fence, None, None)
    assert record(engine, run.run_id) == []

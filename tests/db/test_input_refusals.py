"""Every JSON value a user can send, against a real PostgreSQL through ``worker.client``:
what no store can hold (NaN, Infinity, NUL, unpaired surrogates, nesting past
MAX_JSON_DEPTH, integers past MAX_INT_DIGITS, a request that is not an object) is refused
as ``RequestInvalid`` naming the field, and no table changes; what sits at the limits is
stored, digested and run to completion."""

from __future__ import annotations

import math
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from runtime.canonical import MAX_INT_DIGITS, MAX_JSON_DEPTH, NON_FINITE, TOO_DEEP, TOO_MANY_DIGITS, digest
from runtime.errors import RequestInvalid
from schema.store.tx import make_engine
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.shapes import nested_lists, nested_objects
from tests.support.suspensions import READ_ONE, assert_unchanged, drive, snapshot, suspended_run
from worker import client

AWAIT = [{"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}, {"content": "approved"}]
ARGS = "config.model.turns[0].tool_calls[0].args"


def echo_request(args: Any) -> dict[str, Any]:
    return scripted_request([{"tool_calls": [{"name": "echo", "args": args}]}, {"content": "echoed"}], tools=["echo"])


BAD_SUBMISSIONS: list[Any] = [
    pytest.param([echo_request({})], "request", "must be a JSON object", id="a_list"),
    pytest.param("{}", "request", "must be a JSON object", id="a_string"),
    pytest.param(None, "request", "must be a JSON object", id="none"),
    pytest.param(echo_request({"x": nested_lists(255)}), ARGS + ".x" + "[0]" * 56, TOO_DEEP, id="255_deep"),
    pytest.param(echo_request({"x": nested_lists(1000)}), ARGS + ".x" + "[0]" * 56, TOO_DEEP, id="1000_deep"),
    pytest.param(echo_request({"x": nested_objects(100_000)}), ARGS + ".x" + ".a" * 56, TOO_DEEP, id="100000_deep"),
    pytest.param(echo_request({"n": 10**MAX_INT_DIGITS}), ARGS + ".n", TOO_MANY_DIGITS, id="4001_digits"),
    pytest.param(echo_request({"n": 10**4300}), ARGS + ".n", TOO_MANY_DIGITS, id="4301_digits"),
    pytest.param(echo_request({"f": math.nan}), ARGS + ".f", NON_FINITE, id="nan"),
    pytest.param(echo_request({"f": [math.inf]}), ARGS + ".f[0]", NON_FINITE, id="infinity"),
    pytest.param({**echo_request({}), "input": "go\x00"}, "input", "NUL", id="nul_in_input"),
    pytest.param(echo_request({"k\ud800": 1}), ARGS, "unpaired surrogate", id="surrogate_in_a_key"),
]


@pytest.mark.parametrize(("raw", "field", "reason"), BAD_SUBMISSIONS)
def test_a_submission_no_store_can_hold_is_refused_and_stores_nothing(ctx, raw: Any, field: str, reason: str) -> None:
    before = snapshot(ctx)

    with pytest.raises(RequestInvalid) as refused:
        client.submit(raw, ctx=ctx)

    assert refused.value.field == field and reason in refused.value.reason, refused.value.message
    assert_unchanged(ctx, before, f"submitting {field}")


def test_a_request_at_the_limits_is_stored_and_runs_with_the_same_digest(ctx) -> None:
    # args is level 8 of the request: its values may nest 56 more levels.
    biggest = 10**MAX_INT_DIGITS - 1
    args = {"x": nested_objects(MAX_JSON_DEPTH - 9, leaf=[biggest, -biggest, "é", 1e16])}
    run_id = client.submit(echo_request(args), ctx=ctx).run_id

    assert drive(ctx, run_id)["status"] == "completed"
    (tool,) = rows(ctx.engine, "SELECT result, result_digest FROM tool_invocations WHERE run_id = :id", id=run_id)
    assert tool["result"] == args  # through jsonb and back
    assert tool["result_digest"] == digest(args) == digest(tool["result"])


BAD_PREREQUISITES: list[Any] = [
    pytest.param("approval", math.nan, "value", NON_FINITE, id="nan"),
    pytest.param("approval", math.inf, "value", NON_FINITE, id="infinity"),
    pytest.param("approval", {"a": -math.inf}, "value.a", NON_FINITE, id="minus_infinity"),
    pytest.param("approval", nested_lists(900), "value" + "[0]" * MAX_JSON_DEPTH, TOO_DEEP, id="900_deep"),
    pytest.param("approval", 10**MAX_INT_DIGITS, "value", TOO_MANY_DIGITS, id="4001_digits"),
    pytest.param("approval", "yes\x00", "value", "NUL", id="nul_in_value"),
    pytest.param("approval", {"\ud800": 1}, "value", "unpaired surrogate", id="surrogate_in_a_key_of_the_value"),
    pytest.param("appro\x00val", True, "key", "NUL", id="nul_in_key"),
    pytest.param("approval\udfff", True, "key", "unpaired surrogate", id="surrogate_in_key"),
]


@pytest.mark.parametrize(("key", "value", "field", "reason"), BAD_PREREQUISITES)
def test_a_prerequisite_no_store_can_hold_is_refused_and_stores_nothing(
    ctx, key: str, value: Any, field: str, reason: str
) -> None:
    run_id = suspended_run(ctx, AWAIT, ["await_prerequisite"])
    before = snapshot(ctx)

    with pytest.raises(RequestInvalid) as refused:
        client.resolve(run_id, key, value, ctx=ctx)

    assert refused.value.field == field and reason in refused.value.reason, refused.value.message
    assert_unchanged(ctx, before, f"resolving with a bad {field}")


def test_a_prerequisite_at_the_limits_resumes_the_run_and_comes_back_whole(ctx) -> None:
    run_id = suspended_run(ctx, AWAIT, ["await_prerequisite"])
    value = nested_lists(MAX_JSON_DEPTH - 1, leaf={"n": 10**MAX_INT_DIGITS - 1, "s": "é"})

    receipt = client.resolve(run_id, "approval", value, ctx=ctx)

    assert receipt.stored and receipt.resumes
    assert drive(ctx, run_id)["status"] == "completed"  # the resume wraps it in results and messages
    (tool,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=run_id)
    assert tool == {"status": "completed", "result": {"key": "approval", "value": value}}
    assert client.resolve(run_id, "approval", value, ctx=ctx).stored is False  # the stored value compares equal


BAD_DELIVERIES: list[Any] = [
    pytest.param("call_0_0", {"notes/a.txt": "body\x00"}, "files[0].content", "NUL", id="nul_in_content"),
    pytest.param("call_0_0", {"notes/a.txt": "\ud83d"}, "files[0].content", "unpaired surrogate", id="surrogate"),
    pytest.param("call_0_0", {"notes/a\x00.txt": "body"}, "files[0].path", "NUL", id="nul_in_path"),
    pytest.param("call_0_0", {"notes/\udc80.txt": "b"}, "files[0].path", "unpaired surrogate", id="surrogate_in_path"),
    pytest.param("call_0_0\x00", {"notes/a.txt": "body"}, "tool_call_id", "NUL", id="nul_in_tool_call_id"),
]


@pytest.mark.parametrize(("call", "files", "field", "reason"), BAD_DELIVERIES)
def test_a_delivery_no_store_can_hold_is_refused_and_stores_nothing(
    ctx, call: str, files: dict[str, str], field: str, reason: str
) -> None:
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    before = snapshot(ctx)

    with pytest.raises(RequestInvalid) as refused:
        client.deliver(run_id, call, files, ctx=ctx)

    assert refused.value.field == field and reason in refused.value.reason, refused.value.message
    assert_unchanged(ctx, before, f"delivering a bad {field}")
    assert client.deliver(run_id, "call_0_0", {"notes/a.txt": "body"}, ctx=ctx).stored


def test_a_database_error_never_shows_the_bound_parameters(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=1)
    secret = f"secret-{uuid4().hex}"
    try:
        with pytest.raises(DBAPIError) as failed, engine.connect() as conn:
            conn.execute(text("SELECT CAST(:secret AS text), 1 / 0"), {"secret": secret})
    finally:
        engine.dispose()

    assert secret not in str(failed.value)
    assert "parameters hidden" in str(failed.value)

"""Each place a user's JSON value enters refuses what ``json_problem`` refuses, as a
``RequestInvalid`` naming the field, never a TypeError, ValueError or RecursionError:
the run request (``parse_request``), deliveries and prerequisites (``worker.client``
checks, which run before any store call), and the ``resume_round`` task payload."""

from __future__ import annotations

import math
from typing import Any
from uuid import uuid4

import pytest
from pydantic import BaseModel

from runtime.canonical import (
    MAX_JSON_DEPTH,
    MAX_RESULT_DEPTH,
    NON_FINITE,
    NUL_CHARACTER,
    TOO_DEEP,
    TOO_MANY_DIGITS,
    UNPAIRED_SURROGATE,
)
from runtime.errors import RequestInvalid
from runtime.loop import MODEL_RESPONSE_INVALID, Continue, Fail, RunState, drive_react_loop
from runtime.models.base import ModelResponse
from runtime.prepare import parse_request
from schema.wire import RunRequest
from tests.support.fakes import FixedModel, calls, deps_for
from tests.support.requests import RESUME, example_request, scripted_request
from tests.support.shapes import nested_lists, nested_objects
from worker.client import check_delivery, check_prerequisite
from worker.engine.resume import parse_resumes


def refusal(fn: Any, *args: Any) -> RequestInvalid:
    with pytest.raises(RequestInvalid) as refused:
        fn(*args)
    return refused.value


@pytest.mark.parametrize(
    ("raw", "kind"),
    [([1, 2], "an array"), ("a request", "a string"), (None, "null"), (3, "a number"), (True, "a boolean")],
)
def test_a_request_that_is_not_an_object_is_refused_naming_the_request(raw: Any, kind: str) -> None:
    refused = refusal(parse_request, raw)

    assert (refused.field, refused.reason) == ("request", f"must be a JSON object, not {kind}")


def _with_args(args: Any) -> dict[str, Any]:
    raw = example_request()
    raw["config"]["tools"] = ["echo"]
    raw["config"]["model"]["turns"][0]["tool_calls"][0] = {"name": "echo", "args": args}
    return raw


ARGS = "config.model.turns[0].tool_calls[0].args"


@pytest.mark.parametrize(
    ("args", "field", "reason"),
    [
        pytest.param({"x": nested_lists(255)}, f"{ARGS}.x" + "[0]" * (MAX_JSON_DEPTH - 8), TOO_DEEP, id="255_deep"),
        pytest.param({"x": nested_lists(1000)}, f"{ARGS}.x" + "[0]" * (MAX_JSON_DEPTH - 8), TOO_DEEP, id="1000_deep"),
        pytest.param({"x": nested_objects(100_000)}, f"{ARGS}.x" + ".a" * (MAX_JSON_DEPTH - 8), TOO_DEEP, id="1e5"),
        pytest.param({"x": 10**4000}, f"{ARGS}.x", TOO_MANY_DIGITS, id="4001_digits"),
        pytest.param({"x": -(10**4300)}, f"{ARGS}.x", TOO_MANY_DIGITS, id="4301_digits"),
        pytest.param({"x": math.inf}, f"{ARGS}.x", NON_FINITE, id="infinity"),
        pytest.param({"x\x00": 1}, ARGS, f"an object key holds {NUL_CHARACTER}", id="nul_key"),
    ],
)
def test_a_request_too_deep_or_with_huge_numbers_is_refused_naming_the_field(
    args: Any, field: str, reason: str
) -> None:
    refused = refusal(parse_request, _with_args(args))

    assert (refused.field, refused.reason) == (field, reason)


def test_a_request_at_the_depth_limit_is_parsed() -> None:
    # The request object is level 1, its args level 8: 56 more levels fit.
    parse_request(_with_args({"x": nested_lists(MAX_JSON_DEPTH - 8)}))
    refused = refusal(parse_request, _with_args({"x": nested_lists(MAX_JSON_DEPTH - 7)}))
    assert refused.reason == TOO_DEEP


def test_a_parsed_request_with_a_config_too_deep_to_dump_is_refused() -> None:
    parsed = RunRequest.model_validate(_with_args({"x": nested_lists(400)}))

    assert refusal(parse_request, parsed).reason == TOO_DEEP


def test_a_python_caller_may_pass_the_root_id_as_a_uuid() -> None:
    root = uuid4()
    assert parse_request({**example_request(), "root_id": root}).root_id == root


@pytest.mark.parametrize(
    ("key", "value", "field", "reason"),
    [
        pytest.param("k", math.nan, "value", NON_FINITE, id="nan"),
        pytest.param("k", {"a": [-math.inf]}, "value.a[0]", NON_FINITE, id="minus_infinity"),
        pytest.param("k", nested_lists(900), "value" + "[0]" * MAX_JSON_DEPTH, TOO_DEEP, id="900_deep"),
        pytest.param("k", 10**4000, "value", TOO_MANY_DIGITS, id="4001_digits"),
        pytest.param("k", "a\x00", "value", NUL_CHARACTER, id="nul_in_value"),
        pytest.param("k", {"\ud800": 1}, "value", f"an object key holds {UNPAIRED_SURROGATE}", id="surrogate_key"),
        pytest.param("k\x00", 1, "key", NUL_CHARACTER, id="nul_in_key"),
        pytest.param("\udc00", 1, "key", UNPAIRED_SURROGATE, id="surrogate_in_key"),
        pytest.param(3, 1, "key", "must be a string", id="key_not_a_string"),
    ],
)
def test_a_prerequisite_no_store_can_hold_is_refused_naming_the_field(
    key: Any, value: Any, field: str, reason: str
) -> None:
    refused = refusal(check_prerequisite, key, value)

    assert (refused.field, refused.reason) == (field, reason)


def test_a_prerequisite_at_the_limits_passes() -> None:
    check_prerequisite("approval", nested_objects(MAX_JSON_DEPTH - 1, leaf=[10**3999, "é", None]))


@pytest.mark.parametrize(
    ("call", "files", "field", "reason"),
    [
        pytest.param("c", {"a.md": "x\x00y"}, "files[0].content", NUL_CHARACTER, id="nul_in_content"),
        pytest.param("c", {"a.md": "ok", "b.md": "\ud800"}, "files[1].content", UNPAIRED_SURROGATE, id="surrogate"),
        pytest.param("c", {"a\x00.md": "x"}, "files[0].path", NUL_CHARACTER, id="nul_in_path"),
        pytest.param("c", {"\udcff.md": "x"}, "files[0].path", UNPAIRED_SURROGATE, id="surrogate_in_path"),
        pytest.param("c", {"a.md": b"bytes"}, "files[0].content", "must be a string", id="bytes_content"),
        pytest.param("c", ["a.md"], "files", "must be an object {path: text}", id="files_not_an_object"),
        pytest.param("c\x00", {"a.md": "x"}, "tool_call_id", NUL_CHARACTER, id="nul_in_tool_call_id"),
    ],
)
def test_a_delivery_no_store_can_hold_is_refused_naming_the_file(
    call: Any, files: Any, field: str, reason: str
) -> None:
    refused = refusal(check_delivery, call, files)

    assert refused.field == field and refused.reason.startswith(reason)
    refused.message.encode("utf-8")  # the refusal never quotes a raw surrogate


def test_a_refused_file_content_names_the_file_by_an_escaped_path() -> None:
    refused = refusal(check_delivery, "c", {"docs/é.md": "ok", "docs/b.md": "\x00"})

    assert refused.message == f'files[1].content: {NUL_CHARACTER}, in the file "docs/b.md"'


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        pytest.param(5, "resumes", id="a_number"),
        pytest.param({}, "resumes", id="an_object"),
        pytest.param(None, "resumes", id="null"),
        pytest.param([], "resumes", id="an_empty_list"),
        pytest.param("[]", "resumes", id="a_string"),
        pytest.param([5], "resumes[0]", id="a_list_of_numbers"),
        pytest.param([{**RESUME, "claim_fence": "x"}], "resumes[0].claim_fence", id="a_field_of_the_wrong_type"),
        pytest.param([{**RESUME, "extra": 1}], "resumes[0].extra", id="an_extra_field"),
        pytest.param([{**RESUME, "proof": math.nan}], "resumes[0].proof", id="nan"),
        pytest.param(nested_lists(100_000), "resumes" + "[0]" * MAX_JSON_DEPTH, id="100000_deep"),
    ],
)
def test_a_malformed_resume_payload_is_refused_naming_the_field(payload: Any, field: str) -> None:
    assert refusal(parse_resumes, payload).field == field


def test_a_well_formed_resume_payload_is_parsed() -> None:
    (resume,) = parse_resumes([RESUME])

    assert resume.tool_call_id == "call_0_0" and str(resume.run_id) == RESUME["run_id"]


# --- what the runtime builds around accepted values ------------------------------------------


def _echo_round(args: dict[str, Any]) -> Any:
    raw = scripted_request([{"content": "unused"}], tools=["echo"])
    model = FixedModel([calls(("echo", args)), ModelResponse(content="done")])
    return drive_react_loop(deps_for(raw, model=model), RunState.start("go"))


def test_a_tool_result_wrapping_an_accepted_value_is_kept_up_to_the_result_depth() -> None:
    # A response is {tool_calls: [{args: ...}]}: args is level 4 of it, x level 5.
    args = {"x": nested_lists(MAX_RESULT_DEPTH - 4)}

    result = _echo_round(args)

    assert result.outcome == Continue()
    (invocation,) = result.tool_invocations
    assert (invocation.status, invocation.result) == ("completed", args)
    RoundEventWire.model_validate({"data": invocation.result}).model_dump_json()  # as events are written


def test_a_model_response_nested_past_the_result_depth_fails_the_round_instead_of_crashing() -> None:
    result = _echo_round({"x": nested_lists(MAX_RESULT_DEPTH)})

    assert isinstance(result.outcome, Fail) and result.outcome.error_code == MODEL_RESPONSE_INVALID
    assert TOO_DEEP.replace(str(MAX_JSON_DEPTH), str(MAX_RESULT_DEPTH)) in result.outcome.message


class RoundEventWire(BaseModel):
    data: dict[str, Any]

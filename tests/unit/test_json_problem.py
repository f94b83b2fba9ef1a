"""json_problem: the one check of every JSON value a user can send. Each reason, in keys
and in values, at and past each limit; deep values refused without a RecursionError;
and everything it accepts at the limits encodes, digests and serializes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from runtime.canonical import (
    KEY_NOT_TEXT,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    NON_FINITE,
    NUL_CHARACTER,
    TOO_DEEP,
    TOO_MANY_DIGITS,
    UNPAIRED_SURROGATE,
    JsonProblem,
    canonical_json,
    digest,
    json_problem,
    require_json,
)
from runtime.errors import RequestInvalid
from tests.support.shapes import nested_lists, nested_objects


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        pytest.param(float("nan"), "value", NON_FINITE, id="nan"),
        pytest.param(float("inf"), "value", NON_FINITE, id="infinity"),
        pytest.param(-math.inf, "value", NON_FINITE, id="minus_infinity"),
        pytest.param(json.loads("1e400"), "value", NON_FINITE, id="1e400"),  # json.loads reads it as infinity
        pytest.param({"a": [1, json.loads("-1e400")]}, "value.a[1]", NON_FINITE, id="nested_minus_1e400"),
        pytest.param("a\x00b", "value", NUL_CHARACTER, id="nul"),
        pytest.param({"k": ["ok", "\x00"]}, "value.k[1]", NUL_CHARACTER, id="nested_nul"),
        pytest.param("\ud800", "value", UNPAIRED_SURROGATE, id="surrogate"),
        pytest.param({"k": "x\udfffy"}, "value.k", UNPAIRED_SURROGATE, id="nested_surrogate"),
        pytest.param({"a": {"b\x00": 1}}, "value.a", f"an object key holds {NUL_CHARACTER}", id="nul_in_key"),
        pytest.param(
            {"a": {"\ud83d": 1}}, "value.a", f"an object key holds {UNPAIRED_SURROGATE}", id="surrogate_in_key"
        ),
        pytest.param({1: "x"}, "value", KEY_NOT_TEXT, id="int_key"),
        pytest.param(10**MAX_INT_DIGITS, "value", TOO_MANY_DIGITS, id="int_4001_digits"),
        pytest.param([-(10**MAX_INT_DIGITS)], "value[0]", TOO_MANY_DIGITS, id="negative_int_4001_digits"),
        pytest.param(10**5000, "value", TOO_MANY_DIGITS, id="int_5001_digits"),  # beyond what str() itself can convert
        pytest.param({"s": {1, 2}}, "value.s", "not a JSON value (a set)", id="set"),
        pytest.param([object()], "value[0]", "not a JSON value (a object)", id="object"),
    ],
)
def test_each_unstorable_value_is_refused_with_its_path_and_reason(value: Any, path: str, reason: str) -> None:
    assert json_problem(value, "value") == JsonProblem(path, reason)


def test_values_at_the_limits_pass() -> None:
    assert json_problem(10**MAX_INT_DIGITS - 1) is None
    assert json_problem(-(10**MAX_INT_DIGITS - 1)) is None
    assert json_problem([True, False, None, 0, -0.0, 1.5e308, 5e-324, "", "é\U0001f600", {"": []}]) is None
    assert json_problem(nested_lists(MAX_JSON_DEPTH)) is None
    assert json_problem(nested_objects(MAX_JSON_DEPTH)) is None
    assert json_problem((1, (2, [3]))) is None  # tuples are arrays


def test_one_level_past_the_depth_limit_is_refused_at_the_deepest_allowed_level() -> None:
    problem = json_problem(nested_objects(MAX_JSON_DEPTH + 1), "value")

    assert problem is not None and problem.reason == TOO_DEEP == f"nested deeper than {MAX_JSON_DEPTH} levels"
    assert problem.path == "value" + ".a" * MAX_JSON_DEPTH
    assert json_problem(nested_lists(MAX_JSON_DEPTH + 1)) == JsonProblem("[0]" * MAX_JSON_DEPTH, TOO_DEEP)
    # A scalar does not count as a level: only arrays and objects nest.
    assert json_problem(nested_lists(MAX_JSON_DEPTH, leaf="leaf")) is None


@pytest.mark.parametrize("build", [nested_lists, nested_objects])
def test_a_value_nested_100000_deep_is_refused_without_recursion_error(build: Any) -> None:
    deep = build(100_000)

    problem = json_problem(deep, "config")

    assert problem is not None and problem.reason == TOO_DEEP


def test_a_wide_value_is_checked_whole() -> None:
    wide = {f"k{i}": [i, str(i)] for i in range(50_000)}
    assert json_problem(wide) is None
    wide["k49999"][1] = "\x00"
    assert json_problem(wide) == JsonProblem("k49999[1]", NUL_CHARACTER)


def test_the_first_problem_in_document_order_is_named() -> None:
    value = {"a": [1, {"b": math.nan}], "c": "\x00", "d": nested_lists(100)}

    assert json_problem(value) == JsonProblem("a[1].b", NON_FINITE)
    assert json_problem({"c": "\x00", "a": math.nan}) == JsonProblem("c", NUL_CHARACTER)


def test_the_path_of_an_odd_key_is_quoted_and_ascii_safe() -> None:
    value = {"with space": {"new\nline": {"é": {'q"uote': {"x" * 100: math.nan}}}}}

    problem = json_problem(value, "value")

    assert problem is not None
    assert problem.path == ('value["with space"]["new\\nline"].é["q\\"uote"]["' + "x" * 64 + '..."]')
    problem.path.encode("utf-8")  # never a surrogate, never a raw control character
    assert "\n" not in problem.path


def test_require_json_raises_request_invalid_naming_the_field() -> None:
    require_json({"ok": [1, "two"]}, "value")
    with pytest.raises(RequestInvalid) as refused:
        require_json({"ok": [1, math.inf]}, "value")

    assert refused.value.field == "value.ok[1]"
    assert refused.value.reason == NON_FINITE
    assert refused.value.message == f"value.ok[1]: {NON_FINITE}"


class _Args(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


def test_whatever_passes_at_the_limits_encodes_digests_and_serializes_even_when_wrapped() -> None:
    big = 10**MAX_INT_DIGITS - 1
    value = nested_objects(MAX_JSON_DEPTH - 1, leaf=[big, -big, 1e16, "é"])
    assert json_problem(value) is None
    # The runtime wraps a value further: in a tool result, a message, a history, an event.
    wrapped = {"history": [{"role": "tool", "content": {"result": {"key": "k", "value": value}}}]}

    text = json.dumps(wrapped)
    assert json.loads(text) == wrapped
    assert json.loads(canonical_json(wrapped)) == json.loads(text)
    assert len(digest(wrapped)) == 64
    dumped = _Args.model_validate(wrapped).model_dump(mode="json")
    assert dumped == wrapped
    assert _Args.model_validate(wrapped).model_dump_json()

"""Fuzzing the run-request shape: whatever JSON-shaped value is submitted (junk in any
field, NaN, Infinity, NUL, unpaired surrogates, huge integers, deep nesting, non-objects),
``prepare_execution`` either accepts it or raises ``RequestInvalid``, never anything else,
and whatever it accepts round-trips through canonical_json and digest."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from runtime.canonical import MAX_INT_DIGITS, canonical_json, digest
from runtime.deps import build_runtime
from runtime.errors import RequestInvalid
from runtime.models.keys import ModelKeys
from runtime.prepare import prepare_execution

RUNTIME = build_runtime(model_keys=ModelKeys(openai=SecretStr("sk-test-fuzz"), anthropic=SecretStr("sk-ant-fuzz")))
TOOLS = ["add", "echo", "sleep", "read_files", "await_prerequisite", "local_echo", "teleport"]

any_char = st.characters(blacklist_categories=())  # surrogates and NUL included
nasty = st.sampled_from(
    [
        math.nan,
        math.inf,
        -math.inf,
        "\x00",
        "a\ud800",
        "\udfff",
        10**MAX_INT_DIGITS,
        10**MAX_INT_DIGITS - 1,
        -(10**MAX_INT_DIGITS),
        2**64,
        -0.0,
        1e308,
        "",
    ]
)
clean = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
)
anything = st.floats() | st.text(any_char, max_size=8) | nasty
keys = st.one_of(
    st.text(max_size=6), st.sampled_from(["a", "b", "x"]), st.text(max_size=3), st.text(any_char, max_size=3)
)


def nest(levels: int) -> Any:
    value: Any = "leaf"
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], one_in: int = 5) -> st.SearchStrategy[Any]:
    """``good``, but ``bad`` once in ``one_in`` draws (``|`` would flatten and weigh by
    the number of alternatives)."""
    return st.integers(0, one_in - 1).flatmap(lambda i: bad if i == 0 else good)


scalars = mostly(clean, anything, 6)
# Around the limit wherever it sits, and now and then past what pydantic can serialize.
deep = mostly(st.integers(min_value=30, max_value=75), st.integers(min_value=250, max_value=400), 4).map(nest)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=10
)
json_values = mostly(values, deep, 6)


def or_junk(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return mostly(good, json_values, 8)


tool_call = st.fixed_dictionaries(
    {"name": or_junk(st.sampled_from(TOOLS)), "args": or_junk(st.dictionaries(keys, json_values, max_size=3))}
)
turn = or_junk(
    st.fixed_dictionaries({"tool_calls": or_junk(st.lists(tool_call, min_size=1, max_size=2))})
    | st.fixed_dictionaries({"content": or_junk(st.text(max_size=8))})
)
model = st.fixed_dictionaries(
    {"provider": or_junk(st.sampled_from(["scripted", "scripted", "openai", "anthropic", "oracle"]))},
    optional={
        "turns": or_junk(st.lists(turn, min_size=1, max_size=3)),
        "name": or_junk(st.sampled_from(["gpt-4o-mini", "claude-3-5-haiku-latest"])),
        "base_url": or_junk(st.sampled_from(["https://api.openai.com/v1", "http://127.0.0.1:1"])),
        "context_limit_tokens": json_values,
    },
)
config = st.fixed_dictionaries(
    {"model": or_junk(model)},
    optional={
        "tools": or_junk(st.lists(st.sampled_from(TOOLS), max_size=3)),
        "system_prompt": or_junk(st.text(max_size=8)),
        "policy": st.dictionaries(st.sampled_from(["max_rounds", "max_tool_output_bytes", "other"]), json_values),
        "extra": json_values,
    },
)
request = st.fixed_dictionaries(
    {"owner": or_junk(st.just("team-a")), "input": or_junk(st.text(min_size=1, max_size=8)), "config": or_junk(config)},
    optional={"root_id": or_junk(st.none() | st.uuids().map(str)), "extra": json_values},
)
# A valid request whose echo args (echo takes anything) hold any value: the path on
# which values reach the store and the digests when nothing else is wrong.
echoed = st.dictionaries(keys, json_values, max_size=3).map(
    lambda args: {
        "owner": "team-a",
        "input": "go",
        "config": {
            "model": {"provider": "scripted", "turns": [{"tool_calls": [{"name": "echo", "args": args}]}]},
            "tools": ["echo"],
        },
    }
)
submissions = mostly(st.one_of(echoed, request), json_values, 10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(submissions)
def test_a_submission_is_accepted_or_refused_as_request_invalid_never_anything_else(raw: Any) -> None:
    try:
        parsed, prepared = prepare_execution(RUNTIME, raw)
    except RequestInvalid as refused:
        event(f"refused: {refused.field[:20]}: {refused.reason[:40]}")
        # The refusal itself can be shown anywhere: UTF-8, one line, naming a field.
        refused.message.encode("utf-8")
        assert "\n" not in refused.field and isinstance(refused.field, str)
        return
    event("accepted")
    # What was accepted is stored (jsonb), digested and serialized as it was sent.
    for accepted in (raw, parsed.model_dump(mode="json"), prepared.turn_config.model_dump(mode="json")):
        text = canonical_json(accepted)  # ValueError on NaN, Infinity, an int past 4300 digits
        text.encode("utf-8")  # UnicodeEncodeError on an unpaired surrogate
        assert "\\u0000" not in text, "jsonb cannot store a NUL character"
        assert canonical_json(json.loads(text)) == text
        assert digest(json.loads(text)) == digest(accepted)

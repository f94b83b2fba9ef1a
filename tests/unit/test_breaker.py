"""RepeatedToolCallBreaker: the fingerprint, the counting, and the loop stopping a run.

Fast and in memory: property tests of ``fingerprint`` / ``round_fingerprint`` / ``judge``,
then ``drive_react_loop`` and ``resolve_and_run`` with the scripted model.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runtime.breaker import (
    EXEMPT_DOMAINS,
    REPEATED_IDENTICAL_TOOL_CALL,
    CountedCall,
    RepeatedToolCallBreaker,
    fingerprint,
)
from runtime.canonical import canonical_json
from runtime.config import REPEATED_TOOL_CALL_LIMIT, Policy
from runtime.deps import BaseDeps, Runtime
from runtime.loop import MAX_ROUNDS_EXCEEDED, Continue, Fail, Finish, RunState, drive_react_loop
from runtime.models.scripted import ScriptedModel
from runtime.prepare import resolve_and_run
from runtime.tools import Tool, builtin_registry
from runtime.tools.builtin import EchoArgs
from schema.wire.vocab import ToolDomain
from tests.support.fakes import RecordingFactory, deps_for
from tests.support.requests import scripted_request

SAFE = 2**53 - 1

# --- strategies -------------------------------------------------------------------------

# Integers small enough that their float form is exact (and documented to canonicalize back).
ints = st.integers(min_value=-SAFE, max_value=SAFE)
scalars = st.none() | st.booleans() | ints | st.text(max_size=8) | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=5), json_values, max_size=5)
tool_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


def reorder(value: Any, rnd: random.Random) -> Any:
    """The same value with every dict's insertion order shuffled, recursively."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reorder(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reorder(v, rnd) for v in value]
    return value


def ints_as_floats(value: Any, rnd: random.Random) -> Any:
    """The same value with (randomly chosen) ints written as floats: 2 -> 2.0, nested."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and rnd.random() < 0.7:
        return float(value)
    if isinstance(value, dict):
        return {k: ints_as_floats(v, rnd) for k, v in value.items()}
    if isinstance(value, list):
        return [ints_as_floats(v, rnd) for v in value]
    return value


def call(name: str = "echo", args: Any = None, result: Any = None, *, domain: ToolDomain | None = ToolDomain.SDK,
         status: str = "completed") -> CountedCall:
    args = {"q": 1} if args is None else args
    return CountedCall(name, args, args if result is None else result, domain, status)


# --- fingerprint ------------------------------------------------------------------------


@settings(max_examples=200)
@given(tool_names, json_objects, json_values, st.randoms(use_true_random=False))
def test_fingerprint_is_stable_under_key_order_and_integral_float_format(name, args, result, rnd) -> None:
    base = fingerprint(name, args, result)
    same_keys_shuffled = fingerprint(name, reorder(args, rnd), reorder(result, rnd))
    floats = fingerprint(name, ints_as_floats(args, rnd), ints_as_floats(result, rnd))
    both = fingerprint(name, reorder(ints_as_floats(args, rnd), rnd), reorder(ints_as_floats(result, rnd), rnd))
    assert base == same_keys_shuffled == floats == both
    assert len(base) == 64 and int(base, 16) >= 0


def test_fingerprint_examples_for_number_formats_and_nesting() -> None:
    assert fingerprint("add", {"a": 2, "b": 3}, {"sum": 5}) == fingerprint("add", {"b": 3.0, "a": 2.0}, {"sum": 5.0})
    nested = {"x": [1, {"y": 2, "z": [3, 4]}], "w": {"v": 0}}
    nested_floats = {"w": {"v": -0.0}, "x": [1.0, {"z": [3.0, 4], "y": 2.0}]}
    assert fingerprint("t", nested, nested) == fingerprint("t", nested_floats, nested_floats)
    # A non-integral float, a bool and a string are not the integer they resemble.
    assert fingerprint("t", {"a": 2}, None) != fingerprint("t", {"a": 2.5}, None)
    assert fingerprint("t", {"a": 1}, None) != fingerprint("t", {"a": True}, None)
    assert fingerprint("t", {"a": 2}, None) != fingerprint("t", {"a": "2"}, None)


@settings(max_examples=200)
@given(tool_names, tool_names, json_objects, json_objects, json_values, json_values)
def test_fingerprint_differs_when_name_args_or_result_differ(name1, name2, args1, args2, res1, res2) -> None:
    base = fingerprint(name1, args1, res1)
    if name1 != name2:
        assert fingerprint(name2, args1, res1) != base
    if canonical_json(args1) != canonical_json(args2):
        assert fingerprint(name1, args2, res1) != base
    if canonical_json(res1) != canonical_json(res2):
        assert fingerprint(name1, args1, res2) != base


@given(json_objects, json_values)
def test_fingerprint_does_not_confuse_args_with_result(args, result) -> None:
    assume(canonical_json(args) != canonical_json(result))
    assert fingerprint("t", args, result) != fingerprint("t", result, args)


def test_round_fingerprint_depends_on_every_call_and_their_order() -> None:
    a, b = call("echo", {"x": 1}), call("add", {"a": 1, "b": 2}, {"sum": 3})
    fp = RepeatedToolCallBreaker.round_fingerprint
    assert fp([a, b]) == fp([call("echo", {"x": 1.0}), call("add", {"b": 2, "a": 1}, {"sum": 3.0})])
    assert fp([a, b]) != fp([b, a])
    assert fp([a, b]) != fp([a])
    assert fp([a]) != fp([a, a])
    assert fp([a, b]) != fp([a, call("add", {"a": 1, "b": 2}, {"sum": 4})])


# --- judge ------------------------------------------------------------------------------


@settings(max_examples=100)
@given(limit=st.integers(min_value=2, max_value=12), extra=st.integers(min_value=0, max_value=3))
def test_consecutive_identical_rounds_count_up_and_trip_exactly_at_the_limit(limit, extra) -> None:
    breaker = RepeatedToolCallBreaker(limit)
    round_calls = [call("echo", {"n": 7})]
    previous, count, verdicts = None, 0, []
    for _ in range(limit + extra):
        verdict = breaker.judge(round_calls, previous, count)
        verdicts.append(verdict)
        previous, count = verdict.fingerprint, verdict.repeat_count
    assert [v.repeat_count for v in verdicts] == list(range(1, limit + extra + 1))
    assert [v.tripped for v in verdicts] == [False] * (limit - 1) + [True] * (extra + 1)
    assert all(v.message is None for v in verdicts[: limit - 1])
    assert len({v.fingerprint for v in verdicts}) == 1
    assert verdicts[0].fingerprint == RepeatedToolCallBreaker.round_fingerprint(round_calls)


def test_default_limit_is_three_rounds() -> None:
    assert Policy().repeated_tool_call_limit == REPEATED_TOOL_CALL_LIMIT == 3
    breaker = RepeatedToolCallBreaker(Policy().repeated_tool_call_limit)
    c = [call()]
    v1 = breaker.judge(c, None, 0)
    v2 = breaker.judge(c, v1.fingerprint, v1.repeat_count)
    v3 = breaker.judge(c, v2.fingerprint, v2.repeat_count)
    assert [(v.repeat_count, v.tripped) for v in (v1, v2, v3)] == [(1, False), (2, False), (3, True)]


@settings(max_examples=100)
@given(limit=st.integers(min_value=2, max_value=8), before=st.integers(min_value=1, max_value=7))
def test_a_differing_round_resets_the_count_to_one(limit, before) -> None:
    assume(before < limit)
    breaker = RepeatedToolCallBreaker(limit)
    same, other = [call("echo", {"n": 1})], [call("echo", {"n": 2})]
    previous, count = None, 0
    for _ in range(before):
        v = breaker.judge(same, previous, count)
        previous, count = v.fingerprint, v.repeat_count
    assert count == before
    reset = breaker.judge(other, previous, count)
    assert (reset.repeat_count, reset.tripped) == (1, False)
    assert reset.fingerprint != previous
    # ...and going back to the first round starts over too.
    back = breaker.judge(same, reset.fingerprint, reset.repeat_count)
    assert (back.repeat_count, back.tripped) == (1, False)


def test_same_args_with_a_different_result_is_a_different_round() -> None:
    breaker = RepeatedToolCallBreaker(2)
    first = breaker.judge([call("t", {"q": 1}, {"r": 1})], None, 0)
    second = breaker.judge([call("t", {"q": 1}, {"r": 2})], first.fingerprint, first.repeat_count)
    assert (second.repeat_count, second.tripped) == (1, False)


@pytest.mark.parametrize("domain", [ToolDomain.LOCAL, ToolDomain.DESKTOP, ToolDomain.PLUGIN])
@pytest.mark.parametrize("previous_count", [0, 1, 2, 50])
def test_a_round_with_a_local_desktop_or_plugin_tool_does_not_count(domain, previous_count) -> None:
    assert {str(d) for d in EXEMPT_DOMAINS} == {"local", "desktop", "plugin"}
    breaker = RepeatedToolCallBreaker(3)
    alone = [call("local_echo", domain=domain)]
    previous = RepeatedToolCallBreaker.round_fingerprint([call("local_echo", domain=ToolDomain.SDK)])
    for calls in (alone, [call("echo"), call("local_echo", domain=domain)]):
        assert RepeatedToolCallBreaker.round_fingerprint(calls) is None
        verdict = breaker.judge(calls, previous, previous_count)
        assert verdict.fingerprint is None
        assert verdict.repeat_count == 0
        assert not verdict.tripped
        assert verdict.message is None


@pytest.mark.parametrize("previous_count", [0, 2, 9])
def test_a_round_with_a_suspended_call_does_not_count_and_breaks_the_streak(previous_count) -> None:
    breaker = RepeatedToolCallBreaker(3)
    done = [call("echo")]
    previous = RepeatedToolCallBreaker.round_fingerprint(done)
    suspended = [call("echo", status="suspended")]
    verdict = breaker.judge(suspended, previous, previous_count)
    assert (verdict.fingerprint, verdict.repeat_count, verdict.tripped) == (None, 0, False)
    mixed = breaker.judge([call("add", {"a": 1}), call("echo", status="suspended")], previous, previous_count)
    assert (mixed.fingerprint, mixed.repeat_count, mixed.tripped) == (None, 0, False)
    # The next identical round starts a new streak.
    after = breaker.judge(done, verdict.fingerprint, verdict.repeat_count)
    assert (after.repeat_count, after.tripped) == (1, False)


def test_a_round_without_calls_does_not_count() -> None:
    verdict = RepeatedToolCallBreaker(2).judge([], "f" * 64, 1)
    assert (verdict.fingerprint, verdict.repeat_count, verdict.tripped) == (None, 0, False)


def test_failed_calls_and_unknown_tools_still_count() -> None:
    breaker = RepeatedToolCallBreaker(2)
    failing = [call("nope", {"x": 1}, {"error": {"code": "TOOL_UNKNOWN"}}, domain=None, status="failed")]
    first = breaker.judge(failing, None, 0)
    second = breaker.judge(failing, first.fingerprint, first.repeat_count)
    assert first.fingerprint is not None
    assert (second.repeat_count, second.tripped) == (2, True)


@given(limit=st.integers(min_value=2, max_value=40), names=st.lists(tool_names, min_size=1, max_size=3, unique=True))
def test_the_trip_message_names_every_tool_and_the_count(limit, names) -> None:
    breaker = RepeatedToolCallBreaker(limit)
    calls = [call(n, {"i": i}) for i, n in enumerate(names)]
    fp = RepeatedToolCallBreaker.round_fingerprint(calls)
    verdict = breaker.judge(calls, fp, limit - 1)
    assert verdict.tripped and verdict.repeat_count == limit
    assert verdict.message is not None
    for n in names:
        assert n in verdict.message
    assert f"{limit} times" in verdict.message
    assert "repeated_tool_call_limit" in verdict.message


# --- in the loop ------------------------------------------------------------------------

ECHO = {"tool_calls": [{"name": "echo", "args": {"q": "same", "n": 2}}]}
LOCAL_ECHO = {"tool_calls": [{"name": "local_echo", "args": {"q": "same", "n": 2}}]}


def _with_limit(raw: dict[str, Any], limit: int) -> dict[str, Any]:
    raw["config"]["policy"]["repeated_tool_call_limit"] = limit
    return raw


def _drive(deps, text: str = "go", max_steps: int = 100):
    state, results = RunState.start(text), []
    for _ in range(max_steps):
        result = drive_react_loop(deps, state)
        results.append(result)
        state = state.after(result)
        if not isinstance(result.outcome, Continue):
            return results
    raise AssertionError("the run did not end")


@pytest.mark.parametrize("limit", [2, 3, 5])
def test_loop_fails_the_round_that_reaches_the_limit_with_a_breaker_event(limit) -> None:
    raw = _with_limit(scripted_request([ECHO] * 10 + [{"content": "never"}], tools=("echo", "local_echo")), limit)
    results = _drive(deps_for(raw))

    assert len(results) == limit
    assert [r.repeat_count for r in results] == list(range(1, limit + 1))
    assert len({r.tool_fingerprint for r in results}) == 1 and results[0].tool_fingerprint is not None
    assert all(r.outcome == Continue() for r in results[:-1])
    last = results[-1]
    assert isinstance(last.outcome, Fail)
    assert last.outcome.error_code == REPEATED_IDENTICAL_TOOL_CALL
    assert "echo" in last.outcome.message and f"{limit} times" in last.outcome.message
    assert [e.kind for e in last.events] == ["model_responded", "tool_completed", "breaker_tripped", "run_failed"]
    assert last.events[2].data == {"tools": ["echo"], "repeat_count": limit}
    assert last.events[3].data == {"error_code": REPEATED_IDENTICAL_TOOL_CALL, "message": last.outcome.message}
    # The tripping round's own tool work is still there to store.
    assert [m.message.role for m in last.new_messages] == ["assistant", "tool"]
    assert len(last.tool_invocations) == 1


def test_loop_breaker_state_survives_a_run_state_rebuilt_from_stored_values() -> None:
    # A worker building RunState from the stored previous round (not from .after()).
    raw = _with_limit(scripted_request([ECHO] * 5, tools=("echo",)), 3)
    deps = deps_for(raw)
    s0 = RunState.start("go")
    r0 = drive_react_loop(deps, s0)
    s1 = s0.after(r0)
    cold = dataclasses.replace(s1, previous_fingerprint=r0.tool_fingerprint, previous_repeat_count=r0.repeat_count)
    r1 = drive_react_loop(deps, cold)
    s2 = dataclasses.replace(cold.after(r1), previous_fingerprint=r1.tool_fingerprint, previous_repeat_count=2)
    r2 = drive_react_loop(deps, s2)
    assert [r0.repeat_count, r1.repeat_count, r2.repeat_count] == [1, 2, 3]
    assert isinstance(r2.outcome, Fail) and r2.outcome.error_code == REPEATED_IDENTICAL_TOOL_CALL
    # Without the stored state (a fresh count), the same round would not trip.
    fresh = drive_react_loop(deps, dataclasses.replace(s2, previous_fingerprint=None, previous_repeat_count=0))
    assert fresh.repeat_count == 1 and fresh.outcome == Continue()


def test_loop_alternating_rounds_never_trip_and_a_streak_after_a_change_counts_from_one() -> None:
    other = {"tool_calls": [{"name": "echo", "args": {"q": "other"}}]}
    turns = [ECHO, ECHO, other, ECHO, ECHO, other, ECHO, {"content": "ok"}]
    raw = _with_limit(scripted_request(turns, tools=("echo",)), 3)
    results = _drive(deps_for(raw))
    assert [r.repeat_count for r in results] == [1, 2, 1, 1, 2, 1, 1, 0]
    assert results[-1].outcome == Finish("ok")


def test_loop_same_args_with_changing_results_do_not_trip() -> None:
    counter = itertools.count()
    raw = _with_limit(scripted_request([ECHO] * 6 + [{"content": "ok"}], tools=("echo",)), 2)
    deps = deps_for(raw)
    changing = Tool.of_model("echo", "echo plus a counter", EchoArgs, ToolDomain.SDK,
                    lambda a, *_: {**a.model_dump(), "seq": next(counter)})
    results = _drive(dataclasses.replace(deps, tools={"echo": changing}))
    assert [r.repeat_count for r in results] == [1] * 6 + [0]
    assert results[-1].outcome == Finish("ok")


def _runtime_recording() -> tuple[Runtime, RecordingFactory]:
    factory = RecordingFactory(ScriptedModel)
    return Runtime(base=BaseDeps(model_providers={"scripted": factory}, tools=builtin_registry())), factory


def test_resolve_and_run_stops_ten_identical_echo_rounds_after_exactly_three_model_calls() -> None:
    runtime, factory = _runtime_recording()
    raw = _with_limit(scripted_request([ECHO] * 10, tools=("echo", "local_echo"), max_rounds=50), 3)
    run = resolve_and_run(runtime, raw)

    assert isinstance(run.outcome, Fail), run.outcome
    assert run.outcome.error_code == REPEATED_IDENTICAL_TOOL_CALL
    assert "echo" in run.outcome.message and "3 times" in run.outcome.message
    assert run.rounds == 3
    assert len(factory.requests) == 3
    assert [r.round_index for r in factory.requests] == [0, 1, 2]


def test_resolve_and_run_uses_the_default_limit_when_the_policy_has_none() -> None:
    runtime, factory = _runtime_recording()
    raw = scripted_request([ECHO] * 10, tools=("echo",), max_rounds=50)
    assert "repeated_tool_call_limit" not in raw["config"]["policy"]
    run = resolve_and_run(runtime, raw)
    assert isinstance(run.outcome, Fail) and run.outcome.error_code == REPEATED_IDENTICAL_TOOL_CALL
    assert run.rounds == len(factory.requests) == 3


def test_resolve_and_run_does_not_stop_identical_local_echo_rounds_that_end_by_their_script() -> None:
    runtime, factory = _runtime_recording()
    raw = _with_limit(scripted_request([LOCAL_ECHO] * 10 + [{"content": "done"}], tools=("echo", "local_echo"),
                               max_rounds=50), 3)
    run = resolve_and_run(runtime, raw)
    assert run.outcome == Finish(output="done")
    assert run.rounds == 11
    assert len(factory.requests) == 11


def test_resolve_and_run_identical_local_echo_rounds_end_at_max_rounds() -> None:
    runtime, factory = _runtime_recording()
    raw = _with_limit(scripted_request([LOCAL_ECHO] * 10, tools=("local_echo",), max_rounds=7), 3)
    run = resolve_and_run(runtime, raw)
    assert isinstance(run.outcome, Fail)
    assert run.outcome.error_code == MAX_ROUNDS_EXCEEDED
    assert run.rounds == len(factory.requests) == 7

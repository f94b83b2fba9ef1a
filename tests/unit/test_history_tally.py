"""The tally a run's state keeps of its history (tool call ids, summed token counts): the
same as counting the history afresh, however the state was built, so a long run's round
reads it instead of a pass over the whole history."""

from __future__ import annotations

from dataclasses import replace

from runtime.budget import estimate_input_tokens
from runtime.loop import with_unique_call_ids
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.base import ModelRequest, ModelResponse
from runtime.state import HistoryTally, RunState
from schema.wire.vocab import MessageRole


def _turn(i: int, call_id: str) -> tuple[Message, ...]:
    call = ToolCall(call_id, "echo", {"text": f"t{i}"})
    return (
        Message(role=MessageRole.ASSISTANT, content=None, tool_calls=(call,)),
        tool_message(call, {"echo": f"t{i}" * i}),
    )


def _fresh(history: tuple[Message, ...]) -> tuple[frozenset[str], int, int]:
    ids = frozenset(c.id for m in history for c in m.tool_calls)
    return ids, sum(m.token_count for m in history), len(history)


def _of(state: RunState) -> tuple[frozenset[str], int, int]:
    return state.tally.call_ids, state.tally.tokens, len(state.tally.of)


def test_a_state_built_with_a_history_counts_it() -> None:
    history = (user_message("hi"), *_turn(1, "a"), *_turn(2, "b"))
    state = RunState(input="hi", history=history)
    assert _of(state) == _fresh(history)
    assert state.tally.call_ids == {"a", "b"}


def test_extending_advances_the_tally_as_a_fresh_count_would() -> None:
    state = RunState(input="hi", history=(user_message("hi"),))
    for i in range(1, 6):
        state = state.extended(_turn(i, f"c{i}"), last_position=2 * i, history_digest=f"d{i}")
        assert _of(state) == _fresh(state.history)
    assert len(state.tally.call_ids) == 5


def test_a_replace_that_changes_the_history_is_counted_afresh() -> None:
    state = RunState(input="hi", history=(user_message("hi"), *_turn(1, "a")))
    shorter = replace(state, history=(user_message("hi"),))
    assert _of(shorter) == _fresh(shorter.history)
    assert shorter.tally.call_ids == frozenset()
    # Another history of the same length (a context rebuild's summary in place of the one
    # message it summarised) is counted afresh too.
    rebuilt = replace(state, history=(user_message("Summary: hi"), *_turn(2, "b")))
    assert _of(rebuilt) == _fresh(rebuilt.history)
    assert rebuilt.tally.call_ids == {"b"}
    # A replace that keeps the history keeps its tally.
    assert replace(state, boundary_seq=4).tally is state.tally


def test_an_id_reused_from_the_history_is_renamed_from_the_tally() -> None:
    state = RunState(input="hi", history=(user_message("hi"), *_turn(1, "call_1")), boundary_seq=1)
    response = ModelResponse(content=None, tool_calls=(ToolCall("call_1", "echo", {}), ToolCall("call_2", "echo", {})))
    renamed = with_unique_call_ids(response, state)
    assert [c.id for c in renamed.tool_calls] == ["call_1_1_0", "call_2"]


def test_a_request_with_known_tokens_estimates_as_one_that_counts_its_messages() -> None:
    messages = (user_message("hi"), *_turn(1, "a"), *_turn(2, "b"))
    counted = ModelRequest("system", messages, (), "digest", 0)
    known = replace(counted, known_message_tokens=HistoryTally.counted(messages).tokens)
    assert known.known_message_tokens == sum(m.token_count for m in messages)
    assert estimate_input_tokens(known) == estimate_input_tokens(counted) > 0

"""drive_react_loop: exactly one round in, one RoundResult out."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from runtime.canonical import chain_digest, digest
from runtime.errors import ModelError, ModelInputRejection, ModelUnavailable
from runtime.loop import (
    MAX_ROUNDS_EXCEEDED,
    Continue,
    Fail,
    Finish,
    RunState,
    drive_react_loop,
    request_digest,
)
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.base import ModelRequest, ModelResponse
from runtime.models.scripted import ScriptedModel
from runtime.outcomes import RebuildRequired
from schema.wire.claim import RecordedResponse
from schema.wire.vocab import MessageRole, ToolDomain
from tests.support.fakes import CountingModel, FixedModel, RaisingModel, RecordingHooks, calls, deps_for, replay_chain
from tests.support.requests import example_request, scripted_request

ADD_THEN_ANSWER = [
    {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
    {"content": "5"},
]


def _two_rounds(raw):
    deps = deps_for(raw)
    state0 = RunState.start(raw["input"])
    r0 = drive_react_loop(deps, state0)
    state1 = state0.after(r0)
    r1 = drive_react_loop(deps, state1)
    return deps, r0, state1, r1


# --- a tool round ----------------------------------------------------------------------


def test_tool_round_continues_with_user_assistant_and_tool_messages_at_positions_0_to_2() -> None:
    raw = scripted_request(ADD_THEN_ANSWER, text_input="Add 2 and 3.")
    result = drive_react_loop(deps_for(raw), RunState.start("Add 2 and 3."))

    assert result.outcome == Continue()
    assert result.boundary_seq == 0
    assert [m.position for m in result.new_messages] == [0, 1, 2]
    assert [m.message.role for m in result.new_messages] == ["user", "assistant", "tool"]
    user, assistant, tool = (m.message for m in result.new_messages)
    assert user == user_message("Add 2 and 3.")
    assert assistant.tool_calls == (ToolCall("call_0_0", "add", {"a": 2, "b": 3}),)
    assert tool.tool_call_id == "call_0_0"
    assert tool.name == "add"
    assert tool.result == {"sum": 5}


def test_tool_round_chain_digests_match_chain_digest_applied_in_order() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    result = drive_react_loop(deps_for(raw), RunState.start("go"))
    messages = [m.message for m in result.new_messages]

    d0 = chain_digest("", messages[0].to_json())
    d1 = chain_digest(d0, messages[1].to_json())
    d2 = chain_digest(d1, messages[2].to_json())
    assert [m.chain_digest for m in result.new_messages] == [d0, d1, d2]
    assert len({d0, d1, d2}) == 3


def test_tool_round_records_the_invocation_and_a_tool_completed_event() -> None:
    result = drive_react_loop(deps_for(scripted_request(ADD_THEN_ANSWER)), RunState.start("go"))

    (inv,) = result.tool_invocations
    assert inv.status == "completed"
    assert inv.domain is ToolDomain.SDK
    assert inv.result == {"sum": 5.0}
    assert inv.args_digest == digest({"a": 2, "b": 3})
    assert inv.result_digest == digest({"sum": 5})
    assert [e.kind for e in result.events] == ["model_responded", "tool_completed"]
    assert result.events[0].data["boundary_seq"] == 0
    assert result.events[1].data == {
        "tool_call_id": "call_0_0",
        "name": "add",
        "status": "completed",
        "result": {"sum": 5.0},
    }


def test_several_tool_calls_in_one_round_get_one_tool_message_each_in_call_order() -> None:
    raw = scripted_request(
        [
            {"tool_calls": [{"name": "echo", "args": {"x": 1}}, {"name": "add", "args": {"a": 1, "b": 1}}]},
            {"content": "done"},
        ]
    )
    result = drive_react_loop(deps_for(raw), RunState.start("go"))

    roles = [(m.message.role, m.message.tool_call_id) for m in result.new_messages]
    assert roles == [("user", None), ("assistant", None), ("tool", "call_0_0"), ("tool", "call_0_1")]
    assert [m.position for m in result.new_messages] == [0, 1, 2, 3]
    assert [i.result for i in result.tool_invocations] == [{"x": 1}, {"sum": 2.0}]


# --- a content round -------------------------------------------------------------------


def test_content_round_finishes_with_the_output_and_a_run_completed_event() -> None:
    _, r0, _, r1 = _two_rounds(scripted_request(ADD_THEN_ANSWER))

    assert r1.outcome == Finish(output="5")
    assert r1.boundary_seq == 1
    assert r1.tool_invocations == ()
    # Round 1 adds only the assistant's answer, after the three messages of round 0.
    assert [(m.position, m.message.role) for m in r1.new_messages] == [(3, "assistant")]
    assert r1.new_messages[0].message.content == "5"
    assert r1.new_messages[0].chain_digest == chain_digest(
        r0.new_messages[-1].chain_digest, r1.new_messages[0].message.to_json()
    )
    assert [e.kind for e in r1.events] == ["model_responded", "run_completed"]
    assert r1.events[-1].data == {"output": "5"}


def test_run_state_after_carries_history_digest_and_position() -> None:
    _, r0, state1, _ = _two_rounds(scripted_request(ADD_THEN_ANSWER))

    assert state1.boundary_seq == 1
    assert state1.history == tuple(m.message for m in r0.new_messages)
    assert state1.last_position == 2
    assert state1.history_digest == r0.new_messages[-1].chain_digest
    assert state1.history_digest == replay_chain(state1.history)[-1]


def test_second_round_sends_the_whole_history_and_its_chain_digest_to_the_model() -> None:
    raw = scripted_request(ADD_THEN_ANSWER, tools=("add", "echo"))
    model = CountingModel(ScriptedModel(_scripted_config(raw)))
    deps = deps_for(raw, model=model)
    state0 = RunState.start("go")
    state1 = state0.after(drive_react_loop(deps, state0))
    drive_react_loop(deps, state1)

    first, second = model.requests
    assert [m.role for m in first.messages] == ["user"]
    assert first.round_index == 0
    assert first.messages_digest == chain_digest("", user_message("go").to_json())
    assert second.round_index == 1
    assert second.messages == state1.history
    assert second.messages_digest == state1.history_digest
    assert first.system == "test"
    assert [t["name"] for t in first.tools] == ["add", "echo"]


def _scripted_config(raw):
    from runtime.config import TurnConfig

    return TurnConfig.model_validate(raw["config"]).model


def test_first_round_of_a_run_on_an_existing_root_chains_from_the_root_history() -> None:
    earlier = (user_message("before"), Message(role="assistant", content="ok"))
    chain = replay_chain(earlier)
    state = RunState(input="again", history=earlier, history_digest=chain[-1], last_position=7)
    model = CountingModel(ScriptedModel(_scripted_config(scripted_request([{"content": "fine"}]))))
    result = drive_react_loop(deps_for(scripted_request([{"content": "fine"}]), model=model), state)

    assert [(m.position, m.message.role) for m in result.new_messages] == [(8, "user"), (9, "assistant")]
    assert result.new_messages[0].chain_digest == chain_digest(chain[-1], user_message("again").to_json())
    assert model.requests[0].messages == (*earlier, user_message("again"))
    assert result.digests.messages == result.new_messages[0].chain_digest


# --- digests -----------------------------------------------------------------------------


def test_round_digests_are_present_and_match_their_definitions() -> None:
    deps, r0, state1, r1 = _two_rounds(scripted_request(ADD_THEN_ANSWER))

    for r in (r0, r1):
        assert r.digests.system == digest("test") == deps.system_digest
        assert r.digests.tools == digest(list(deps.tool_specs)) == deps.tools_digest
        assert r.digests.accepted_response is not None
        assert all(len(d) == 64 for d in (r.digests.system, r.digests.tools, r.digests.messages))
    # The messages digest is the chain digest of what the model was sent.
    assert r0.digests.messages == r0.new_messages[0].chain_digest
    assert r1.digests.messages == state1.history_digest
    # The accepted response digest is the digest of the response the model gave.
    assistant0 = r0.new_messages[1].message
    assert r0.digests.accepted_response == ModelResponse(assistant0.content, assistant0.tool_calls).digest()
    assert r1.digests.accepted_response == digest({"content": "5", "tool_calls": []})


def test_round_digests_are_deterministic_across_two_identical_runs() -> None:
    _, a0, _, a1 = _two_rounds(example_request())
    _, b0, _, b1 = _two_rounds(example_request())

    assert (a0.digests, a1.digests) == (b0.digests, b1.digests)
    assert [m.chain_digest for m in a0.new_messages + a1.new_messages] == [
        m.chain_digest for m in b0.new_messages + b1.new_messages
    ]


def test_round_digests_change_when_the_system_prompt_changes() -> None:
    _, a0, _, _ = _two_rounds(scripted_request(ADD_THEN_ANSWER, system_prompt="one"))
    _, b0, _, _ = _two_rounds(scripted_request(ADD_THEN_ANSWER, system_prompt="two"))

    assert a0.digests.system != b0.digests.system
    assert a0.digests.tools == b0.digests.tools
    assert a0.digests.messages == b0.digests.messages


# --- max rounds and exhaustion --------------------------------------------------------------


def test_max_rounds_reached_with_a_tool_call_fails_without_another_model_call() -> None:
    raw = scripted_request(
        [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 1}}]}, {"content": "2"}], max_rounds=1
    )
    model = CountingModel(ScriptedModel(_scripted_config(raw)))
    result = drive_react_loop(deps_for(raw, model=model), RunState.start("go"))

    assert isinstance(result.outcome, Fail)
    assert result.outcome.error_code == MAX_ROUNDS_EXCEEDED
    assert "1 rounds" in result.outcome.message
    assert len(model.requests) == 1
    # The round's tool work is still recorded, and the run_failed event closes it.
    assert [m.message.role for m in result.new_messages] == ["user", "assistant", "tool"]
    assert [e.kind for e in result.events] == ["model_responded", "tool_completed", "run_failed"]
    assert result.events[-1].data["error_code"] == MAX_ROUNDS_EXCEEDED


def test_max_rounds_counts_every_round_of_the_run() -> None:
    tool_turn = {"tool_calls": [{"name": "echo", "args": {}}]}
    raw = scripted_request([tool_turn, tool_turn, tool_turn, {"content": "late"}], max_rounds=2)
    model = CountingModel(ScriptedModel(_scripted_config(raw)))
    deps = deps_for(raw, model=model)
    state = RunState.start("go")
    r0 = drive_react_loop(deps, state)
    r1 = drive_react_loop(deps, state.after(r0))

    assert r0.outcome == Continue()
    assert isinstance(r1.outcome, Fail) and r1.outcome.error_code == MAX_ROUNDS_EXCEEDED
    assert len(model.requests) == 2


def test_a_final_answer_in_the_last_allowed_round_still_finishes() -> None:
    _, r0, _, r1 = _two_rounds(scripted_request(ADD_THEN_ANSWER, max_rounds=2))

    assert r0.outcome == Continue()
    assert r1.outcome == Finish("5")


def test_a_script_that_runs_out_fails_with_model_script_exhausted() -> None:
    raw = scripted_request([{"tool_calls": [{"name": "echo", "args": {"x": 1}}]}])
    _, r0, _, r1 = _two_rounds(raw)

    assert r0.outcome == Continue()
    assert isinstance(r1.outcome, Fail)
    assert r1.outcome.error_code == "MODEL_SCRIPT_EXHAUSTED"
    assert "1 turns" in r1.outcome.message
    assert r1.new_messages == ()
    assert r1.digests.accepted_response is None
    assert [e.kind for e in r1.events] == ["run_failed"]


# --- tool failures the model sees -------------------------------------------------------------


def test_a_model_calling_a_tool_not_enabled_gets_a_failed_tool_unknown_result_and_the_run_continues() -> None:
    raw = scripted_request([{"content": "unused"}], tools=["add"])
    model = FixedModel([calls(("sleep", {"seconds": 0})), ModelResponse("done")])
    deps = deps_for(raw, model=model)
    state = RunState.start("go")
    r0 = drive_react_loop(deps, state)

    assert r0.outcome == Continue()
    (inv,) = r0.tool_invocations
    assert inv.status == "failed"
    assert inv.domain is None
    assert inv.result["error"]["code"] == "TOOL_UNKNOWN"
    assert "sleep" in inv.result["error"]["message"]
    tool_msg = r0.new_messages[-1].message
    # Marked as an error, so a provider with the notion (Anthropic's is_error) is told.
    assert tool_msg == tool_message(ToolCall("call_0_0", "sleep", {"seconds": 0}), inv.result, is_error=True)
    assert r0.events[-1].data["status"] == "failed"

    r1 = drive_react_loop(deps, state.after(r0))
    assert r1.outcome == Finish("done")


def test_a_tool_given_bad_args_gives_a_failed_tool_args_invalid_result() -> None:
    raw = scripted_request([{"content": "unused"}], tools=["add"])
    model = FixedModel([calls(("add", {"a": "two", "b": 3})), ModelResponse("sorry")])
    result = drive_react_loop(deps_for(raw, model=model), RunState.start("go"))

    assert result.outcome == Continue()
    (inv,) = result.tool_invocations
    assert inv.status == "failed"
    assert inv.domain is ToolDomain.SDK
    assert inv.result["error"]["code"] == "TOOL_ARGS_INVALID"
    assert inv.result["error"]["message"].startswith("a: ")
    assert result.new_messages[-1].message.result == inv.result


def test_a_tool_given_an_unexpected_arg_is_refused_naming_it() -> None:
    raw = scripted_request([{"content": "unused"}], tools=["add"])
    model = FixedModel([calls(("add", {"a": 1, "b": 2, "c": 3}))])
    result = drive_react_loop(deps_for(raw, model=model), RunState.start("go"))

    (inv,) = result.tool_invocations
    assert inv.result["error"]["code"] == "TOOL_ARGS_INVALID"
    assert inv.result["error"]["message"].startswith("c: ")


def test_a_tool_whose_result_overflows_does_not_crash_the_round() -> None:
    # 1e308 + 1e308 is inf, which canonical JSON cannot encode (allow_nan=False). Valid,
    # finite args from the model must not make the round raise: it should end with a
    # result the caller can persist. (Currently raises ValueError from loop._run_tool.)
    raw = scripted_request(
        [{"tool_calls": [{"name": "add", "args": {"a": 1e308, "b": 1e308}}]}, {"content": "x"}], tools=["add"]
    )
    result = drive_react_loop(deps_for(raw), RunState.start("go"))

    assert result.outcome == Continue()
    assert len(result.tool_invocations) == 1


# --- hooks and model errors ------------------------------------------------------------------


def test_hooks_are_called_once_before_and_once_after_the_model_call_with_the_request_digest() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    log: list[str] = []
    model = CountingModel(ScriptedModel(_scripted_config(raw)), log=log)
    hooks = RecordingHooks(log=log)
    deps = deps_for(raw, model=model)
    result = drive_react_loop(deps, RunState.start("go"), hooks)

    assert log == ["started", "complete", "finished"]
    ((request, req_digest),) = hooks.started
    assert request is model.requests[0]
    assert req_digest == request_digest(deps, request.messages_digest)
    assert req_digest == digest(
        {"system": deps.system_digest, "messages": result.digests.messages, "tools": deps.tools_digest}
    )
    ((response, error),) = hooks.finished
    assert error is None
    assert response is not None and response.digest() == result.digests.accepted_response


def test_request_digest_is_the_same_for_an_identical_round_and_differs_for_the_next() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    h1, h2 = RecordingHooks(), RecordingHooks()
    deps = deps_for(raw)
    state0 = RunState.start("go")
    r0 = drive_react_loop(deps, state0, h1)
    drive_react_loop(deps_for(raw), state0, h2)
    drive_react_loop(deps, state0.after(r0), h1)

    assert h1.started[0][1] == h2.started[0][1]
    assert h1.started[0][1] != h1.started[1][1]


def test_a_provider_unavailable_after_its_call_budget_fails_the_round_with_its_retryable_code() -> None:
    log: list[str] = []
    error = ModelUnavailable("provider timed out")
    model = RaisingModel(error, log=log)
    hooks = RecordingHooks(log=log)

    result = drive_react_loop(deps_for(scripted_request([{"content": "x"}]), model=model), RunState.start("go"), hooks)

    assert result.outcome == Fail("MODEL_UNAVAILABLE", "provider timed out") and ModelUnavailable.retryable
    assert model.calls == 1
    assert log == ["started", "complete", "finished"]
    assert hooks.finished == [(None, error)]


class RateLimitedHooks(RecordingHooks):
    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        raise ModelUnavailable("rate limits: Redis did not answer")


def test_a_retryable_error_raised_around_the_call_propagates_and_the_model_is_not_called() -> None:
    model = RaisingModel(ModelUnavailable("never raised"))
    with pytest.raises(ModelUnavailable, match="rate limits"):
        drive_react_loop(
            deps_for(scripted_request([{"content": "x"}]), model=model), RunState.start("go"), RateLimitedHooks()
        )
    assert model.calls == 0


def test_a_context_window_rejection_asks_for_a_rebuild_not_a_failure() -> None:
    error = ModelInputRejection("context too long")
    hooks = RecordingHooks()
    result = drive_react_loop(
        deps_for(scripted_request([{"content": "x"}]), model=RaisingModel(error)), RunState.start("go"), hooks
    )

    assert result.outcome == RebuildRequired("context too long")
    assert hooks.finished == [(None, error)]
    assert result.digests.accepted_response is None


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ModelError("garbled response"), "MODEL_ERROR"),
    ],
)
def test_a_non_retryable_model_error_becomes_fail_with_its_code(error: ModelError, code: str) -> None:
    hooks = RecordingHooks()
    result = drive_react_loop(
        deps_for(scripted_request([{"content": "x"}]), model=RaisingModel(error)), RunState.start("go"), hooks
    )

    assert result.outcome == Fail(code, error.message)
    assert hooks.finished == [(None, error)]
    assert result.tool_invocations == ()
    assert result.digests.accepted_response is None
    # The first round's user message is still part of what the round produced.
    assert [m.message.role for m in result.new_messages] == ["user"]
    assert [e.kind for e in result.events] == ["run_failed"]
    assert result.events[0].data == {"error_code": code, "message": error.message}


def test_a_response_with_neither_content_nor_calls_finishes_with_empty_output() -> None:
    model = FixedModel([ModelResponse(content=None)])
    result = drive_react_loop(deps_for(scripted_request([{"content": "x"}]), model=model), RunState.start("go"))

    assert result.outcome == Finish("")
    assert result.events[-1].data == {"output": ""}


# --- a round redone from the response an earlier holder was given --------------------------


def _as_stored(value: Any) -> Any:
    """As the ledger's jsonb column gives it back."""
    return json.loads(json.dumps(value))


def _first_execution(raw: dict[str, Any], state: RunState) -> tuple[Any, RecordedResponse]:
    """Round ``state`` run once, as the holder that died after its model call ran it: its
    result, and what the ledger kept of its call."""
    hooks = RecordingHooks()
    result = drive_react_loop(deps_for(raw), state, hooks)
    ((_, asked),) = hooks.started
    ((response, _),) = hooks.finished
    assert response is not None
    return result, RecordedResponse(asked, _as_stored(response.to_json()))


def test_a_round_with_the_recorded_response_to_its_request_calls_no_model_and_yields_the_same_round() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    state = RunState.start("go")
    original, recorded = _first_execution(raw, state)
    model = CountingModel(ScriptedModel(_scripted_config(raw)))
    hooks = RecordingHooks()

    redone = drive_react_loop(deps_for(raw, model=model), replace(state, recorded_response=recorded), hooks)

    assert model.requests == []
    assert hooks.log == ["reused"] and hooks.reused == [recorded.request_digest]
    assert redone.digests == original.digests
    assert redone.digests.accepted_response is not None
    assert redone.projection is not None and original.projection is not None
    assert redone.projection.proof == original.projection.proof
    assert redone.outcome == original.outcome == Continue()
    assert [(m.position, m.message, m.chain_digest) for m in redone.new_messages] == [
        (m.position, m.message, m.chain_digest) for m in original.new_messages
    ]
    assert redone.tool_invocations == original.tool_invocations
    assert redone.events == original.events


def test_the_recorded_response_is_the_one_the_round_goes_on_from_not_the_models() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    state = RunState.start("go")
    _, recorded = _first_execution(raw, state)
    # What the earlier holder was given (and paid for) differs from what the model would
    # say now: the round continues from the former.
    given = ModelResponse(content=None, tool_calls=(ToolCall("call_0_0", "echo", {"given": 1.5}),))
    recorded = RecordedResponse(recorded.request_digest, _as_stored(given.to_json()))
    model = CountingModel(ScriptedModel(_scripted_config(raw)))

    result = drive_react_loop(deps_for(raw, model=model), replace(state, recorded_response=recorded))

    assert model.requests == []
    assert [(i.call.name, i.result) for i in result.tool_invocations] == [("echo", {"given": 1.5})]
    assert result.digests.accepted_response == given.digest()


def test_a_recorded_response_to_another_request_is_not_reused_and_the_model_is_called() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    state0 = RunState.start("go")
    r0, recorded0 = _first_execution(raw, state0)
    state1 = state0.after(r0)
    # Round 1's context is not round 0's: round 0's response answers another request.
    model = CountingModel(ScriptedModel(_scripted_config(raw)))
    hooks = RecordingHooks()

    result = drive_react_loop(deps_for(raw, model=model), replace(state1, recorded_response=recorded0), hooks)

    assert len(model.requests) == 1
    assert hooks.log == ["started", "finished"] and hooks.reused == []
    assert hooks.started[0][1] != recorded0.request_digest
    assert result.outcome == Finish(output="5")


def test_a_recorded_response_to_a_changed_context_is_not_reused() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    state = RunState.start("go")
    _, recorded = _first_execution(raw, state)
    # The same round after a context rebuild: the summary is part of what the model gets.
    summary = Message(role=MessageRole.USER, content="summary")
    rebuilt = replace(
        state, history=(summary,), history_digest=chain_digest("", summary.to_json()), recorded_response=recorded
    )
    model = CountingModel(ScriptedModel(_scripted_config(raw)))

    drive_react_loop(deps_for(raw, model=model), rebuilt)

    assert len(model.requests) == 1


def test_the_next_rounds_state_carries_no_recorded_response() -> None:
    raw = scripted_request(ADD_THEN_ANSWER)
    state = RunState.start("go")
    result, recorded = _first_execution(raw, state)

    assert replace(state, recorded_response=recorded).after(result).recorded_response is None


@pytest.mark.parametrize(
    "response",
    [
        ModelResponse(content="5"),
        ModelResponse(content=None),
        ModelResponse(
            content="thinking",
            tool_calls=(ToolCall("a", "add", {"a": 2.0, "b": 1e16}), ToolCall("b", "echo", {"x": [{"y": None}]})),
        ),
    ],
)
def test_a_response_read_back_from_its_stored_json_has_the_same_json_and_digest(response: ModelResponse) -> None:
    again = ModelResponse.from_json(_as_stored(response.to_json()))

    assert again.to_json() == response.to_json()
    assert again.digest() == response.digest()
    assert again.as_message() == response.as_message()

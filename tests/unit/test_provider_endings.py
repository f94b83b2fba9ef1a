"""Every way an answer can end, through the SDKs against loopback servers speaking each
provider's wire format, plain and streamed (the loopback server answers a streamed
request with the same answer as a stream): each ending yields its code, ``pause_turn``
and ``on_truncation: continue`` call again within the round (bounded, each call
recorded), and the SDKs' retry rules (409, ``x-should-retry``) hold within the call's
budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from runtime.deps import build_runtime
from runtime.errors import ModelUnavailable, RequestInvalid
from runtime.loop import drive_react_loop, orchestrate
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.base import ModelResponse
from runtime.models.endings import MAX_CONTINUATIONS
from runtime.models.keys import ModelKeys
from runtime.models.provider_errors import ModelRequestRefused
from runtime.outcomes import Fail, Finish
from runtime.prepare import prepare_execution
from runtime.state import RunState
from schema.wire import EventKind
from tests.support.fakes import RecordingHooks
from tests.support.provider_clients import anthropic_client, openai_client
from tests.support.provider_clients import model_request as anthropic_request
from tests.support.provider_clients import model_request as openai_request
from tests.support.providers import (
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_reply,
    openai_error,
    openai_reply,
)

KEY = "sk-endings-key"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


def base_url(fake: FakeProvider, provider: str) -> str:
    return f"{fake.url}/v1" if provider == "openai" else fake.url


# Each ending test runs twice: the model call answered whole, and streamed (the round's
# hooks give it a delta sink, so the adapter calls the SDK's streaming API).
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])


def run(
    fake: FakeProvider, provider: str, *, policy: dict[str, Any] | None = None, stream: bool = False, **model: Any
) -> Any:
    """One run in this process, every round, with the hooks recording each model call
    (and, with ``stream``, the deltas: every call then streamed)."""
    url = base_url(fake, provider)
    keys = ModelKeys(openai=SecretStr(KEY), anthropic=SecretStr(KEY), base_urls=(url,))
    raw = {
        "owner": "team-test",
        "root_id": None,
        "input": "Add 2 and 3.",
        "config": {
            "model": {"provider": provider, "name": "m", "base_url": url, **model},
            "system_prompt": "You add.",
            "tools": ["add"],
            "policy": policy or {},
        },
    }
    request, prepared = prepare_execution(build_runtime(model_keys=keys), raw)
    hooks = RecordingHooks(deltas=[] if stream else None)
    result = orchestrate(prepared.deps, RunState.start(request.input), hooks)
    assert [r.body.get("stream") is True for r in fake.requests] == [stream] * len(fake.requests)
    hooks.log = [entry for entry in hooks.log if entry != "delta"]
    return result, hooks


def failed(outcome: Any, code: str) -> str:
    assert isinstance(outcome, Fail), outcome
    assert outcome.error_code == code, outcome
    return outcome.message


# --- each ending, its code ---------------------------------------------------------------------


@STREAM
def test_openai_length_fails_truncated_instead_of_completing_with_the_partial_text(
    fake: FakeProvider, stream: bool
) -> None:
    fake.script(openai_reply("The answer is", finish_reason="length"))
    result, _ = run(fake, "openai", stream=stream)
    message = failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")
    assert "length" in message and "on_truncation" in message


@STREAM
def test_anthropic_max_tokens_fails_truncated(fake: FakeProvider, stream: bool) -> None:
    fake.script(anthropic_reply("The answer is", stop_reason="max_tokens"))
    result, _ = run(fake, "anthropic", stream=stream)
    assert "max_tokens" in failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")


@STREAM
def test_openai_refusal_fails_refused_with_the_refusal_text(fake: FakeProvider, stream: bool) -> None:
    fake.script(openai_reply(None, refusal="I can't help with that."))
    result, _ = run(fake, "openai", stream=stream)
    assert "I can't help with that." in failed(result.outcome, "MODEL_REFUSED")


@STREAM
def test_anthropic_refusal_fails_refused_with_its_text(fake: FakeProvider, stream: bool) -> None:
    fake.script(anthropic_reply("No.", stop_reason="refusal"))
    result, _ = run(fake, "anthropic", stream=stream)
    assert "No." in failed(result.outcome, "MODEL_REFUSED")


@STREAM
def test_openai_content_filter_fails_content_filtered(fake: FakeProvider, stream: bool) -> None:
    fake.script(openai_reply("", finish_reason="content_filter"))
    result, _ = run(fake, "openai", stream=stream)
    failed(result.outcome, "MODEL_CONTENT_FILTERED")


@STREAM
def test_a_tool_call_cut_off_mid_arguments_is_truncated_not_invalid(fake: FakeProvider, stream: bool) -> None:
    fake.script(openai_reply(None, [("call_1", "add", '{"a": 2, "b"')], finish_reason="length"))
    result, _ = run(fake, "openai", stream=stream)
    assert "call_1" in failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")


@STREAM
def test_unparsable_arguments_without_length_stay_invalid(fake: FakeProvider, stream: bool) -> None:
    fake.script(openai_reply(None, [("call_1", "add", '{"a": 2, "b"')]))
    result, _ = run(fake, "openai", stream=stream)
    failed(result.outcome, "MODEL_RESPONSE_INVALID")


@STREAM
def test_anthropic_tool_use_cut_off_by_max_tokens_is_truncated(fake: FakeProvider, stream: bool) -> None:
    fake.script(anthropic_reply(None, [("toolu_1", "add", "{\"a\": 2")], stop_reason="max_tokens"))
    result, _ = run(fake, "anthropic", stream=stream)
    assert "toolu_1" in failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")


@STREAM
def test_a_truncated_answer_with_tool_calls_is_never_continued(fake: FakeProvider, stream: bool) -> None:
    fake.script(openai_reply(None, [("call_1", "add", '{"a": 2, "b": 3}')], finish_reason="length"))
    result, _ = run(fake, "openai", policy={"on_truncation": "continue"}, stream=stream)
    failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")
    assert len(fake.requests) == 1


def test_a_custom_tool_call_is_refused_by_name_with_its_own_code(fake: FakeProvider) -> None:
    fake.script(openai_reply(None, custom_calls=[("call_c1", "grep_repo", "TODO")]))
    result, _ = run(fake, "openai")
    message = failed(result.outcome, "MODEL_TOOL_CALL_UNSUPPORTED")
    assert "call_c1" in message and "grep_repo" in message and "custom" in message


def test_the_finish_reason_is_in_the_model_responded_event(fake: FakeProvider) -> None:
    fake.script(openai_reply(None, [("call_1", "add", '{"a": 2, "b": 3}')]), openai_reply("5"))
    url = base_url(fake, "openai")
    keys = ModelKeys(openai=SecretStr(KEY), base_urls=(url,))
    raw = {"owner": "t", "root_id": None, "input": "Add.", "config": {
        "model": {"provider": "openai", "name": "m", "base_url": url}, "tools": ["add"]}}
    request, prepared = prepare_execution(build_runtime(model_keys=keys), raw)
    first = drive_react_loop(prepared.deps, RunState.start(request.input))
    [responded] = [e for e in first.events if e.kind == EventKind.MODEL_RESPONDED]
    assert responded.data["finish_reason"] == "tool_calls"


def test_a_response_with_a_finish_reason_round_trips_and_one_without_keeps_its_digest() -> None:
    with_reason = ModelResponse("hi", (ToolCall("c", "add", {"a": 1}),), finish_reason="stop")
    assert ModelResponse.from_json(with_reason.to_json()) == with_reason
    assert ModelResponse.from_json(with_reason.to_json()).digest() == with_reason.digest()
    plain = ModelResponse("hi")
    assert plain.to_json() == {"content": "hi", "tool_calls": []}
    assert ModelResponse.from_json(plain.to_json()).finish_reason is None


# --- the turn goes on: pause_turn, on_truncation continue --------------------------------------


@STREAM
def test_pause_turn_continues_the_turn_with_a_second_recorded_call_in_the_same_round(
    fake: FakeProvider, stream: bool
) -> None:
    fake.script(
        anthropic_reply("Searching...", stop_reason="pause_turn", usage={"input_tokens": 10, "output_tokens": 2}),
        anthropic_reply(" found it: 5.", usage={"input_tokens": 12, "output_tokens": 4}),
    )
    result, hooks = run(fake, "anthropic", stream=stream)

    assert result.outcome == Finish(output="Searching... found it: 5.")
    assert result.rounds == 1
    assert hooks.deltas is None or "".join(hooks.deltas) == "Searching... found it: 5."  # both calls streamed
    # Two model calls, each recorded, in one round; the second carries the paused content.
    assert hooks.log == ["started", "finished", "started", "finished"]
    assert len({digest for _, digest in hooks.started}) == 2
    assert len(fake.requests) == 2
    last = fake.requests[1].body["messages"][-1]
    assert last == {"role": "assistant", "content": [{"type": "text", "text": "Searching..."}]}


@STREAM
def test_pause_turn_is_bounded(fake: FakeProvider, stream: bool) -> None:
    fake.script(*[anthropic_reply("more", stop_reason="pause_turn")] * (MAX_CONTINUATIONS + 1))
    result, hooks = run(fake, "anthropic", stream=stream)
    assert "pause_turn" in failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")
    assert len(fake.requests) == MAX_CONTINUATIONS + 1 and len(hooks.started) == MAX_CONTINUATIONS + 1


@STREAM
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_on_truncation_continue_asks_for_the_rest_and_concatenates(
    fake: FakeProvider, provider: str, stream: bool
) -> None:
    if provider == "openai":
        fake.script(openai_reply("The sum ", finish_reason="length"), openai_reply("is 5."))
    else:
        fake.script(anthropic_reply("The sum ", stop_reason="max_tokens"), anthropic_reply("is 5."))
    result, hooks = run(fake, provider, policy={"on_truncation": "continue"}, stream=stream)

    assert result.outcome == Finish(output="The sum is 5.")
    assert result.rounds == 1 and len(hooks.started) == 2
    assert hooks.deltas is None or "".join(hooks.deltas) == "The sum is 5."  # both calls streamed
    last = fake.requests[1].body["messages"][-1]
    assert last["role"] == "assistant" and "The sum " in str(last["content"])
    # The round's one assistant message holds the whole answer.
    assert [m.content for m in result.messages if m.role == "assistant"] == ["The sum is 5."]


@STREAM
def test_on_truncation_continue_is_bounded(fake: FakeProvider, stream: bool) -> None:
    fake.script(*[openai_reply("more ", finish_reason="length")] * (MAX_CONTINUATIONS + 1))
    result, hooks = run(fake, "openai", policy={"on_truncation": "continue"}, stream=stream)
    assert "continuations" in failed(result.outcome, "MODEL_OUTPUT_TRUNCATED")
    assert len(fake.requests) == MAX_CONTINUATIONS + 1 and len(hooks.finished) == MAX_CONTINUATIONS + 1


# --- the SDKs' retry rules, within the budget --------------------------------------------------


def test_409_is_retried_like_the_sdk_does(fake: FakeProvider) -> None:
    fake.script(openai_error(409, "lock timeout", kind="conflict"), openai_reply("ok"))
    assert openai_client(f"{fake.url}/v1").complete(openai_request()).content == "ok"
    assert len(fake.requests) == 2


def test_a_500_that_says_x_should_retry_false_is_not_retried(fake: FakeProvider) -> None:
    fake.script(openai_error(500, "do not retry", kind="server_error", headers={"x-should-retry": "false"}))
    with pytest.raises(ModelRequestRefused) as info:
        openai_client(f"{fake.url}/v1").complete(openai_request())
    assert len(fake.requests) == 1 and info.value.status == 500 and not info.value.retryable


def test_a_400_that_says_x_should_retry_true_is_retried(fake: FakeProvider) -> None:
    fake.script(
        anthropic_error(400, "invalid_request_error", "try again", headers={"x-should-retry": "true"}),
        anthropic_reply("ok"),
    )
    assert anthropic_client(fake.url).complete(anthropic_request()).content == "ok"
    assert len(fake.requests) == 2


def test_a_retry_after_past_the_budget_is_not_waited(fake: FakeProvider) -> None:
    fake.script(openai_error(429, "slow down", kind="rate_limit_error", headers={"retry-after": "30"}))
    with pytest.raises(ModelUnavailable, match="exceed the call's timeout"):
        openai_client(f"{fake.url}/v1").complete(openai_request(timeout_s=2.0))
    assert len(fake.requests) == 1


def test_retries_end_model_unavailable_after_the_policy_attempts(fake: FakeProvider) -> None:
    fake.script(*[Reply(503, {"error": {"message": "busy", "type": "overloaded_error"}})] * 4)
    with pytest.raises(ModelUnavailable, match="after 4 attempts"):
        anthropic_client(fake.url).complete(anthropic_request())
    assert len(fake.requests) == 4


# --- parameters by model and API version -------------------------------------------------------


def test_openai_sends_max_completion_tokens_and_max_tokens_only_when_legacy(fake: FakeProvider) -> None:
    fake.script(openai_reply("a"), openai_reply("b"), openai_reply("c"))
    url = f"{fake.url}/v1"
    openai_client(url, max_completion_tokens=100).complete(openai_request())
    openai_client(url, max_tokens=200).complete(openai_request())
    openai_client(url, max_tokens=300, legacy_max_tokens=True).complete(openai_request())
    bodies = [r.body for r in fake.requests]
    assert [b.get("max_completion_tokens") for b in bodies] == [100, 200, None]
    assert [b.get("max_tokens") for b in bodies] == [None, None, 300]


def refused_field(model: dict[str, Any]) -> RequestInvalid:
    raw = {"owner": "t", "root_id": None, "input": "x", "config": {"model": model}}
    with pytest.raises(RequestInvalid) as info:
        prepare_execution(build_runtime(model_keys=ModelKeys()), raw)
    return info.value


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"provider": "anthropic", "name": "m", "temperature": 0.5, "top_p": 0.9}, "config.model.temperature"),
        ({"provider": "anthropic", "name": "m", "temperature": 1.5}, "config.model.temperature"),
        ({"provider": "openai", "name": "m", "max_tokens": 5, "max_completion_tokens": 5}, "config.model"),
        ({"provider": "openai", "name": "o3-mini", "temperature": 0.2}, "config.model.temperature"),
        ({"provider": "openai", "name": "o4-mini-2025-04-16", "temperature": 1}, "config.model.temperature"),
        ({"provider": "openai", "name": "gpt-5-nano", "temperature": 0.7}, "config.model.temperature"),
        ({"provider": "anthropic", "name": "claude-opus-4-7", "temperature": 0.5}, "config.model.temperature"),
        ({"provider": "anthropic", "name": "claude-sonnet-5-5", "top_p": 0.9}, "config.model.top_p"),
        ({"provider": "anthropic", "name": "claude-opus-4-8-20270101", "temperature": 0}, "config.model.temperature"),
    ],
    ids=[
        "anthropic_temperature_with_top_p",
        "anthropic_temperature_over_1",
        "openai_both_limits",
        "openai_o_series_temperature",
        "openai_o_series_default_temperature",
        "openai_gpt5_temperature",
        "anthropic_opus_4_7_temperature",
        "anthropic_5_top_p",
        "anthropic_dated_newer_model_temperature",
    ],
)
def test_parameters_the_provider_would_refuse_are_refused_at_submit(model: dict[str, Any], field: str) -> None:
    refusal = refused_field(model)
    assert refusal.field == field
    if model["name"] != "m":  # refused for the model: the message names it and the parameter
        assert model["name"] in refusal.message and field.split(".")[-1] in refusal.message


@pytest.mark.parametrize(
    "model",
    [
        {"provider": "openai", "name": "gpt-4o-mini", "temperature": 0.2},
        {"provider": "openai", "name": "gpt-5-chat-latest", "temperature": 0.2},
        {"provider": "openai", "name": "llama3.1", "temperature": 0.2},
        {"provider": "anthropic", "name": "claude-sonnet-4-5-20250929", "temperature": 0.2},
        {"provider": "anthropic", "name": "claude-opus-4-6", "top_p": 0.9},
        {"provider": "anthropic", "name": "claude-sonnet-4-20250514", "temperature": 0.2},
        {"provider": "anthropic", "name": "claude-3-5-haiku-20241022", "temperature": 0.2},
        {"provider": "anthropic", "name": "claude-opus-4-7"},
    ],
    ids=lambda m: f"{m['name']}-{'-'.join(k for k in ('temperature', 'top_p') if k in m) or 'none'}",
)
def test_sampling_parameters_are_accepted_for_models_that_take_them(model: dict[str, Any]) -> None:
    raw = {"owner": "t", "root_id": None, "input": "x", "config": {"model": model}}
    _, prepared = prepare_execution(build_runtime(model_keys=ModelKeys()), raw)
    sent = prepared.turn_config.model.model_dump()
    assert {k: sent[k] for k in ("temperature", "top_p") if k in model} == {
        k: model[k] for k in ("temperature", "top_p") if k in model
    }


def test_anthropic_sampling_and_is_error_reach_the_wire_through_the_sdk(fake: FakeProvider) -> None:
    fake.script(anthropic_reply("ok"))
    call = ToolCall("toolu_1", "add", {"a": 1})
    messages = (
        user_message("Add."),
        Message(role="assistant", content=None, tool_calls=(call,)),
        tool_message(call, {"error": "boom"}, is_error=True),
    )
    anthropic_client(fake.url, temperature=0.2).complete(anthropic_request(messages))
    [sent] = fake.requests
    assert sent.body["temperature"] == 0.2
    [result] = sent.body["messages"][-1]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is True


def test_each_attempt_is_clamped_to_what_is_left_of_the_budget(fake: FakeProvider) -> None:
    # Slow 500s: unclamped, every one of the 4 attempts would get the whole 0.8 s timeout.
    slow = Reply(500, {"error": {"message": "slow", "type": "server_error"}}, delay_s=0.5)
    fake.script(*[slow] * 4)
    with pytest.raises(ModelUnavailable):
        openai_client(f"{fake.url}/v1").complete(openai_request(timeout_s=0.8))
    assert 1 <= len(fake.requests) < 4

"""The scripted model: deterministic responses, ids, latency and usage."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.canonical import chain_digest
from runtime.config import ScriptedModelConfig
from runtime.errors import ModelScriptExhausted
from runtime.messages import Message, ToolCall, user_message
from runtime.models import scripted as scripted_module
from runtime.models.base import ModelRequest, ModelResponse, Usage
from runtime.models.scripted import ScriptedModel


def model(turns: list[dict]) -> ScriptedModel:
    return ScriptedModel(ScriptedModelConfig.model_validate({"provider": "scripted", "turns": turns}))


def request(round_index: int, messages: tuple[Message, ...] = (user_message("hi"),)) -> ModelRequest:
    digest = ""
    for m in messages:
        digest = chain_digest(digest, m.to_json())
    return ModelRequest(system="s", messages=messages, tools=(), messages_digest=digest, round_index=round_index)


TURNS = [
    {"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
    {"content": "thinking"},
    {"content": "x"},
    {"tool_calls": [{"name": "echo", "args": {"k": "v"}}, {"name": "add", "args": {"a": 0, "b": 0}}]},
]


def test_same_request_gives_the_same_response() -> None:
    m = model(TURNS)
    first, second = m.complete(request(3)), m.complete(request(3))

    assert first == second
    assert first.digest() == second.digest()
    # A fresh client built from the same script agrees too.
    assert model(TURNS).complete(request(3)) == first


def test_tool_call_ids_are_call_round_index() -> None:
    response = model(TURNS).complete(request(3))

    assert response.content is None
    assert response.tool_calls == (
        ToolCall("call_3_0", "echo", {"k": "v"}),
        ToolCall("call_3_1", "add", {"a": 0, "b": 0}),
    )
    assert [c.id for c in model(TURNS).complete(request(0)).tool_calls] == ["call_0_0"]


def test_turn_i_answers_round_i_whatever_the_history() -> None:
    m = model(TURNS)
    long_history = (user_message("a"), Message(role="assistant", content="b"), user_message("c"))

    assert m.complete(request(1)).content == "thinking"
    assert m.complete(request(1, long_history)).content == "thinking"
    assert m.complete(request(2)).content == "x"


def test_tool_call_args_are_a_copy_of_the_script() -> None:
    m = model(TURNS)
    m.complete(request(0)).tool_calls[0].args["a"] = 99

    assert m.complete(request(0)).tool_calls[0].args == {"a": 1, "b": 2}


def test_a_round_beyond_the_script_raises_model_script_exhausted() -> None:
    with pytest.raises(ModelScriptExhausted) as info:
        model(TURNS).complete(request(4))

    assert info.value.code == "MODEL_SCRIPT_EXHAUSTED"
    assert not info.value.retryable
    assert "4 turns" in info.value.message and "turn 5" in info.value.message


def test_latency_ms_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(scripted_module, "time", SimpleNamespace(sleep=slept.append))
    m = model([{"content": "slow", "latency_ms": 50}, {"content": "fast"}])

    assert m.complete(request(0)).content == "slow"
    assert slept == [0.05]
    assert m.complete(request(1)).content == "fast"
    assert slept == [0.05]  # a turn without latency_ms does not wait


def test_usage_tokens_are_deterministic() -> None:
    messages = (user_message("hi"),)
    # {"content":"hi","role":"user"} is 30 characters: ceil(30 / 4) = 8 tokens.
    assert user_message("hi").token_count == 8
    m = model([{"content": "hello world!"}, {"tool_calls": [{"name": "echo"}, {"name": "echo"}]}])

    # The system prompt "s" counts too: ceil(1 / 4) = 1 token.
    content = m.complete(request(0, messages))
    assert content.usage == Usage(input_tokens=9, output_tokens=3)  # ceil(12 / 4)
    calls = m.complete(request(1, messages))
    assert calls.usage == Usage(input_tokens=9, output_tokens=16)  # 8 per call
    assert m.complete(request(0, messages)).usage == content.usage


def test_usage_input_tokens_sum_every_message() -> None:
    messages = (user_message("hi"), Message(role="assistant", content="hello there"), user_message("x" * 100))
    response = model([{"content": "ok"}]).complete(request(0, messages))

    assert response.usage.input_tokens == sum(m.token_count for m in messages) + 1  # + the system prompt "s"
    assert response.usage.input_tokens > 8 + 25


def test_usage_is_not_part_of_the_response_digest() -> None:
    a = ModelResponse(content="x", usage=Usage(1, 2))
    b = ModelResponse(content="x", usage=Usage(100, 200))

    assert a.digest() == b.digest()
    assert a.as_message() == Message(role="assistant", content="x")

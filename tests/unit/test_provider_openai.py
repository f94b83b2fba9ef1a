"""The OpenAI-compatible adapter against a loopback server speaking Chat Completions:
the request it sends, the response it builds, its retries and its typed errors."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.errors import ModelError, ModelInputRejection, ModelUnavailable
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.base import ModelResponse, Usage
from runtime.models.provider_errors import ModelRequestRefused, ModelResponseInvalid
from tests.support.provider_clients import ADD_SPEC, ECHO_SPEC
from tests.support.provider_clients import OPENAI_KEY as KEY
from tests.support.provider_clients import OPENAI_PARALLEL as PARALLEL
from tests.support.provider_clients import model_request as request
from tests.support.provider_clients import openai_client as client
from tests.support.providers import FakeProvider, Reply, openai_error, openai_reply


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()




# --- request mapping -----------------------------------------------------------------------


def test_request_maps_system_tools_parallel_calls_and_tool_results(fake: FakeProvider) -> None:
    fake.script(openai_reply("ok"))
    client(f"{fake.url}/v1", max_tokens=256, temperature=0.5).complete(request(PARALLEL, tools=(ADD_SPEC, ECHO_SPEC)))

    [sent] = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "gpt-test"
    # max_tokens in the config is the output limit, sent as max_completion_tokens.
    assert sent.body["max_completion_tokens"] == 256 and sent.body["temperature"] == 0.5
    assert "max_tokens" not in sent.body
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": ADD_SPEC["description"], "parameters": ADD_SPEC["parameters"]},
        },
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": ECHO_SPEC["description"],
                "parameters": ECHO_SPEC["parameters"],
            },
        },
    ]
    messages = sent.body["messages"]
    assert messages[0] == {"role": "system", "content": "You add."}
    assert messages[1] == {"role": "user", "content": "Add 2 and 3, and echo x."}
    assert messages[2]["role"] == "assistant" and messages[2]["content"] == "Doing both."
    calls = messages[2]["tool_calls"]
    assert [(c["id"], c["type"], c["function"]["name"]) for c in calls] == [
        ("call_a", "function", "add"),
        ("call_b", "function", "echo"),
    ]
    # Arguments travel as JSON strings that decode to the original args.
    assert all(isinstance(c["function"]["arguments"], str) for c in calls)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 2, "b": 3}, {"x": "é", "n": [1, 2]}]
    # Tool results: the structured result as canonical JSON; the slimmed one as its text.
    assert messages[3] == {"role": "tool", "tool_call_id": "call_a", "content": '{"sum":5}'}
    assert messages[4] == {"role": "tool", "tool_call_id": "call_b", "content": '{"x":"é"...[output truncated]'}
    assert len(messages) == 5


def test_optional_fields_are_left_out_when_unset(fake: FakeProvider) -> None:
    fake.script(openai_reply("ok"))
    client(f"{fake.url}/v1").complete(request(system=""))

    body = fake.requests[0].body
    assert set(body) == {"model", "messages"}  # no tools [], no max_tokens, no temperature
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_assistant_message_with_only_tool_calls_sends_null_content(fake: FakeProvider) -> None:
    fake.script(openai_reply("ok"))
    calls_only = Message(role="assistant", tool_calls=(ToolCall("c1", "add", {"a": 1, "b": 1}),))
    client(f"{fake.url}/v1").complete(
        request((user_message("go"), calls_only, tool_message(calls_only.tool_calls[0], "two")))
    )

    messages = fake.requests[0].body["messages"]
    assert messages[2]["content"] is None and len(messages[2]["tool_calls"]) == 1
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "two"}  # a string result as is


def test_the_key_is_sent_as_a_bearer_token_and_no_key_means_no_header(fake: FakeProvider) -> None:
    fake.script(openai_reply("a"), openai_reply("b"))
    client(f"{fake.url}/v1").complete(request())
    client(f"{fake.url}/v1", key_ref=None).complete(request())

    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert "authorization" not in fake.requests[1].headers


# --- response mapping ----------------------------------------------------------------------


def test_response_with_parallel_tool_calls_maps_to_tool_calls_and_usage(fake: FakeProvider) -> None:
    fake.script(
        openai_reply(
            "Let me.",
            [("call_1", "add", '{"a": 2, "b": 3}'), ("call_2", "echo", '{"k": [1, {"z": null}]}')],
            usage=(120, 30),
        )
    )
    response = client(f"{fake.url}/v1").complete(request(tools=(ADD_SPEC, ECHO_SPEC)))

    assert response == ModelResponse(
        content="Let me.",
        tool_calls=(ToolCall("call_1", "add", {"a": 2, "b": 3}), ToolCall("call_2", "echo", {"k": [1, {"z": None}]})),
        usage=Usage(input_tokens=120, output_tokens=30),
        finish_reason="tool_calls",
    )


def test_final_answer_maps_to_content_without_tool_calls(fake: FakeProvider) -> None:
    fake.script(openai_reply("5", usage=(9, 1)))
    response = client(f"{fake.url}/v1").complete(request())

    assert (response.content, response.tool_calls, response.usage) == ("5", (), Usage(9, 1))


def test_missing_tool_call_ids_get_ids_from_round_and_index(fake: FakeProvider) -> None:
    # Some local servers omit the id; a re-executed round must produce the same ids.
    body = openai_reply(None, [("", "add", '{"a": 1, "b": 2}'), ("", "add", "")]).body
    fake.script(Reply(200, body))
    response = client(f"{fake.url}/v1").complete(request(round_index=7))

    assert response.tool_calls == (ToolCall("call_7_0", "add", {"a": 1, "b": 2}), ToolCall("call_7_1", "add", {}))


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [('{"a": 2, "b":', "not valid JSON"), ("[1, 2]", "not an object"), ('{"a": NaN}', "not valid JSON")],
    ids=["truncated", "array", "nan"],
)
def test_malformed_tool_call_arguments_raise_a_clear_model_error(
    fake: FakeProvider, arguments: str, fragment: str
) -> None:
    fake.script(openai_reply(None, [("call_9", "add", arguments)]))
    with pytest.raises(ModelResponseInvalid) as info:
        client(f"{fake.url}/v1").complete(request())

    assert isinstance(info.value, ModelError) and not info.value.retryable
    assert info.value.code == "MODEL_RESPONSE_INVALID"
    assert "call_9" in info.value.message and "add" in info.value.message and fragment in info.value.message


@pytest.mark.parametrize("body", [{"choices": []}, {"nothing": 1}, ["x"]], ids=["no_choices", "no_key", "a_list"])
def test_a_2xx_without_a_usable_choice_is_a_model_error(fake: FakeProvider, body: Any) -> None:
    fake.script(Reply(200, body))
    with pytest.raises(ModelResponseInvalid, match="no choices"):
        client(f"{fake.url}/v1").complete(request())


def test_a_2xx_that_is_not_json_is_a_model_error(fake: FakeProvider) -> None:
    fake.script(Reply(200, raw=b"<html>proxy</html>"))
    with pytest.raises(ModelResponseInvalid, match="not JSON"):
        client(f"{fake.url}/v1").complete(request())


# --- retries -------------------------------------------------------------------------------


def test_429_with_retry_after_is_retried_after_the_wait_it_asks_for(fake: FakeProvider) -> None:
    fake.script(
        openai_error(
            429, "Rate limit reached", kind="requests", code="rate_limit_exceeded", headers={"retry-after": "1"}
        ),
        openai_reply("done"),
    )
    response = client(f"{fake.url}/v1").complete(request())

    assert response.content == "done"
    first, second = fake.requests
    # The backoff alone would wait about 10 ms; the server asked for a second.
    assert second.at - first.at >= 0.95
    assert first.body == second.body


def test_500s_are_retried_a_bounded_number_of_times_then_model_unavailable(fake: FakeProvider) -> None:
    fake.script(*[openai_error(500, "The server had an error", kind="server_error")] * 10)
    with pytest.raises(ModelUnavailable) as info:
        client(f"{fake.url}/v1").complete(request())

    assert len(fake.requests) == 4
    assert info.value.retryable and info.value.code == "MODEL_UNAVAILABLE"
    assert "after 4 attempts" in info.value.message and "HTTP 500" in info.value.message


def test_a_503_then_success_returns_the_success(fake: FakeProvider) -> None:
    fake.script(Reply(503, raw=b"upstream down"), Reply(502, raw=b""), openai_reply("up"))
    assert client(f"{fake.url}/v1").complete(request()).content == "up"
    assert len(fake.requests) == 3


def test_a_retry_after_beyond_the_call_timeout_gives_up_at_once(fake: FakeProvider) -> None:
    fake.script(openai_error(429, "slow down", headers={"retry-after": "30"}), openai_reply("never"))
    # "would exceed" is decided before any wait, and one request means no second attempt.
    with pytest.raises(ModelUnavailable, match="would exceed"):
        client(f"{fake.url}/v1").complete(request(timeout_s=2.0))

    assert len(fake.requests) == 1


def test_a_slow_provider_times_out_as_model_unavailable(fake: FakeProvider) -> None:
    # The server would answer, 2 s late: raising instead of returning "late" is the timeout.
    fake.script(Reply(200, openai_reply("late").body, delay_s=2.0))
    with pytest.raises(ModelUnavailable, match=r"timed out|timeout"):
        client(f"{fake.url}/v1").complete(request(timeout_s=0.3))


def test_connection_refused_is_retried_then_model_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on the port now.
    with pytest.raises(ModelUnavailable, match="connection failed") as info:
        client(f"http://127.0.0.1:{port}/v1").complete(request())
    assert "after 4 attempts" in info.value.message


# --- typed errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        openai_error(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages resulted "
            "in 130512 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
        ),
        # vLLM: no error envelope, no code, only the message.
        Reply(
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
                "type": "BadRequestError",
                "code": 400,
            },
        ),
        Reply(413, raw=b"request entity too large"),
    ],
    ids=["openai", "vllm", "http_413"],
)
def test_context_overflow_is_model_input_rejection(fake: FakeProvider, reply: Reply) -> None:
    fake.script(reply)
    with pytest.raises(ModelInputRejection) as info:
        client(f"{fake.url}/v1").complete(request())

    assert info.value.code == "MODEL_INPUT_REJECTED" and not info.value.retryable
    assert len(fake.requests) == 1  # never retried


@pytest.mark.parametrize(
    ("status", "body", "fragment"),
    [
        (
            404,
            {
                "error": {
                    "message": "The model `gpt-nope` does not exist",
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                }
            },
            "gpt-nope",
        ),
        (
            400,
            {"error": {"message": "Invalid value for 'temperature'", "type": "invalid_request_error"}},
            "temperature",
        ),
        (422, {"detail": "bad"}, "HTTP 422"),
    ],
    ids=["404_model", "400_param", "422_other_shape"],
)
def test_other_4xx_are_refusals_naming_provider_and_status(
    fake: FakeProvider, status: int, body: Any, fragment: str
) -> None:
    fake.script(Reply(status, body))
    with pytest.raises(ModelRequestRefused) as info:
        client(f"{fake.url}/v1").complete(request())

    error = info.value
    assert (error.provider, error.status, error.retryable) == ("openai", status, False)
    assert error.message.startswith("openai (127.0.0.1:")
    assert f"HTTP {status}" in error.message and fragment in error.message
    assert len(fake.requests) == 1


def test_401_names_the_key_ref_but_not_the_providers_message(fake: FakeProvider) -> None:
    fake.script(openai_error(401, "Incorrect API key provided: sk-test-****-key.", code="invalid_api_key"))
    with pytest.raises(ModelRequestRefused) as info:
        client(f"{fake.url}/v1").complete(request())

    assert info.value.status == 401
    assert "api_key_ref 'default'" in info.value.message
    assert "sk-" not in info.value.message

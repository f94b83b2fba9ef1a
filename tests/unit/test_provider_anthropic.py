"""The Anthropic Messages adapter against a loopback server speaking its wire format:
the request it sends, the response it builds, its retries and its typed errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime.errors import ModelInputRejection, ModelUnavailable
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.anthropic import ANTHROPIC_VERSION
from runtime.models.base import ModelResponse, Usage
from runtime.models.provider_errors import ModelRequestRefused, ModelResponseInvalid
from runtime.tools import builtin_registry
from tests.support.provider_clients import ANTHROPIC_KEY as KEY
from tests.support.provider_clients import anthropic_client as client
from tests.support.provider_clients import model_request as request
from tests.support.providers import FakeProvider, Reply, anthropic_error, anthropic_reply

ADD_SPEC = builtin_registry().get("add").spec()  # type: ignore[union-attr]
ECHO_SPEC = builtin_registry().get("echo").spec()  # type: ignore[union-attr]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


ADD = ToolCall("toolu_a", "add", {"a": 2, "b": 3})
ECHO = ToolCall("toolu_b", "echo", {"x": "é"})
PARALLEL = (
    user_message("Add 2 and 3, and echo x."),
    Message(role="assistant", content="Doing both.", tool_calls=(ADD, ECHO)),
    tool_message(ADD, {"sum": 5}),
    Message(role="tool", tool_call_id="toolu_b", name="echo", content='{"x":"é"...[output truncated]'),
    Message(role="assistant", tool_calls=(ToolCall("toolu_c", "add", {"a": 5, "b": 1}),)),
    tool_message(ToolCall("toolu_c", "add", {"a": 5, "b": 1}), {"sum": 6}),
)


# --- request mapping -----------------------------------------------------------------------


def test_request_maps_system_tools_tool_use_and_merges_parallel_tool_results(fake: FakeProvider) -> None:
    fake.script(anthropic_reply("ok"))
    client(fake.url, max_tokens=321, temperature=0.25).complete(request(PARALLEL, tools=(ADD_SPEC, ECHO_SPEC)))

    [sent] = fake.requests
    assert sent.path == "/v1/messages"
    body = sent.body
    assert (body["model"], body["max_tokens"], body["temperature"], body["system"]) == (
        "claude-test",
        321,
        0.25,
        "You add.",
    )
    assert body["tools"] == [
        {"name": "add", "description": ADD_SPEC["description"], "input_schema": ADD_SPEC["parameters"]},
        {"name": "echo", "description": ECHO_SPEC["description"], "input_schema": ECHO_SPEC["parameters"]},
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Add 2 and 3, and echo x."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Doing both."},
                {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 2, "b": 3}},
                {"type": "tool_use", "id": "toolu_b", "name": "echo", "input": {"x": "é"}},
            ],
        },
        # Both results of the parallel round in ONE user message, in call order.
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": '{"sum":5}'},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": '{"x":"é"...[output truncated]'},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_c", "name": "add", "input": {"a": 5, "b": 1}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_c", "content": '{"sum":6}'}]},
    ]


def test_headers_carry_the_key_and_the_api_version(fake: FakeProvider) -> None:
    fake.script(anthropic_reply("a"), anthropic_reply("b"))
    client(fake.url).complete(request())
    client(fake.url, key_ref=None).complete(request())

    assert fake.requests[0].headers["x-api-key"] == KEY
    assert fake.requests[0].headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "x-api-key" not in fake.requests[1].headers
    assert "authorization" not in fake.requests[0].headers


def test_optional_fields_are_left_out_and_max_tokens_has_a_default(fake: FakeProvider) -> None:
    fake.script(anthropic_reply("ok"))
    client(fake.url).complete(request(system=""))

    body = fake.requests[0].body
    assert set(body) == {"model", "max_tokens", "messages"}
    assert body["max_tokens"] == 4096


# --- response mapping ----------------------------------------------------------------------


def test_response_with_parallel_tool_use_maps_to_tool_calls_and_usage(fake: FakeProvider) -> None:
    fake.script(
        anthropic_reply(
            "Checking.",
            [("toolu_1", "add", {"a": 2, "b": 3}), ("toolu_2", "echo", {"k": [1, None]})],
            usage={
                "input_tokens": 40,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 2,
                "output_tokens": 17,
            },
        )
    )
    response = client(fake.url).complete(request(tools=(ADD_SPEC, ECHO_SPEC)))

    assert response == ModelResponse(
        content="Checking.",
        tool_calls=(ToolCall("toolu_1", "add", {"a": 2, "b": 3}), ToolCall("toolu_2", "echo", {"k": [1, None]})),
        usage=Usage(input_tokens=142, output_tokens=17),
        finish_reason="tool_use",
    )


def test_text_blocks_are_joined_and_other_blocks_ignored(fake: FakeProvider) -> None:
    body = anthropic_reply("b").body
    body["content"] = [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    fake.script(Reply(200, body))
    response = client(fake.url).complete(request())

    assert (response.content, response.tool_calls) == ("ab", ())


def test_tool_use_input_that_is_not_an_object_is_a_model_error(fake: FakeProvider) -> None:
    body = anthropic_reply(None, [("toolu_x", "add", {})]).body
    body["content"][0]["input"] = "[1, 2"
    fake.script(Reply(200, body))
    with pytest.raises(ModelResponseInvalid, match=r"toolu_x \(add\) has an input that is not a JSON object"):
        client(fake.url).complete(request())


# --- retries and typed errors --------------------------------------------------------------


def test_429_with_retry_after_as_an_http_date_is_retried(fake: FakeProvider) -> None:
    # An HTTP date in the past means "now": retried at once, not after the backoff ceiling.
    fake.script(
        anthropic_error(
            429,
            "rate_limit_error",
            "Number of requests has exceeded your rate limit",
            headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"},
        ),
        anthropic_reply("done"),
    )
    assert client(fake.url).complete(request()).content == "done"
    assert len(fake.requests) == 2


def test_overloaded_529_is_retried_then_model_unavailable(fake: FakeProvider) -> None:
    fake.script(*[anthropic_error(529, "overloaded_error", "Overloaded")] * 6)
    with pytest.raises(ModelUnavailable) as info:
        client(fake.url).complete(request())

    assert len(fake.requests) == 4
    assert "HTTP 529 (overloaded): Overloaded" in info.value.message


@pytest.mark.parametrize(
    "reply",
    [
        anthropic_error(400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"),
        anthropic_error(
            400,
            "invalid_request_error",
            "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000, decrease input "
            "length or `max_tokens` and try again",
        ),
        anthropic_error(413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
    ],
    ids=["prompt_too_long", "exceed_context_limit", "request_too_large"],
)
def test_context_overflow_is_model_input_rejection(fake: FakeProvider, reply: Reply) -> None:
    fake.script(reply)
    with pytest.raises(ModelInputRejection):
        client(fake.url).complete(request())
    assert len(fake.requests) == 1


def test_another_invalid_request_is_a_refusal_not_an_overflow(fake: FakeProvider) -> None:
    fake.script(anthropic_error(400, "invalid_request_error", "messages.1.content.0.tool_use.id: String should match"))
    with pytest.raises(ModelRequestRefused) as info:
        client(fake.url).complete(request())

    assert not isinstance(info.value, ModelInputRejection)
    assert (info.value.provider, info.value.status) == ("anthropic", 400)
    assert "HTTP 400 (invalid_request): messages.1.content.0.tool_use.id" in info.value.message


def test_404_unknown_model_names_provider_and_status(fake: FakeProvider) -> None:
    fake.script(anthropic_error(404, "not_found_error", "model: claude-nope"))
    with pytest.raises(ModelRequestRefused, match=r"^anthropic \(127\.0\.0\.1:\d+\) refused the request: HTTP 404"):
        client(fake.url).complete(request())

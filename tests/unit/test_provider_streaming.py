"""Both adapters streaming through the SDKs (``request.on_delta`` set) against loopback
servers speaking each streaming wire format: OpenAI ``data: {...}`` chunks ending
``data: [DONE]`` (tool-call argument deltas, usage in the last chunk), Anthropic
message_start / content_block_delta / message_delta / message_stop. The deltas arrive in
order and the response is the one the non-streaming call builds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from runtime.errors import ModelOutputTruncated, ModelUnavailable
from runtime.messages import ToolCall
from runtime.models.base import ModelRequest, ModelResponse, Usage
from runtime.models.scrub import REDACTED, ScrubbedDeltas
from tests.support.provider_clients import ANTHROPIC_KEY, OPENAI_KEY, anthropic_client, openai_client
from tests.support.provider_clients import model_request as anthropic_request
from tests.support.provider_clients import model_request as openai_request
from tests.support.providers import (
    FakeProvider,
    anthropic_reply,
    anthropic_stream,
    openai_reply,
    openai_stream,
    sse,
)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


def streaming(request: ModelRequest) -> tuple[ModelRequest, list[str]]:
    seen: list[str] = []
    return replace(request, on_delta=seen.append), seen


def test_openai_streams_text_deltas_and_builds_the_same_response(fake: FakeProvider) -> None:
    fake.script(openai_stream(["The ", "sum ", "is 5."], usage=(20, 4)), openai_reply("The sum is 5.", usage=(20, 4)))
    model = openai_client(f"{fake.url}/v1")
    request, seen = streaming(openai_request())
    streamed = model.complete(request)
    plain = model.complete(openai_request())

    assert "".join(seen) == "The sum is 5." and len(seen) >= 1
    assert streamed == plain == ModelResponse("The sum is 5.", usage=Usage(20, 4), finish_reason="stop")
    first, second = fake.requests
    assert first.body["stream"] is True and first.body["stream_options"] == {"include_usage": True}
    assert "stream" not in second.body
    assert first.headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_openai_streamed_tool_call_arguments_are_assembled(fake: FakeProvider) -> None:
    fake.script(openai_stream([], [("call_1", "add", ['{"a"', ": 2, ", '"b": 3}']), ("call_2", "echo", ["{}"])]))
    request, seen = streaming(openai_request())
    response = openai_client(f"{fake.url}/v1").complete(request)

    assert response.tool_calls == (ToolCall("call_1", "add", {"a": 2, "b": 3}), ToolCall("call_2", "echo", {}))
    assert response.finish_reason == "tool_calls" and response.usage == Usage(11, 7) and seen == []


def test_openai_stream_cut_off_mid_arguments_is_truncated(fake: FakeProvider) -> None:
    fake.script(openai_stream([], [("call_1", "add", ['{"a": 2, "b'])], finish_reason="length"))
    request, _ = streaming(openai_request())
    with pytest.raises(ModelOutputTruncated, match="call_1"):
        openai_client(f"{fake.url}/v1").complete(request)


def test_anthropic_streams_text_and_tool_use_and_builds_the_same_response(fake: FakeProvider) -> None:
    uses = [("toolu_1", "add", ['{"a": 2', ', "b": 3}'])]
    fake.script(
        anthropic_stream(["Add", "ing."], uses, usage=(13, 5)),
        anthropic_reply(
            "Adding.", [("toolu_1", "add", {"a": 2, "b": 3})], usage={"input_tokens": 13, "output_tokens": 5}
        ),
    )
    model = anthropic_client(fake.url)
    request, seen = streaming(anthropic_request())
    streamed = model.complete(request)
    plain = model.complete(anthropic_request())

    assert "".join(seen) == "Adding."
    assert streamed == plain
    assert streamed.tool_calls == (ToolCall("toolu_1", "add", {"a": 2, "b": 3}),)
    assert streamed.finish_reason == "tool_use" and streamed.usage == Usage(13, 5)
    assert fake.requests[0].body["stream"] is True and fake.requests[0].headers["x-api-key"] == ANTHROPIC_KEY


def test_anthropic_stream_cut_off_by_max_tokens_in_a_tool_use_is_truncated(fake: FakeProvider) -> None:
    fake.script(anthropic_stream([], [("toolu_1", "add", ['{"a": 2, "b'])], stop_reason="max_tokens"))
    request, _ = streaming(anthropic_request())
    with pytest.raises(ModelOutputTruncated, match="toolu_1"):
        anthropic_client(fake.url).complete(request)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_key_split_across_deltas_never_reaches_the_delta_sink(fake: FakeProvider, provider: str) -> None:
    key = OPENAI_KEY if provider == "openai" else ANTHROPIC_KEY
    pieces = ["The key is ", key[:5], key[5:12], key[12:] + ".", " Done."]
    if provider == "openai":
        fake.script(openai_stream(pieces))
        request, seen = streaming(openai_request())
        response = openai_client(f"{fake.url}/v1").complete(request)
    else:
        fake.script(anthropic_stream(pieces))
        request, seen = streaming(anthropic_request())
        response = anthropic_client(fake.url).complete(request)

    joined = "".join(seen)
    assert joined == f"The key is {REDACTED}. Done." == response.content
    assert all(key[:5] not in s or REDACTED in s for s in seen) and key not in joined


def test_scrubbed_deltas_hold_back_only_what_could_begin_a_secret() -> None:
    out: list[str] = []
    deltas = ScrubbedDeltas(out.append, ("secret",))
    for piece in ["hello ", "wor", "ld se", "cr", "et!"]:
        deltas.push(piece)
    deltas.flush()
    assert "".join(out) == f"hello world {REDACTED}!"
    assert out[0] == "h"  # released as soon as it cannot be part of a secret


def test_an_error_event_inside_a_stream_is_unavailable_and_retryable(fake: FakeProvider) -> None:
    start = anthropic_stream(["Hel"]).raw or b""
    head = start.split(b"event: message_delta")[0]
    error = sse([("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})])
    fake.script(replace(error, raw=head + (error.raw or b"")))
    request, seen = streaming(anthropic_request())
    with pytest.raises(ModelUnavailable) as info:
        anthropic_client(fake.url).complete(request)
    assert info.value.retryable and "error event" in info.value.message
    # The text before the error was read (and, being shorter than a key, still held back).
    assert seen == [] and len(fake.requests) == 1


def test_a_streamed_openai_answer_keeps_the_response_id_and_model_for_traces(fake: FakeProvider) -> None:
    fake.script(openai_stream(["hi"], usage=(3, 1)))
    request, _ = streaming(openai_request())
    answer = openai_client(f"{fake.url}/v1").complete(request)
    assert (answer.response_id, answer.response_model) == ("chatcmpl-s", "fake")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_key_split_into_a_long_piece_and_a_short_tail_is_redacted_whole(fake: FakeProvider, provider: str) -> None:
    # The first chunk alone holds a piece long enough to redact; the tail alone does not.
    key = OPENAI_KEY if provider == "openai" else ANTHROPIC_KEY
    pieces = ["The key is ", key[:-4], key[-4:] + "."]
    if provider == "openai":
        fake.script(openai_stream(pieces))
        response = openai_client(f"{fake.url}/v1").complete(streaming(openai_request())[0])
    else:
        fake.script(anthropic_stream(pieces))
        response = anthropic_client(fake.url).complete(streaming(anthropic_request())[0])
    assert response.content == f"The key is {REDACTED}."

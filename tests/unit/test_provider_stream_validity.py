"""A streamed call must carry a stream: a 2xx answer to ``stream: true`` that is a plain
JSON body (what the OpenAPI mock server Prism answers), a stream without a single chunk,
or a stream that ends without its final finish reason (OpenAI ``finish_reason``, Anthropic
``message_delta.stop_reason`` and ``message_stop``) is ``MODEL_RESPONSE_INVALID``, never
an empty answer. Against a loopback server speaking each wire format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from runtime.models.base import ModelRequest, ModelResponse
from runtime.models.provider_errors import ModelResponseInvalid
from tests.support.provider_clients import anthropic_client, model_request, openai_client
from tests.support.providers import FakeProvider, Reply, anthropic_reply, anthropic_stream, openai_reply, openai_stream


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


def streamed_call(fake: FakeProvider, provider: str, reply: Reply) -> ModelResponse:
    fake.script(reply)
    request: ModelRequest = replace(model_request(), on_delta=lambda _text: None)
    model = openai_client(f"{fake.url}/v1") if provider == "openai" else anthropic_client(fake.url)
    return model.complete(request)


def as_plain_json(reply: Reply) -> Reply:
    """The non-streamed answer, sent as is to a request that asked to stream (``raw``: the
    loopback server does not turn it into a stream)."""
    return Reply(200, raw=json.dumps(reply.body).encode(), content_type="application/json")


def without(reply: Reply, *markers: bytes) -> Reply:
    """An SSE reply with every event whose text holds one of ``markers`` left out."""
    events = (reply.raw or b"").split(b"\n\n")
    kept = [e for e in events if not any(m in e for m in markers)]
    return replace(reply, raw=b"\n\n".join(kept))


@pytest.mark.parametrize(
    ("provider", "reply"),
    [
        ("openai", as_plain_json(openai_reply("The sum is 5."))),
        ("anthropic", as_plain_json(anthropic_reply("The sum is 5."))),
    ],
)
def test_a_plain_json_answer_to_a_streamed_call_is_an_invalid_response(
    fake: FakeProvider, provider: str, reply: Reply
) -> None:
    with pytest.raises(ModelResponseInvalid) as info:
        streamed_call(fake, provider, reply)
    assert info.value.code == "MODEL_RESPONSE_INVALID" and not info.value.retryable
    assert "application/json" in info.value.message


@pytest.mark.parametrize(
    ("provider", "reply"),
    [("openai", openai_stream(["The sum ", "is 5."])), ("anthropic", anthropic_stream(["The sum ", "is 5."]))],
)
def test_a_stream_under_a_content_type_that_is_not_sse_is_an_invalid_response(
    fake: FakeProvider, provider: str, reply: Reply
) -> None:
    with pytest.raises(ModelResponseInvalid, match="text/plain"):
        streamed_call(fake, provider, replace(reply, content_type="text/plain"))


@pytest.mark.parametrize(
    ("provider", "reply"),
    [
        ("openai", Reply(200, raw=b"data: [DONE]\n\n", content_type="text/event-stream")),
        ("anthropic", Reply(200, raw=b"", content_type="text/event-stream")),
    ],
)
def test_a_stream_without_a_chunk_is_an_invalid_response(fake: FakeProvider, provider: str, reply: Reply) -> None:
    with pytest.raises(ModelResponseInvalid, match="no"):
        streamed_call(fake, provider, reply)


@pytest.mark.parametrize(
    ("provider", "reply"),
    [
        ("openai", without(openai_stream(["The sum ", "is 5."]), b'"finish_reason": "stop"')),
        ("anthropic", without(anthropic_stream(["The sum ", "is 5."]), b"message_delta", b"message_stop")),
        ("anthropic", without(anthropic_stream(["The sum ", "is 5."]), b"message_stop")),
        ("anthropic", without(anthropic_stream(["The sum ", "is 5."]), b"message_delta")),
    ],
    ids=["openai-no-finish-reason", "anthropic-no-delta-no-stop", "anthropic-no-message-stop", "anthropic-no-delta"],
)
def test_a_stream_that_ends_without_its_final_finish_reason_is_an_invalid_response(
    fake: FakeProvider, provider: str, reply: Reply
) -> None:
    with pytest.raises(ModelResponseInvalid, match="ended without"):
        streamed_call(fake, provider, reply)


@pytest.mark.parametrize(
    ("provider", "reply"),
    [("openai", openai_stream(["The sum ", "is 5."])), ("anthropic", anthropic_stream(["The sum ", "is 5."]))],
)
def test_a_complete_stream_is_still_an_answer(fake: FakeProvider, provider: str, reply: Reply) -> None:
    response = streamed_call(fake, provider, reply)
    assert response.content == "The sum is 5." and response.finish_reason in ("stop", "end_turn")

"""The Anthropic Messages adapter: ``POST {base_url}/v1/messages`` with headers
``x-api-key`` and ``anthropic-version``, through the ``anthropic`` SDK.

Mapping (request): the system prompt is the top-level ``system``; tool specs become
``tools: [{name, description, input_schema}]``; an assistant message becomes content
blocks (its text, then one ``tool_use`` block per call); a tool result becomes a
``tool_result`` block in a user message. Consecutive messages of one role are merged into
one message (consecutive tool results of a parallel round become one user message, as
the API requires), keeping their order, so tool results come before any text after them.

Mapping (response): text blocks joined -> ``content``; ``tool_use`` blocks ->
``ToolCall(id, name, input)``; usage: input tokens (including cache reads and writes)
and output tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import anthropic
import httpx2
from pydantic import BaseModel

from runtime.canonical import object_of
from runtime.config import AnthropicModelConfig
from runtime.errors import ModelOutputTruncated, ModelRefused
from runtime.messages import Message, ToolCall
from runtime.models.base import ModelRequest, ModelResponse, Usage, reported_str
from runtime.models.http import HttpModel, require_event_stream, token_count, tool_result_text
from runtime.models.keys import ModelKeys
from runtime.models.provider_errors import ModelResponseInvalid, error_fields
from runtime.models.replies import HttpReply
from runtime.models.scrub import ScrubbedDeltas, scrub
from runtime.models.transport import DEFAULT_RETRY, ClientCache
from schema.wire.json import JsonObject, JsonValue
from schema.wire.retry import RetryPolicy

PROVIDER = "anthropic"
ANTHROPIC_VERSION = "2023-06-01"
# Sent only when configured, outside the SDK's typed params (see AnthropicModel.send).
SAMPLING = frozenset({"temperature", "top_p"})
OVERFLOW_PHRASES = ("prompt is too long", "exceed context limit", "context window")


def _blocks(message: Message) -> tuple[str, list[JsonObject]]:
    if message.role == "tool":
        block: JsonObject = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        text = tool_result_text(message)
        if text:
            block["content"] = text
        if message.is_error:
            block["is_error"] = True
        return "user", [block]
    blocks: list[JsonObject] = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in message.tool_calls]
    return message.role, blocks


def to_anthropic_messages(messages: tuple[Message, ...]) -> list[JsonObject]:
    merged: list[tuple[str, list[JsonValue]]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:  # the API refuses empty content; an empty message says nothing
            continue
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        else:
            merged.append((role, [*blocks]))
    return [{"role": role, "content": blocks} for role, blocks in merged]


def to_anthropic_tools(tools: tuple[JsonObject, ...]) -> list[JsonValue]:
    return [
        {"name": t["name"], "description": t.get("description", ""), "input_schema": t["parameters"]} for t in tools
    ]


def messages_request_body(config: AnthropicModelConfig, request: ModelRequest) -> JsonObject:
    body: JsonObject = {
        "model": config.name,
        "max_tokens": config.max_tokens,
        "messages": [*to_anthropic_messages(request.messages)],
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = to_anthropic_tools(request.tools)
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if config.top_p is not None:
        body["top_p"] = config.top_p
    return body


def parse_messages_response(body: JsonValue) -> ModelResponse:
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(content, list):
        raise ModelResponseInvalid(f"{PROVIDER}: the response has no content list")
    stop = body.get("stop_reason")
    finish_reason = stop if isinstance(stop, str) and stop else None
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        kind, text = block.get("type"), block.get("text")
        if kind == "text" and isinstance(text, str):
            texts.append(text)
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise ModelResponseInvalid(f"{PROVIDER}: tool_use block {i} has no id or name")
            if not isinstance(args, dict) and finish_reason == "max_tokens":
                raise ModelOutputTruncated(
                    f"{PROVIDER}: tool_use block {call_id} ({name}) was cut off by the token limit (max_tokens)"
                )
            if not isinstance(args, dict):
                raise ModelResponseInvalid(
                    f"{PROVIDER}: tool_use block {call_id} ({name}) has an input that is not a JSON object"
                )
            calls.append(ToolCall(call_id, name, args))
        # thinking and other block types are not part of the conversation we keep
    usage = object_of(body.get("usage"))
    input_tokens = sum(
        token_count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    text = "".join(texts) if texts else None
    if finish_reason == "model_context_window_exceeded":
        raise ModelOutputTruncated(f"{PROVIDER}: the answer was cut off by the model's context window")
    if finish_reason == "refusal":
        raise ModelRefused(f"{PROVIDER}: the model refused" + (f": {text[:500]}" if text else ""))
    return ModelResponse(
        content=text,
        tool_calls=tuple(calls),
        usage=Usage(input_tokens=input_tokens, output_tokens=token_count(usage.get("output_tokens"))),
        finish_reason=finish_reason,
        response_id=reported_str(body.get("id")),
        response_model=reported_str(body.get("model")),
    )


def assemble_message_events(events: Iterable[JsonObject], deltas: ScrubbedDeltas) -> JsonObject:
    """Streamed Messages events (``message_start``, ``content_block_start`` /
    ``content_block_delta`` / ``content_block_stop``, ``message_delta``,
    ``message_stop``) as the one message the non-streaming call answers: text deltas
    joined (and handed to ``deltas`` as they arrive), ``input_json_delta`` fragments
    decoded into the tool_use input (left a string when cut off: the parser decides), the
    stop reason and usage of ``message_delta``. A stream with no event, or that ends
    without a ``message_delta`` stop reason and ``message_stop``, was cut short:
    ``ModelResponseInvalid``."""
    kinds: set[object] = set()
    message: JsonObject = {}
    blocks: dict[int, JsonObject] = {}
    inputs: dict[int, list[str]] = {}
    for event in events:
        kind = event.get("type")
        kinds.add(kind)
        index, delta = event.get("index"), event.get("delta")
        started, block, usage = event.get("message"), event.get("content_block"), event.get("usage")
        if kind == "message_start" and isinstance(started, dict):
            message = dict(started)
        elif kind == "content_block_start" and isinstance(index, int) and isinstance(block, dict):
            blocks[index] = dict(block)
        elif kind == "content_block_delta" and isinstance(index, int) and isinstance(delta, dict):
            _add_delta(blocks.setdefault(index, {"type": "text", "text": ""}), inputs.setdefault(index, []),
                       delta, deltas)
        elif kind == "message_delta":
            if isinstance(delta, dict) and delta.get("stop_reason"):
                message["stop_reason"] = delta["stop_reason"]
            if isinstance(usage, dict):
                merged = dict(object_of(message.get("usage")))
                merged.update({k: v for k, v in usage.items() if v is not None})
                message["usage"] = merged
    deltas.flush()
    _require_ended(kinds, message)
    for index, parts in inputs.items():
        if parts and index in blocks:
            raw = "".join(parts)
            try:
                blocks[index]["input"] = json.loads(raw)
            except ValueError:
                blocks[index]["input"] = raw  # cut off: not an object (truncated under max_tokens)
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _require_ended(kinds: set[object], message: JsonObject) -> None:
    if not kinds:
        raise ModelResponseInvalid(f"{PROVIDER}: the stream carried no event")
    if not message.get("stop_reason") or "message_stop" not in kinds:
        missing = [name for name, absent in (("a message_delta stop_reason", not message.get("stop_reason")),
                                             ("message_stop", "message_stop" not in kinds)) if absent]
        raise ModelResponseInvalid(f"{PROVIDER}: the stream ended without {' and '.join(missing)}")


def _add_delta(block: JsonObject, inputs: list[str], delta: JsonObject, deltas: ScrubbedDeltas) -> None:
    kind, text, partial = delta.get("type"), delta.get("text"), delta.get("partial_json")
    if kind == "text_delta" and isinstance(text, str):
        current = block.get("text", "")
        if not isinstance(current, str):
            raise TypeError(f'can only concatenate str (not "{type(current).__name__}") to str')
        block["text"] = current + text
        deltas.push(text)
    elif kind == "input_json_delta" and isinstance(partial, str):
        inputs.append(partial)


def is_context_overflow(reply: HttpReply) -> bool:
    if reply.status == 413:  # request_too_large: the body is over the API's size limit
        return True
    if reply.status != 400:
        return False
    _, _, message = error_fields(reply)
    return any(phrase in message.lower() for phrase in OVERFLOW_PHRASES)


class AnthropicModel(HttpModel[AnthropicModelConfig]):
    provider = PROVIDER

    def headers(self, token: str | None) -> dict[str, object]:
        # The API version our mapping is written for, pinned (not the SDK's default).
        return {
            "anthropic-version": ANTHROPIC_VERSION,
            "x-api-key": anthropic.Omit() if token is None else token,
            "Authorization": anthropic.Omit(),
        }

    def request_body(self, request: ModelRequest) -> JsonObject:
        return messages_request_body(self._config, request)

    def send(self, client: Any, body: JsonObject, timeout_s: float) -> httpx2.Response:
        # The SDK's typed params of this API version carry no sampling parameters (newer
        # models refuse them); where the config sets one, it goes as an extra field.
        typed = {k: v for k, v in body.items() if k not in SAMPLING}
        extra = {k: v for k, v in body.items() if k in SAMPLING}
        response: httpx2.Response = client.messages.with_raw_response.create(
            **typed, extra_body=extra or None, timeout=timeout_s
        ).http_response
        return response

    def stream(self, client: Any, body: JsonObject, timeout_s: float, deltas: ScrubbedDeltas) -> JsonObject:
        typed = {k: v for k, v in body.items() if k not in SAMPLING}
        extra = {k: v for k, v in body.items() if k in SAMPLING}
        events = client.messages.create(**typed, stream=True, extra_body=extra or None, timeout=timeout_s)
        with events:
            require_event_stream(events, PROVIDER, self._secrets)
            # Scrubbed whole, not per event: a piece of a key split across two would
            # leave a tail too short to be recognised on its own (the deltas scrub themselves).
            assembled = assemble_message_events((e.to_dict() for e in events), deltas)
            answer: JsonObject = scrub(assembled, self._secrets)
            return answer

    def parse(self, body: JsonValue, request: ModelRequest) -> ModelResponse:
        return parse_messages_response(body)

    def is_context_overflow(self, reply: HttpReply) -> bool:
        return is_context_overflow(reply)


class AnthropicProvider:
    """The ``anthropic`` entry of ``Runtime.base.model_providers`` (see ``OpenAIProvider``)."""

    def __init__(self, keys: ModelKeys, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._keys = keys
        self._clients = ClientCache(PROVIDER, retry)
        self._secrets = keys.values()

    def __repr__(self) -> str:
        return "AnthropicProvider()"

    def __call__(self, config: BaseModel, owner: str) -> AnthropicModel:
        if not isinstance(config, AnthropicModelConfig):
            raise TypeError(f"AnthropicProvider needs an AnthropicModelConfig, not {type(config).__name__}")
        key = self._keys.resolve(PROVIDER, config.api_key_ref, config.base_url, owner)
        return AnthropicModel(config, key, self._clients, self._secrets)

    def close(self) -> None:
        self._clients.close()

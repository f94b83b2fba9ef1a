"""The Anthropic Messages adapter: ``POST {base_url}/v1/messages`` with headers
``x-api-key`` and ``anthropic-version``.

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

from typing import Any

from runtime.config import AnthropicModelConfig
from runtime.messages import Message, ToolCall
from runtime.models.base import ModelRequest, ModelResponse, Usage
from runtime.models.http import HttpModel, token_count, tool_result_text
from runtime.models.keys import ModelKeys
from runtime.models.provider_errors import ModelResponseInvalid, error_fields
from runtime.models.transport import DEFAULT_RETRY, HttpReply, JsonPoster, SharedClient
from schema.wire.retry import RetryPolicy

PROVIDER = "anthropic"
ANTHROPIC_VERSION = "2023-06-01"
OVERFLOW_PHRASES = ("prompt is too long", "exceed context limit", "context window")


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        text = tool_result_text(message)
        if text:
            block["content"] = text
        if message.is_error:
            block["is_error"] = True
        return "user", [block]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in message.tool_calls]
    return message.role, blocks


def to_anthropic_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:  # the API refuses empty content; an empty message says nothing
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def to_anthropic_tools(tools: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [
        {"name": t["name"], "description": t.get("description", ""), "input_schema": t["parameters"]} for t in tools
    ]


def messages_request_body(config: AnthropicModelConfig, request: ModelRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": config.name,
        "max_tokens": config.max_tokens,
        "messages": to_anthropic_messages(request.messages),
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = to_anthropic_tools(request.tools)
    if config.temperature is not None:
        body["temperature"] = config.temperature
    return body


def parse_messages_response(body: Any) -> ModelResponse:
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, list):
        raise ModelResponseInvalid(f"{PROVIDER}: the response has no content list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise ModelResponseInvalid(f"{PROVIDER}: tool_use block {i} has no id or name")
            if not isinstance(args, dict):
                raise ModelResponseInvalid(
                    f"{PROVIDER}: tool_use block {call_id} ({name}) has an input that is not a JSON object"
                )
            calls.append(ToolCall(call_id, name, args))
        # thinking and other block types are not part of the conversation we keep
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    input_tokens = sum(
        token_count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return ModelResponse(
        content="".join(texts) if texts else None,
        tool_calls=tuple(calls),
        usage=Usage(input_tokens=input_tokens, output_tokens=token_count(usage.get("output_tokens"))),
    )


def is_context_overflow(reply: HttpReply) -> bool:
    if reply.status == 413:  # request_too_large: the body is over the API's size limit
        return True
    if reply.status != 400:
        return False
    _, _, message = error_fields(reply)
    return any(phrase in message.lower() for phrase in OVERFLOW_PHRASES)


class AnthropicModel(HttpModel):
    provider = PROVIDER
    path = "/v1/messages"

    def headers(self, token: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if token is not None:
            headers["x-api-key"] = token
        return headers

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        return messages_request_body(self._config, request)

    def parse(self, body: Any, request: ModelRequest) -> ModelResponse:
        return parse_messages_response(body)

    def is_context_overflow(self, reply: HttpReply) -> bool:
        return is_context_overflow(reply)


class AnthropicProvider:
    """The ``anthropic`` entry of ``Runtime.base.model_providers`` (see ``OpenAIProvider``)."""

    def __init__(self, keys: ModelKeys, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._keys = keys
        self._retry = retry
        self._http = SharedClient()
        self._secrets = keys.values()

    def __repr__(self) -> str:
        return "AnthropicProvider()"

    def __call__(self, config: Any, owner: str) -> AnthropicModel:
        if not isinstance(config, AnthropicModelConfig):
            raise TypeError(f"AnthropicProvider needs an AnthropicModelConfig, not {type(config).__name__}")
        key = self._keys.resolve(PROVIDER, config.api_key_ref, config.base_url, owner)
        return AnthropicModel(config, key, JsonPoster(PROVIDER, self._http, self._retry), self._secrets)

    def close(self) -> None:
        self._http.close()

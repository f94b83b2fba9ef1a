"""The OpenAI-compatible Chat Completions adapter: OpenAI, vLLM, Ollama, LM Studio and
anything else that serves ``POST {base_url}/chat/completions``.

Mapping (request): the system prompt is the first message (``role: system``); tool specs
become ``tools: [{type: function, function: {name, description, parameters}}]``; an
assistant's tool calls become ``tool_calls`` with JSON-string ``arguments``; a tool
result becomes a ``role: tool`` message with its ``tool_call_id`` and, as content, the
slimmed text if the context has one, else the result (a string as is, anything else as
canonical JSON, so equal results give equal prompts and provider prompt caches hit).

Mapping (response): ``choices[0].message`` -> ``ModelResponse``; tool call arguments are
parsed from JSON and must be an object; ``usage.prompt_tokens`` / ``completion_tokens``.
A server that omits tool call ids (some local servers) gets ``call_<round>_<index>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx2
import openai
from pydantic import BaseModel

from runtime.canonical import object_of
from runtime.config import OpenAIModelConfig
from runtime.errors import ModelContentFiltered, ModelOutputTruncated, ModelRefused, ModelToolCallUnsupported
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

PROVIDER = "openai"
# Phrases OpenAI-compatible servers use when the prompt does not fit the context window.
OVERFLOW_PHRASES = (
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "context window",
    "prompt is too long",
    "too many input tokens",
)


def to_openai_messages(system: str, messages: tuple[Message, ...]) -> list[JsonObject]:
    out: list[JsonObject] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.content or ""})
        elif m.role == "assistant":
            entry: JsonObject = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                entry["tool_calls"] = [_tool_call(c) for c in m.tool_calls]
            elif m.content is None:
                entry["content"] = ""
            out.append(entry)
        else:
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": tool_result_text(m)})
    return out


def _tool_call(call: ToolCall) -> JsonObject:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.args, ensure_ascii=False)},
    }


def to_openai_tools(tools: tuple[JsonObject, ...]) -> list[JsonValue]:
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["parameters"]},
        }
        for t in tools
    ]


def chat_request_body(config: OpenAIModelConfig, request: ModelRequest) -> JsonObject:
    messages: list[JsonValue] = [*to_openai_messages(request.system, request.messages)]
    body: JsonObject = {"model": config.name, "messages": messages}
    if request.tools:  # OpenAI refuses an empty tools list
        body["tools"] = to_openai_tools(request.tools)
    limit = config.output_limit()
    if limit is not None:
        body[limit[0]] = limit[1]
    if config.temperature is not None:
        body["temperature"] = config.temperature
    return body


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def parse_arguments(raw: JsonValue, call_id: str, name: str) -> JsonObject:
    """A tool call's arguments: a JSON object, sent as a string (the API) or, by some
    servers, already as an object. Empty means no arguments."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        raise ModelResponseInvalid(f"{PROVIDER}: tool call {call_id} ({name}) has arguments that are not a string")
    try:
        args = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ModelResponseInvalid(
            f"{PROVIDER}: tool call {call_id} ({name}) has arguments that are not valid JSON ({exc}): {raw[:200]!r}"
        ) from None
    if not isinstance(args, dict):
        raise ModelResponseInvalid(
            f"{PROVIDER}: tool call {call_id} ({name}) has arguments that are a JSON {type(args).__name__}, "
            "not an object"
        )
    return args


def _text(content: JsonValue) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, from some compatible servers
        texts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(t for t in texts if isinstance(t, str)) or None
    raise ModelResponseInvalid(f"{PROVIDER}: the message content is a {type(content).__name__}, not text")


def parse_chat_response(body: JsonValue, round_index: int) -> ModelResponse:
    """The first choice as a response, its ending handled: a refusal, a content filter,
    a custom tool call and a tool call cut off mid-arguments raise; ``length`` otherwise
    is reported on ``finish_reason`` (``runtime.models.endings`` decides)."""
    if not isinstance(body, dict):
        raise ModelResponseInvalid(f"{PROVIDER}: the response has no choices")
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise ModelResponseInvalid(f"{PROVIDER}: the response has no choices")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelResponseInvalid(f"{PROVIDER}: the first choice has no message")
    finish = choice.get("finish_reason")
    finish_reason = finish if isinstance(finish, str) and finish else None
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        raise ModelRefused(f"{PROVIDER}: the model refused: {refusal[:500]}")
    if finish_reason == "content_filter":
        raise ModelContentFiltered(f"{PROVIDER}: the provider's content filter stopped the answer")
    raw_calls = _items(message.get("tool_calls"))
    calls = [_parsed_call(raw, i, round_index, finish_reason) for i, raw in enumerate(raw_calls)]
    usage = object_of(body.get("usage"))
    return ModelResponse(
        content=_text(message.get("content")),
        tool_calls=tuple(calls),
        usage=Usage(
            input_tokens=token_count(usage.get("prompt_tokens")),
            output_tokens=token_count(usage.get("completion_tokens")),
        ),
        finish_reason=finish_reason,
        response_id=reported_str(body.get("id")),
        response_model=reported_str(body.get("model")),
    )


def _items(value: JsonValue) -> list[JsonValue]:
    """What a loop over ``value or ()`` visits: an array's items, an object's keys, a
    string's characters (none for a false value)."""
    if not value:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, dict | str):
        return list(value)
    raise TypeError(f"'{type(value).__name__}' object is not iterable")


def _parsed_call(raw: JsonValue, i: int, round_index: int, finish_reason: str | None) -> ToolCall:
    if isinstance(raw, dict) and raw.get("type") not in (None, "function"):
        custom = raw.get("custom")
        name = custom.get("name") if isinstance(custom, dict) else None
        raise ModelToolCallUnsupported(
            f"{PROVIDER}: tool call {raw.get('id') or i} ({name or '?'}) is of type {str(raw.get('type'))[:40]!r}; "
            "only function tool calls are supported"
        )
    function = raw.get("function") if isinstance(raw, dict) else None
    function_name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(raw, dict) or not isinstance(function, dict) or not isinstance(function_name, str):
        raise ModelResponseInvalid(f"{PROVIDER}: tool call {i} has no function name")
    if not function_name:
        raise ModelResponseInvalid(f"{PROVIDER}: tool call {i} has no function name")
    raw_id = raw.get("id")
    call_id = raw_id if isinstance(raw_id, str) and raw_id else f"call_{round_index}_{i}"
    try:
        args = parse_arguments(function.get("arguments"), call_id, function_name)
    except ModelResponseInvalid as exc:
        if finish_reason == "length":
            raise ModelOutputTruncated(
                f"{PROVIDER}: tool call {call_id} ({function_name}) was cut off by the token limit "
                "mid-arguments (length)"
            ) from None
        raise exc
    return ToolCall(call_id, function_name, args)


@dataclass
class _CallSlot:
    """A streamed tool call as its pieces arrive."""

    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: str = ""
    custom: JsonObject | None = None

    def to_json(self) -> JsonObject:
        function: JsonObject = {"name": self.name, "arguments": self.arguments}
        body: JsonObject = {"id": self.id, "type": self.type, "function": function}
        if self.custom is not None:
            body["custom"] = self.custom
        return body


def assemble_chat_chunks(chunks: Iterable[JsonObject], deltas: ScrubbedDeltas) -> JsonObject:
    """Streamed ``chat.completion.chunk``s (``data: {...}`` lines up to ``data: [DONE]``)
    as the one response the non-streaming call answers: the first choice's content and
    refusal deltas joined (content handed to ``deltas`` as it arrives), tool calls
    assembled by their ``index`` (id, name and argument fragments), the finish reason,
    and the usage of the last chunk (``stream_options.include_usage``). A stream with no
    chunk, or none with a finish reason, was cut short: ``ModelResponseInvalid``."""
    seen = 0
    content: list[str] = []
    refusal: list[str] = []
    calls: dict[int, _CallSlot] = {}
    finish: JsonValue = None
    usage: JsonValue = None
    first: JsonObject = {}
    for chunk in chunks:
        seen += 1
        first = first or chunk  # every chunk repeats the response's id and model
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in _items(chunk.get("choices")):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            raw = choice.get("delta")
            delta: JsonObject = raw if isinstance(raw, dict) else {}
            text = delta.get("content")
            if isinstance(text, str):
                content.append(text)
                deltas.push(text)
            refused = delta.get("refusal")
            if isinstance(refused, str):
                refusal.append(refused)
            for piece in _items(delta.get("tool_calls")):
                if isinstance(piece, dict):
                    _add_call_piece(calls, piece)
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    deltas.flush()
    _require_finished(seen, finish)
    message: JsonObject = {"role": "assistant", "content": "".join(content) if content else None}
    if refusal:
        message["refusal"] = "".join(refusal)
    if calls:
        message["tool_calls"] = [calls[i].to_json() for i in sorted(calls)]
    return {
        "id": first.get("id"),
        "model": first.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage or {},
    }


def _require_finished(chunks: int, finish: JsonValue) -> None:
    if not chunks:
        raise ModelResponseInvalid(f"{PROVIDER}: the stream carried no chunk")
    if not finish:
        raise ModelResponseInvalid(f"{PROVIDER}: the stream ended without a finish reason ({chunks} chunks)")


def _add_call_piece(calls: dict[int, _CallSlot], piece: JsonObject) -> None:
    index = piece.get("index", len(calls))
    slot = calls.setdefault(index if isinstance(index, int) else len(calls), _CallSlot())
    piece_id, piece_type, custom = piece.get("id"), piece.get("type"), piece.get("custom")
    if isinstance(piece_id, str) and piece_id:
        slot.id = piece_id
    if isinstance(piece_type, str):
        slot.type = piece_type
    if isinstance(custom, dict):
        slot.custom = custom
    raw = piece.get("function")
    function: JsonObject = raw if isinstance(raw, dict) else {}
    name, arguments = function.get("name"), function.get("arguments")
    if isinstance(name, str):
        slot.name += name
    if isinstance(arguments, str):
        slot.arguments += arguments


def is_context_overflow(reply: HttpReply) -> bool:
    if reply.status == 413:
        return True
    if reply.status not in (400, 422):
        return False
    _, code, message = error_fields(reply)
    text = f"{code} {message}".lower()
    return any(phrase in text for phrase in OVERFLOW_PHRASES)


class OpenAICompatModel(HttpModel[OpenAIModelConfig]):
    provider = PROVIDER

    def headers(self, token: str | None) -> dict[str, object]:
        return {"Authorization": openai.Omit() if token is None else f"Bearer {token}"}

    def request_body(self, request: ModelRequest) -> JsonObject:
        return chat_request_body(self._config, request)

    def send(self, client: Any, body: JsonObject, timeout_s: float) -> httpx2.Response:
        # No key (a local server): the SDK wants the header omitted per call, in so many words.
        no_key = {"Authorization": openai.Omit()} if self._key.value is None else None
        response: httpx2.Response = client.chat.completions.with_raw_response.create(
            **body, extra_headers=no_key, timeout=timeout_s
        ).http_response
        return response

    def stream(self, client: Any, body: JsonObject, timeout_s: float, deltas: ScrubbedDeltas) -> JsonObject:
        no_key = {"Authorization": openai.Omit()} if self._key.value is None else None
        chunks = client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}, extra_headers=no_key, timeout=timeout_s
        )
        with chunks:
            require_event_stream(chunks, PROVIDER, self._secrets)
            # Scrubbed whole, not per chunk: a piece of a key split across two would
            # leave a tail too short to be recognised on its own (the deltas scrub themselves).
            answer: JsonObject = scrub(assemble_chat_chunks((c.to_dict() for c in chunks), deltas), self._secrets)
            return answer

    def parse(self, body: JsonValue, request: ModelRequest) -> ModelResponse:
        return parse_chat_response(body, request.round_index)

    def is_context_overflow(self, reply: HttpReply) -> bool:
        return is_context_overflow(reply)


class OpenAIProvider:
    """The ``openai`` entry of ``Runtime.base.model_providers``: builds one run's client
    from its config, with the key its ``api_key_ref`` names (checked here, so
    ``prepare_execution`` refuses an unknown name or a base URL keys may not go to)."""

    def __init__(self, keys: ModelKeys, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._keys = keys
        self._clients = ClientCache(PROVIDER, retry)
        self._secrets = keys.values()

    def __repr__(self) -> str:
        return "OpenAIProvider()"

    def __call__(self, config: BaseModel, owner: str) -> OpenAICompatModel:
        if not isinstance(config, OpenAIModelConfig):
            raise TypeError(f"OpenAIProvider needs an OpenAIModelConfig, not {type(config).__name__}")
        key = self._keys.resolve(PROVIDER, config.api_key_ref, config.base_url, owner)
        return OpenAICompatModel(config, key, self._clients, self._secrets)

    def close(self) -> None:
        self._clients.close()

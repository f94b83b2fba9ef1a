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
from typing import Any

import openai

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


def to_openai_messages(system: str, messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.content or ""})
        elif m.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.args, ensure_ascii=False)},
                    }
                    for c in m.tool_calls
                ]
            elif m.content is None:
                entry["content"] = ""
            out.append(entry)
        else:
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": tool_result_text(m)})
    return out


def to_openai_tools(tools: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["parameters"]},
        }
        for t in tools
    ]


def chat_request_body(config: OpenAIModelConfig, request: ModelRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": config.name, "messages": to_openai_messages(request.system, request.messages)}
    if request.tools:  # OpenAI refuses an empty tools list
        body["tools"] = to_openai_tools(request.tools)
    limit = config.output_limit()
    if limit is not None:
        body[limit[0]] = limit[1]
    if config.temperature is not None:
        body["temperature"] = config.temperature
    return body


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_arguments(raw: Any, call_id: str, name: str) -> dict[str, Any]:
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


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, from some compatible servers
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)) or None
    raise ModelResponseInvalid(f"{PROVIDER}: the message content is a {type(content).__name__}, not text")


def parse_chat_response(body: Any, round_index: int) -> ModelResponse:
    """The first choice as a response, its ending handled: a refusal, a content filter,
    a custom tool call and a tool call cut off mid-arguments raise; ``length`` otherwise
    is reported on ``finish_reason`` (``runtime.models.endings`` decides)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelResponseInvalid(f"{PROVIDER}: the response has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ModelResponseInvalid(f"{PROVIDER}: the first choice has no message")
    finish = choices[0].get("finish_reason")
    finish_reason = finish if isinstance(finish, str) and finish else None
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        raise ModelRefused(f"{PROVIDER}: the model refused: {refusal[:500]}")
    if finish_reason == "content_filter":
        raise ModelContentFiltered(f"{PROVIDER}: the provider's content filter stopped the answer")
    calls = []
    for i, raw in enumerate(message.get("tool_calls") or ()):
        if isinstance(raw, dict) and raw.get("type") not in (None, "function"):
            name = raw.get("custom", {}).get("name") if isinstance(raw.get("custom"), dict) else None
            raise ModelToolCallUnsupported(
                f"{PROVIDER}: tool call {raw.get('id') or i} ({name or '?'}) is of type {str(raw.get('type'))[:40]!r}; "
                "only function tool calls are supported"
            )
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ModelResponseInvalid(f"{PROVIDER}: tool call {i} has no function name")
        call_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else f"call_{round_index}_{i}"
        try:
            args = parse_arguments(function.get("arguments"), call_id, function["name"])
        except ModelResponseInvalid as exc:
            if finish_reason == "length":
                raise ModelOutputTruncated(
                    f"{PROVIDER}: tool call {call_id} ({function['name']}) was cut off by the token limit "
                    "mid-arguments (length)"
                ) from None
            raise exc
        calls.append(ToolCall(call_id, function["name"], args))
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
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


def assemble_chat_chunks(chunks: Iterable[dict[str, Any]], deltas: ScrubbedDeltas) -> dict[str, Any]:
    """Streamed ``chat.completion.chunk``s (``data: {...}`` lines up to ``data: [DONE]``)
    as the one response the non-streaming call answers: the first choice's content and
    refusal deltas joined (content handed to ``deltas`` as it arrives), tool calls
    assembled by their ``index`` (id, name and argument fragments), the finish reason,
    and the usage of the last chunk (``stream_options.include_usage``). A stream with no
    chunk, or none with a finish reason, was cut short: ``ModelResponseInvalid``."""
    seen = 0
    content: list[str] = []
    refusal: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: Any = None
    usage: Any = None
    first: dict[str, Any] = {}
    for chunk in chunks:
        seen += 1
        first = first or chunk  # every chunk repeats the response's id and model
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            raw = choice.get("delta")
            delta: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
                deltas.push(delta["content"])
            if isinstance(delta.get("refusal"), str):
                refusal.append(delta["refusal"])
            for piece in delta.get("tool_calls") or ():
                if isinstance(piece, dict):
                    _add_call_piece(calls, piece)
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    deltas.flush()
    _require_finished(seen, finish)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
    if refusal:
        message["refusal"] = "".join(refusal)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        "id": first.get("id"),
        "model": first.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage or {},
    }


def _require_finished(chunks: int, finish: Any) -> None:
    if not chunks:
        raise ModelResponseInvalid(f"{PROVIDER}: the stream carried no chunk")
    if not finish:
        raise ModelResponseInvalid(f"{PROVIDER}: the stream ended without a finish reason ({chunks} chunks)")


def _add_call_piece(calls: dict[int, dict[str, Any]], piece: dict[str, Any]) -> None:
    index = piece.get("index", len(calls))
    slot = calls.setdefault(index if isinstance(index, int) else len(calls),
                            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    if isinstance(piece.get("id"), str) and piece["id"]:
        slot["id"] = piece["id"]
    if isinstance(piece.get("type"), str):
        slot["type"] = piece["type"]
    if isinstance(piece.get("custom"), dict):
        slot["custom"] = piece["custom"]
    raw = piece.get("function")
    function: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if isinstance(function.get("name"), str):
        slot["function"]["name"] += function["name"]
    if isinstance(function.get("arguments"), str):
        slot["function"]["arguments"] += function["arguments"]


def is_context_overflow(reply: HttpReply) -> bool:
    if reply.status == 413:
        return True
    if reply.status not in (400, 422):
        return False
    _, code, message = error_fields(reply)
    text = f"{code} {message}".lower()
    return any(phrase in text for phrase in OVERFLOW_PHRASES)


class OpenAICompatModel(HttpModel):
    provider = PROVIDER

    def headers(self, token: str | None) -> dict[str, Any]:
        return {"Authorization": openai.Omit() if token is None else f"Bearer {token}"}

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        return chat_request_body(self._config, request)

    def send(self, client: Any, body: dict[str, Any], timeout_s: float) -> Any:
        # No key (a local server): the SDK wants the header omitted per call, in so many words.
        no_key = {"Authorization": openai.Omit()} if self._key.value is None else None
        return client.chat.completions.with_raw_response.create(
            **body, extra_headers=no_key, timeout=timeout_s
        ).http_response

    def stream(self, client: Any, body: dict[str, Any], timeout_s: float, deltas: ScrubbedDeltas) -> dict[str, Any]:
        no_key = {"Authorization": openai.Omit()} if self._key.value is None else None
        chunks = client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}, extra_headers=no_key, timeout=timeout_s
        )
        with chunks:
            require_event_stream(chunks, PROVIDER, self._secrets)
            # Scrubbed whole, not per chunk: a piece of a key split across two would
            # leave a tail too short to be recognised on its own (the deltas scrub themselves).
            answer: dict[str, Any] = scrub(assemble_chat_chunks((c.to_dict() for c in chunks), deltas), self._secrets)
            return answer

    def parse(self, body: Any, request: ModelRequest) -> ModelResponse:
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

    def __call__(self, config: Any, owner: str) -> OpenAICompatModel:
        if not isinstance(config, OpenAIModelConfig):
            raise TypeError(f"OpenAIProvider needs an OpenAIModelConfig, not {type(config).__name__}")
        key = self._keys.resolve(PROVIDER, config.api_key_ref, config.base_url, owner)
        return OpenAICompatModel(config, key, self._clients, self._secrets)

    def close(self) -> None:
        self._clients.close()

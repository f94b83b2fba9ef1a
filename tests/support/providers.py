"""A loopback HTTP server that speaks the providers' wire formats, for the provider tests
(unit and e2e). Not a mock of the adapters: they send real HTTP over a real socket to
127.0.0.1 and parse what comes back. The server records every request (path, headers,
JSON body, arrival time) and answers from a script of ``Reply`` values, or from a
``responder`` function that plays the model from the request it got.
Its own tests are in tests/unit/test_provider_server.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # sent as JSON unless ``raw`` is given
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    raw: bytes | None = None
    content_type: str = "application/json"


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any
    at: float  # time.monotonic() on arrival


Responder = Callable[[Recorded], Reply]


class FakeProvider:
    def __init__(self, responder: Responder | None = None) -> None:
        self.requests: list[Recorded] = []
        self._script: list[Reply] = []
        self._responder = responder
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                recorded = Recorded(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()
                )
                reply = fake._next(recorded)
                if isinstance(body, dict) and body.get("stream") is True:
                    reply = streamed(reply)  # the worker's calls stream: answer in kind
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", reply.content_type)
                    self.send_header("content-length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def _next(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if self._script:
                return self._script.pop(0)
        if self._responder is not None:
            return self._responder(recorded)
        return Reply(500, {"error": {"message": "the fake provider has no reply scripted"}})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- replies in each provider's wire format ------------------------------------------------


def openai_reply(
    content: str | None = None,
    tool_calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (11, 7),
    *,
    finish_reason: str | None = None,
    refusal: str | None = None,
    custom_calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
) -> Reply:
    """A Chat Completions response; tool calls as (id, name, arguments JSON string),
    custom tool calls as (id, name, input); ``finish_reason`` by default what the
    message implies."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls or custom_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in tool_calls
        ] + [{"id": i, "type": "custom", "custom": {"name": n, "input": a}} for i, n, a in custom_calls]
    finish = finish_reason or ("tool_calls" if tool_calls or custom_calls else "stop")
    return Reply(
        200,
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        },
    )


def sse(events: list[tuple[str | None, Any]], done: bool = False) -> Reply:
    """A 200 ``text/event-stream`` reply: each (event name or None, JSON data) as one SSE
    event; ``done`` ends it with OpenAI's ``data: [DONE]``."""
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return Reply(200, raw="".join(out).encode(), content_type="text/event-stream")


def openai_stream(
    pieces: list[str],
    tool_calls: list[tuple[str, str, list[str]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (11, 7),
    *,
    finish_reason: str | None = None,
    refusal: list[str] = (),  # type: ignore[assignment]
) -> Reply:
    """A streamed Chat Completions response: a role chunk, one chunk per text piece (then
    one per ``refusal`` piece), then per tool call (id, name, argument fragments) a chunk
    with its id and name and one per fragment, a chunk with the finish reason, and the
    usage chunk (no choices, as with ``stream_options.include_usage``), ending
    ``data: [DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in pieces]
    chunks += [chunk({"refusal": p}) for p in refusal]
    for i, (call_id, name, fragments) in enumerate(tool_calls):
        chunks.append(chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in fragments]
    chunks.append(chunk({}, finish_reason or ("tool_calls" if tool_calls else "stop")))
    chunks.append({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": [],
                   "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}})
    return sse([(None, c) for c in chunks], done=True)


def anthropic_stream(
    pieces: list[str],
    tool_uses: list[tuple[str, str, list[str]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (13, 5),
    *,
    stop_reason: str | None = None,
) -> Reply:
    """A streamed Messages response: message_start, a text block (one text_delta per
    piece), per tool use (id, name, input JSON fragments) a tool_use block with one
    input_json_delta per fragment, message_delta (stop reason, output tokens),
    message_stop."""
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_s", "type": "message", "role": "assistant", "model": "fake", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": usage[0], "output_tokens": 1}}})]
    index = 0
    if pieces:
        events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": p}}) for p in pieces]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for offset, (call_id, name, fragments) in enumerate(tool_uses):
        i = index + offset
        events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
            "type": "tool_use", "id": call_id, "name": name, "input": {}}}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": {"type": "input_json_delta", "partial_json": f}})
                   for f in fragments]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"), "stop_sequence": None},
        "usage": {"output_tokens": usage[1]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(events)


def _halves(text: str | None) -> list[str]:
    """A text as two deltas (a key in it arrives split, as it may from a real provider)."""
    if not text:
        return []
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def streamed(reply: Reply) -> Reply:
    """A 200 JSON completion (Chat Completions or Messages) as the same answer streamed,
    for a request that asked to stream; any other reply (an error, a raw body, what the
    stream helpers cannot say: custom tool calls) is sent as it is."""
    body = reply.body
    if reply.status != 200 or reply.raw is not None or not isinstance(body, dict):
        return reply
    if body.get("object") == "chat.completion":
        (choice,) = body["choices"]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        if any(c.get("type") != "function" for c in calls):
            return reply
        usage = body.get("usage") or {}
        out = openai_stream(
            _halves(message.get("content")),
            [(c["id"], c["function"]["name"], _halves(c["function"]["arguments"]) or [""]) for c in calls],
            (usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason"),
            refusal=_halves(message.get("refusal")),
        )
    elif body.get("type") == "message":
        blocks = body.get("content") or []
        if any(b.get("type") not in ("text", "tool_use") for b in blocks):
            return reply
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        uses = [(b["id"], b["name"], _halves(json.dumps(b.get("input") or {})))
                for b in blocks if b["type"] == "tool_use"]
        usage = body.get("usage") or {}
        out = anthropic_stream(_halves(text), uses, (usage.get("input_tokens", 0), usage.get("output_tokens", 0)),
                               stop_reason=body.get("stop_reason"))
    else:
        return reply
    return Reply(out.status, raw=out.raw, content_type=out.content_type, headers=reply.headers, delay_s=reply.delay_s)


def openai_error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    return Reply(
        status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers=headers or {}
    )


def anthropic_reply(
    text: str | None = None,
    tool_uses: list[tuple[str, str, Any]] = (),  # type: ignore[assignment]
    usage: dict[str, int] | None = None,
    *,
    stop_reason: str | None = None,
) -> Reply:
    """A Messages response; tool uses as (id, name, input); ``stop_reason`` by default
    what the content implies."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text is not None else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_uses]
    return Reply(
        200,
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "fake",
            "content": content,
            "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
            "stop_sequence": None,
            "usage": usage or {"input_tokens": 13, "output_tokens": 5},
        },
    )


def anthropic_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message}}, headers=headers or {})


# --- a hostile provider: the key it was sent, echoed into every field ---------------------


def echoed(key: str) -> dict[str, Any]:
    """Every place an error body can carry text, each holding ``key`` (plainly, in a
    sentence, as an object key, nested)."""
    return {
        "type": f"echo Bearer {key}/bad",
        "code": key,
        "message": f"Invalid key {key} for this org",
        "param": key,
        "nested": {"k": key, key: [key, {"deeper": key}]},
    }


def echoing_error(status: int, key: str, *, anthropic: bool = False, headers: dict[str, str] | None = None) -> Reply:
    body: dict[str, Any] = {"error": echoed(key)}
    if anthropic:
        body["type"] = "error"
    return Reply(status, body, headers=headers or {})


def echoing_reply(key: str, *, anthropic: bool = False, call_tools: bool = True) -> Reply:
    """A 2xx answer with the key in its text, tool call ids, tool names and arguments
    (plainly and JSON-escaped, which only decoding reveals)."""
    escaped = "".join(f"\\u{ord(c):04x}" for c in key)
    if anthropic:
        uses = [(f"toolu_{key}", f"add{key}", {"a": 2, "b": 3, key: key}), ("toolu_2", "echo", {"x": key})]
        return anthropic_reply(f"The key is {key}.", uses if call_tools else [])
    calls = [
        (f"call_{key}", f"add{key}", json.dumps({"a": 2, "b": 3, key: key})),
        ("call_2", "echo", '{"x": "' + escaped + '"}'),
    ]
    return openai_reply(f"The key is {key}.", calls if call_tools else [])


# --- a model played from the request: add, then answer ---------------------------------------


def _last_tool_result(recorded: Recorded) -> str | None:
    """The last tool result in the conversation the request carries, in either format."""
    messages = recorded.body.get("messages", []) if isinstance(recorded.body, dict) else []
    if not messages:
        return None
    last = messages[-1]
    if last.get("role") == "tool":
        return str(last.get("content"))
    content = last.get("content")
    if last.get("role") == "user" and isinstance(content, list):
        results = [b for b in content if b.get("type") == "tool_result"]
        if results:
            return str(results[-1].get("content"))
    return None


def add_then_answer(recorded: Recorded) -> Reply:
    """Plays a model that calls ``add`` with 2 and 3, then answers with the tool's result."""
    is_anthropic = recorded.path.endswith("/v1/messages")
    result = _last_tool_result(recorded)
    if result is None:
        if is_anthropic:
            return anthropic_reply("Adding.", [("toolu_01", "add", {"a": 2, "b": 3})])
        return openai_reply(None, [("call_add_1", "add", '{"a": 2, "b": 3}')])
    answer = f"The sum is {json.loads(result)['sum'] if result.startswith('{') else result}."
    return anthropic_reply(answer) if is_anthropic else openai_reply(answer)

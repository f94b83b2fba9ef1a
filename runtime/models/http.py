"""The adapter base the HTTP providers extend (``HttpModel``): the call, the key header,
the typed errors and the scrubbing they share.

Keys and the allowlist of base URLs are in ``runtime.models.keys``; the SDK clients and
their retries within the call's budget in ``runtime.models.transport``; the errors and how a provider's error reply is
described in ``runtime.models.provider_errors``. The parsed response is scrubbed once more
here (``scrub_response``): tool call arguments sent as a JSON string are decoded only by
the adapter.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx2

from runtime.canonical import canonical_json
from runtime.config import _HttpModelConfig
from runtime.messages import Message, ToolCall
from runtime.models.base import ModelRequest, ModelResponse
from runtime.models.keys import ModelKeyMissing, ResolvedKey
from runtime.models.provider_errors import ModelResponseInvalid, typed_error
from runtime.models.replies import HttpReply, reply_of
from runtime.models.scrub import ScrubbedDeltas, scrub, scrub_text
from runtime.models.transport import ClientCache, StatusError, call_within_budget
from schema.wire.json import JsonObject, JsonValue

ConfigT = TypeVar("ConfigT", bound=_HttpModelConfig)


def scrub_response(response: ModelResponse, secrets: tuple[str, ...]) -> ModelResponse:
    """The parsed response scrubbed once more: tool call arguments sent as a JSON string
    are decoded only by the adapter, and an escaped key appears only then."""
    if not secrets:
        return response
    calls = tuple(
        ToolCall(scrub_text(c.id, secrets), scrub_text(c.name, secrets), scrub(c.args, secrets))
        for c in response.tool_calls
    )
    content = None if response.content is None else scrub_text(response.content, secrets)
    return replace(response, content=content, tool_calls=calls)


class HttpModel(Generic[ConfigT]):
    """One run's client for an HTTP provider: the call through the provider's SDK, the
    key header, the typed errors and the scrubbing, shared by the adapters. A subclass
    names its ``provider``, maps the request and the response, and makes the SDK call
    (``send``). Holds no per-call state, so it is safe from many threads. ``secrets``
    are every key the deployment has, not only this run's: a reply must not carry any
    of them."""

    provider: ClassVar[str]

    def __init__(self, config: ConfigT, key: ResolvedKey, clients: ClientCache, secrets: tuple[str, ...]) -> None:
        self._config = config
        self._key = key
        self._clients = clients
        self._secrets = secrets
        self._label = f"{self.provider} ({urlsplit(config.base_url).netloc})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._config.name!r}, base_url={self._config.base_url!r})"

    @property
    def key_missing(self) -> str | None:
        """Why this run's calls would have no key here (a default key not configured), or
        None: every call would fail with it (the deploy gate reports it before)."""
        return self._key.missing

    def headers(self, token: str | None) -> dict[str, object]:
        """The client's headers, the key's among them (``Omit()``: remove the SDK's)."""
        raise NotImplementedError

    def sdk_base_url(self) -> str:
        return str(self._config.base_url).rstrip("/")

    def request_body(self, request: ModelRequest) -> JsonObject:
        raise NotImplementedError

    # ``client``: the SDK client of the provider (``ClientCache``), called with the body
    # as its keyword arguments (``**body``: the SDK's typed params are not what mypy sees
    # in a JSON object).
    def send(self, client: Any, body: JsonObject, timeout_s: float) -> httpx2.Response:
        """The SDK call; returns the raw HTTP response (``with_raw_response``)."""
        raise NotImplementedError

    def stream(self, client: Any, body: JsonObject, timeout_s: float, deltas: ScrubbedDeltas) -> JsonObject:
        """The SDK's streaming call: hands each text delta to ``deltas`` and returns the
        events assembled into the body the non-streaming call would have answered, each
        event scrubbed as it arrives."""
        raise NotImplementedError

    def parse(self, body: JsonValue, request: ModelRequest) -> ModelResponse:
        raise NotImplementedError

    def is_context_overflow(self, reply: HttpReply) -> bool:
        raise NotImplementedError

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self._key.missing is not None:
            raise ModelKeyMissing(f"{self.provider}: {self._key.missing}")
        client = self._clients.get(self.sdk_base_url(), self.headers(self._key.header_value()))
        body = self.request_body(request)
        on_delta = request.on_delta
        answer: JsonValue
        try:
            if on_delta is None:
                raw = call_within_budget(
                    self.provider,
                    request.timeout_s,
                    self._clients.retry,
                    self._secrets,
                    lambda: self.send(client, body, request.timeout_s),
                )
            else:
                deltas = ScrubbedDeltas(on_delta, self._secrets)
                answer = call_within_budget(
                    self.provider,
                    request.timeout_s,
                    self._clients.retry,
                    self._secrets,
                    lambda: self.stream(client, body, request.timeout_s, deltas),
                )
        except StatusError as exc:
            reply = exc.reply
            raise typed_error(
                reply,
                provider=self.provider,
                label=self._label,
                key_ref=self._config.api_key_ref,
                overflow=self.is_context_overflow(reply),
            ) from None
        if on_delta is None:
            reply = reply_of(raw, self._secrets)
            if reply.body is None:
                raise ModelResponseInvalid(f"{self._label} answered HTTP {reply.status} with a body that is not JSON")
            answer = reply.body
        try:
            response = self.parse(answer, request)
        except ModelResponseInvalid as exc:  # it may quote decoded arguments
            raise type(exc)(scrub_text(exc.message, self._secrets)) from None
        return scrub_response(response, self._secrets)


class _Streamed(Protocol):
    @property
    def response(self) -> httpx2.Response: ...


def require_event_stream(stream: _Streamed, provider: str, secrets: tuple[str, ...]) -> None:
    """A streamed call's answer must be an SSE stream: the SDKs read any body as one and
    find no event in a JSON document (a mock server's example, a proxy's page), which
    would be assembled into an empty answer."""
    content_type = str(stream.response.headers.get("content-type") or "")
    if content_type.split(";")[0].strip().lower() != "text/event-stream":
        shown = scrub_text(content_type, secrets)[:100] or "none"
        raise ModelResponseInvalid(
            f"{provider}: the streamed call was answered with content type {shown!r}, not text/event-stream"
        )


def tool_result_text(message: Message) -> str:
    """A tool message as the provider sees it: the slimmed text when the context has one,
    else the result (a string as is, anything else as canonical JSON, so that equal
    results give byte-equal prompts and provider prompt caches hit)."""
    if message.content is not None:
        return message.content
    result = message.result
    return result if isinstance(result, str) else canonical_json(result)


def token_count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

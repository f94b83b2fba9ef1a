"""What the HTTP providers share: their errors, and one JSON POST with bounded retries.

Keys and the allowlist of base URLs are in ``runtime.models.keys``. A provider's reply
enters the system here and only here, and is scrubbed as it enters
(``runtime.models.scrub``): every configured key value is removed from the body, the
error text and the parsed response before anything else reads them.

Errors built from a provider's answer carry the HTTP status, a code from a fixed
vocabulary (``ERROR_CODES``) and at most a short, scrubbed message from a JSON error
body; a provider's raw ``type``/``code`` strings and non-JSON bodies (an internal
service's page) are never echoed.

Retries: connection errors, timeouts, 408, 429 and 5xx are retried with exponential
backoff and jitter, or after the server's ``Retry-After`` (seconds or an HTTP date), up
to ``RetryPolicy.max_attempts`` and never past the call's ``timeout_s``; then
``ModelUnavailable`` (retryable: the Celery task tries the round again later). Every
other status is returned to the adapter, which knows its provider's error bodies.
Redirects are never followed: a 3xx is a refusal like any other status.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import structlog

from runtime.canonical import canonical_json
from runtime.errors import ModelError, ModelInputRejection, ModelUnavailable
from runtime.messages import Message, ToolCall
from runtime.models.base import ModelRequest, ModelResponse
from runtime.models.keys import ModelKeyMissing, ResolvedKey
from runtime.models.scrub import scrub, scrub_text
from schema.wire.retry import RetryPolicy, backoff_s

MAX_PROVIDER_MESSAGE_CHARS = 200


# --- errors ------------------------------------------------------------------------------


class ModelRequestRefused(ModelError):
    """The provider refused the request (a 4xx other than 408/429 and other than a
    context overflow, or a redirect): a bad model name, a bad key, a malformed request.
    Retrying the same request cannot help."""

    code = "MODEL_REQUEST_REFUSED"

    def __init__(self, message: str, *, provider: str, status: int) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status


class ModelResponseInvalid(ModelError):
    """The provider answered 2xx with something that is not a usable response (not
    JSON, no choice, tool call arguments that are not a JSON object)."""

    code = "MODEL_RESPONSE_INVALID"


# --- retries -----------------------------------------------------------------------------


DEFAULT_RETRY = RetryPolicy()
RETRYABLE_STATUSES = frozenset({408, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def retry_after_s(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """The wait a response asks for: ``retry-after-ms`` (OpenAI), then ``Retry-After``
    as seconds or as an HTTP date. ``None`` when absent or unreadable."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


# --- one JSON POST -----------------------------------------------------------------------


@dataclass(frozen=True)
class HttpReply:
    """A final (non-retried) response: its status, the JSON body if it had one, and the
    body text (for error messages)."""

    status: int
    body: Any
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status <= 299


class SharedClient:
    """One ``httpx.Client`` per provider per process, created on first use. httpx's client
    is thread-safe and pools connections, so every run of the process shares it."""

    def __init__(self, client: httpx.Client | None = None) -> None:
        self._client = client
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    # follow_redirects=False: the allowlist is checked on the base URL, and a
                    # redirect would take the call (and its key) somewhere else.
                    self._client = httpx.Client(
                        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50), follow_redirects=False
                    )
        return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


@dataclass(frozen=True)
class JsonPoster:
    """POSTs a JSON body with retries. ``provider`` labels messages and logs; ``secrets``
    are scrubbed from the reply and from every text this produces. Never follows a
    redirect (httpx's default, relied on here): a 3xx is returned as the final reply."""

    provider: str
    http: SharedClient
    retry: RetryPolicy = DEFAULT_RETRY
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def post(
        self, url: str, headers: Mapping[str, str], body: Any, timeout_s: float, secrets: tuple[str, ...]
    ) -> HttpReply:
        content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        all_headers = {"content-type": "application/json", "accept": "application/json", **headers}
        deadline = self.clock() + timeout_s
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise ModelUnavailable(f"{self.provider}: no answer within the call's timeout of {timeout_s:g}s")
            wait: float | None = None
            try:
                response = self.http.get().post(url, content=content, headers=all_headers, timeout=remaining)
            except httpx.TimeoutException:
                problem = f"timed out (the call's timeout is {timeout_s:g}s)"
            except httpx.TransportError as exc:
                problem = f"connection failed: {type(exc).__name__}: {scrub_text(str(exc), secrets)}"
            else:
                reply = _reply(response, secrets)
                if not is_retryable_status(reply.status):
                    return reply
                problem = describe_error(reply)
                wait = retry_after_s(response.headers)
            if attempt >= self.retry.max_attempts:
                raise ModelUnavailable(f"{self.provider}: unavailable after {attempt} attempts: {problem}")
            delay = wait if wait is not None else backoff_s(attempt, self.retry)
            if delay > self.retry.max_wait_s or self.clock() + delay >= deadline:
                raise ModelUnavailable(
                    f"{self.provider}: {problem}; the next attempt (in {delay:.3g}s) would exceed the call's "
                    f"timeout of {timeout_s:g}s"
                )
            structlog.get_logger("aidawork.models").warning(
                "model_call_retried", provider=self.provider, attempt=attempt, problem=problem, delay_s=round(delay, 3)
            )
            self.sleep(delay)


def _reply(response: httpx.Response, secrets: tuple[str, ...]) -> HttpReply:
    """The reply as it enters the system: scrubbed of every configured key, text and
    decoded body alike (a key written with JSON escapes reappears only once decoded)."""
    text = scrub_text(response.text, secrets)
    try:
        body = scrub(json.loads(text), secrets) if text else None
    except (ValueError, RecursionError):
        body = None
    return HttpReply(response.status_code, body, text)


def error_fields(reply: HttpReply) -> tuple[str, str, str]:
    """(type, code, message) of a JSON error body, whichever of the common shapes it has:
    ``{"error": {"type", "code", "message"}}`` (OpenAI, Anthropic), ``{"message", "type",
    "code"}`` (vLLM), ``{"error": "text"}`` (Ollama). Empty strings when the body is not
    such an object: a non-JSON body is never read for a message."""
    body = reply.body
    inner: Any = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, str):
        return "", "", inner
    if isinstance(inner, dict):
        kind, code, message = inner.get("type"), inner.get("code"), inner.get("message")
        return (
            kind if isinstance(kind, str) else "",
            str(code) if isinstance(code, (str, int)) else "",
            message if isinstance(message, str) else "",
        )
    return "", "", ""


# The fixed vocabulary of provider error codes in our errors: the providers' own type and
# code strings are mapped onto it, never copied (they are free text a server controls).
ERROR_CODES: Mapping[str, str] = {
    "invalid_request_error": "invalid_request",
    "invalid_request": "invalid_request",
    "authentication_error": "authentication_failed",
    "invalid_api_key": "authentication_failed",
    "permission_error": "permission_denied",
    "not_found_error": "not_found",
    "model_not_found": "model_not_found",
    "rate_limit_error": "rate_limited",
    "rate_limit_exceeded": "rate_limited",
    "insufficient_quota": "quota_exceeded",
    "overloaded_error": "overloaded",
    "api_error": "server_error",
    "server_error": "server_error",
    "context_length_exceeded": "context_overflow",
    "request_too_large": "request_too_large",
}
STATUS_CODES: Mapping[int, str] = {
    400: "invalid_request",
    401: "authentication_failed",
    403: "permission_denied",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limited",
    503: "overloaded",
    529: "overloaded",
}


def error_code(reply: HttpReply) -> str:
    """The reply's code in our vocabulary: from the body's code or type when we know it,
    else from the status."""
    kind, code, _ = error_fields(reply)
    for raw in (code, kind):
        if raw.lower() in ERROR_CODES:
            return ERROR_CODES[raw.lower()]
    if reply.status in STATUS_CODES:
        return STATUS_CODES[reply.status]
    if 300 <= reply.status <= 399:
        return "redirect_not_followed"
    return "server_error" if 500 <= reply.status <= 599 else "http_error"


def describe_error(reply: HttpReply) -> str:
    """``HTTP 400 (invalid_request): message``: the status, our code, and at most a short
    message from a JSON error body (already scrubbed), on one line."""
    _, _, message = error_fields(reply)
    message = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    if len(message) > MAX_PROVIDER_MESSAGE_CHARS:
        message = message[:MAX_PROVIDER_MESSAGE_CHARS] + "..."
    out = f"HTTP {reply.status} ({error_code(reply)})"
    return f"{out}: {message}" if message else out


# --- mapping shared by the adapters ------------------------------------------------------


def typed_error(reply: HttpReply, *, provider: str, label: str, key_ref: str | None, overflow: bool) -> ModelError:
    """The typed error for a provider's final non-2xx reply (``overflow``: the provider
    said the input is too long for its context window)."""
    if overflow:
        return ModelInputRejection(f"{label} rejected the input as too long for the context window: "
                                   f"{describe_error(reply)}")
    if reply.status == 401:
        # Not even the provider's message: some echo a masked key back.
        return ModelRequestRefused(
            f"{label} refused the API key (HTTP 401; api_key_ref {key_ref!r})", provider=provider, status=401
        )
    return ModelRequestRefused(
        f"{label} refused the request: {describe_error(reply)}", provider=provider, status=reply.status
    )


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


class HttpModel:
    """One run's client for an HTTP provider: the call, the key header, the typed errors
    and the scrubbing, shared by the adapters. A subclass names its ``provider`` and
    ``path`` and maps the request and the response. Holds no per-call state, so it is safe
    from many threads. ``secrets`` are every key the deployment has, not only this run's:
    a reply must not carry any of them."""

    provider: ClassVar[str]
    path: ClassVar[str]

    def __init__(self, config: Any, key: ResolvedKey, poster: JsonPoster, secrets: tuple[str, ...]) -> None:
        self._config = config
        self._key = key
        self._poster = poster
        self._secrets = secrets
        self._url = config.base_url.rstrip("/") + self.path
        self._label = f"{self.provider} ({urlsplit(config.base_url).netloc})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._config.name!r}, base_url={self._config.base_url!r})"

    def headers(self, token: str | None) -> dict[str, str]:
        raise NotImplementedError

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, body: Any, request: ModelRequest) -> ModelResponse:
        raise NotImplementedError

    def is_context_overflow(self, reply: HttpReply) -> bool:
        raise NotImplementedError

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self._key.missing is not None:
            raise ModelKeyMissing(f"{self.provider}: {self._key.missing}")
        headers = self.headers(self._key.header_value())
        reply = self._poster.post(self._url, headers, self.request_body(request), request.timeout_s, self._secrets)
        if not reply.ok:
            raise typed_error(
                reply,
                provider=self.provider,
                label=self._label,
                key_ref=self._config.api_key_ref,
                overflow=self.is_context_overflow(reply),
            )
        if reply.body is None:
            raise ModelResponseInvalid(f"{self._label} answered HTTP {reply.status} with a body that is not JSON")
        try:
            response = self.parse(reply.body, request)
        except ModelResponseInvalid as exc:  # it may quote decoded arguments
            raise ModelResponseInvalid(scrub_text(exc.message, self._secrets)) from None
        return scrub_response(response, self._secrets)


def tool_result_text(message: Message) -> str:
    """A tool message as the provider sees it: the slimmed text when the context has one,
    else the result (a string as is, anything else as canonical JSON, so that equal
    results give byte-equal prompts and provider prompt caches hit)."""
    if message.content is not None:
        return message.content
    result = message.result
    return result if isinstance(result, str) else canonical_json(result)


def token_count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

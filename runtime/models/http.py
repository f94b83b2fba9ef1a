"""What the HTTP providers share: their keys, their errors, and one JSON POST with
bounded retries.

Keys: ``ModelKeys`` holds every configured key as a ``SecretStr`` (its repr is masked)
and decides, without reading a value, whether a run's ``api_key_ref`` and ``base_url``
may be used. A key is only ever sent to the provider's official endpoint or to a base
URL the deployment lists (``AIDAWORK_MODEL_BASE_URLS``): ``base_url`` comes from whoever
submits the run, and a key sent wherever it points would be a key handed to them.

Retries: connection errors, timeouts, 408, 429 and 5xx are retried with exponential
backoff and jitter, or after the server's ``Retry-After`` (seconds or an HTTP date), up
to ``RetryPolicy.max_attempts`` and never past the call's ``timeout_s``; then
``ModelUnavailable`` (retryable: the Celery task tries the round again later). Every
other status is returned to the adapter, which knows its provider's error bodies.

Every text that leaves this module (exception messages, log fields) is passed through
``redact`` with the call's key, so a provider echoing the key back cannot leak it.
"""

from __future__ import annotations

import hmac
import json
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import structlog
from pydantic import SecretStr

from runtime.canonical import canonical_json
from runtime.config import DEFAULT_KEY_REF
from runtime.errors import ModelError, ModelInputRejection, ModelUnavailable, RequestInvalid
from runtime.messages import Message
from runtime.models.base import ModelRequest, ModelResponse

# Where each provider's default key may always be sent.
OFFICIAL_BASE_URLS: Mapping[str, tuple[str, ...]] = {
    "openai": ("https://api.openai.com/v1",),
    "anthropic": ("https://api.anthropic.com",),
}
# The environment variable that holds each provider's default key (for messages only).
DEFAULT_KEY_VARIABLES: Mapping[str, str] = {
    "openai": "AIDAWORK_OPENAI_API_KEY",
    "anthropic": "AIDAWORK_ANTHROPIC_API_KEY",
}
REDACTED = "[redacted]"
MAX_PROVIDER_MESSAGE_CHARS = 500


# --- errors ------------------------------------------------------------------------------


class ModelKeyMissing(ModelError):
    """The run asks for a key (``api_key_ref``) that this worker does not have."""

    code = "MODEL_API_KEY_MISSING"


class ModelRequestRefused(ModelError):
    """The provider refused the request (a 4xx other than 408/429 and other than a
    context overflow): a bad model name, a bad key, a malformed request. Retrying the
    same request cannot help."""

    code = "MODEL_REQUEST_REFUSED"

    def __init__(self, message: str, *, provider: str, status: int) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status


class ModelResponseInvalid(ModelError):
    """The provider answered 2xx with something that is not a usable response (not
    JSON, no choice, tool call arguments that are not a JSON object)."""

    code = "MODEL_RESPONSE_INVALID"


# --- keys --------------------------------------------------------------------------------


def clean_key(value: str) -> str:
    """A key as configured, without the surrounding whitespace a key file or a shell
    often adds. It must be printable ASCII without spaces: anything else cannot be sent in
    an HTTP header, and the HTTP library's error would quote it. Never echoes the value."""
    value = value.strip()
    if not value or not all("!" <= c <= "~" for c in value):
        raise ValueError("an API key must be non-empty printable ASCII without spaces")
    return value


def normalize_base_url(url: str) -> str:
    """Scheme and host lower-cased, trailing slashes dropped: the form compared against
    the allowed base URLs."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class ResolvedKey:
    """The key a client sends (``None``: no key), or why the key it needs is missing."""

    value: SecretStr | None
    missing: str | None = None

    def header_value(self) -> str | None:
        return self.value.get_secret_value() if self.value is not None else None

    def secrets(self) -> tuple[str, ...]:
        return (self.value.get_secret_value(),) if self.value is not None else ()


@dataclass(frozen=True)
class ModelKeys:
    """The deployment's model keys: one default per provider, named keys any provider
    can use, and the base URLs (beyond the official ones) keys may be sent to."""

    openai: SecretStr | None = None
    anthropic: SecretStr | None = None
    named: Mapping[str, SecretStr] = field(default_factory=dict)
    base_urls: tuple[str, ...] = ()

    def allows(self, provider: str, base_url: str) -> bool:
        target = normalize_base_url(base_url)
        allowed = (*OFFICIAL_BASE_URLS.get(provider, ()), *self.base_urls)
        return any(normalize_base_url(u) == target for u in allowed)

    def _values(self) -> Iterable[str]:
        for secret in (self.openai, self.anthropic, *self.named.values()):
            if secret is not None:
                yield secret.get_secret_value()

    def resolve(self, provider: str, api_key_ref: str | None, base_url: str) -> ResolvedKey:
        """The key for one run's model config. Raises ``RequestInvalid`` for what the
        request got wrong (checked at submit time by ``prepare_execution``); a default key
        that is simply not configured here resolves to ``missing`` and fails the call."""
        if api_key_ref is None:
            return ResolvedKey(None)
        if any(hmac.compare_digest(api_key_ref.encode(), v.encode()) for v in self._values()):
            raise RequestInvalid("config.model.api_key_ref", "api_key_ref must name a key, never contain it")
        if not self.allows(provider, base_url):
            allowed = ", ".join((*OFFICIAL_BASE_URLS.get(provider, ()), *self.base_urls))
            raise RequestInvalid(
                "config.model.base_url",
                f"this deployment sends {provider} API keys only to: {allowed} (AIDAWORK_MODEL_BASE_URLS adds more); "
                "for a server that needs no key, set api_key_ref to null",
            )
        if api_key_ref == DEFAULT_KEY_REF:
            value = self.openai if provider == "openai" else self.anthropic if provider == "anthropic" else None
            if value is None:
                variable = DEFAULT_KEY_VARIABLES.get(provider, "the provider's key variable")
                return ResolvedKey(None, missing=f"no default {provider} API key is configured ({variable} is unset)")
            return ResolvedKey(value)
        if api_key_ref not in self.named:
            names = ", ".join(sorted(self.named)) or "none"
            raise RequestInvalid(
                "config.model.api_key_ref",
                f"no model key named {api_key_ref!r} is configured (AIDAWORK_MODEL_KEYS names: {names})",
            )
        return ResolvedKey(self.named[api_key_ref])


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


# --- retries -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Retry policy as data. ``max_attempts`` counts the first try. A server asking for a
    wait longer than ``max_wait_s`` (or past the call's deadline) ends the call at once:
    the round is retried later by its task instead of holding a thread."""

    max_attempts: int = 4
    base_s: float = 0.5
    cap_s: float = 8.0
    max_wait_s: float = 60.0


DEFAULT_RETRY = RetryPolicy()
RETRYABLE_STATUSES = frozenset({408, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def backoff_s(attempt: int, policy: RetryPolicy, rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with jitter after failed attempt ``attempt`` (1-based): a
    uniform draw from the upper half of ``base * 2**(attempt-1)``, capped, so that many
    workers rate-limited at once do not come back in step."""
    ceiling: float = min(policy.cap_s, policy.base_s * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + rand() / 2)


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
                    self._client = httpx.Client(limits=httpx.Limits(max_connections=200, max_keepalive_connections=50))
        return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


@dataclass(frozen=True)
class JsonPoster:
    """POSTs a JSON body with retries. ``provider`` labels messages and logs; ``secrets``
    are redacted from every text this produces."""

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
                problem = f"connection failed: {type(exc).__name__}: {redact(str(exc), secrets)}"
            else:
                reply = _reply(response)
                if not is_retryable_status(reply.status):
                    return reply
                problem = f"HTTP {reply.status}{describe_error_body(reply, secrets)}"
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


def _reply(response: httpx.Response) -> HttpReply:
    text = response.text
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    return HttpReply(response.status_code, body, text)


def error_fields(reply: HttpReply) -> tuple[str, str, str]:
    """(type, code, message) of an error body, whichever of the common shapes it has:
    ``{"error": {"type", "code", "message"}}`` (OpenAI, Anthropic), ``{"message", "type",
    "code"}`` (vLLM), ``{"error": "text"}`` (Ollama); else the start of the body text."""
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
    return "", "", reply.text


def describe_error_body(reply: HttpReply, secrets: Iterable[str]) -> str:
    """`` (type/code): message``, redacted and shortened, or nothing if the body says
    nothing."""
    kind, code, message = error_fields(reply)
    label = "/".join(p for p in (kind, code) if p)
    message = redact(" ".join(message.split()), secrets)
    if len(message) > MAX_PROVIDER_MESSAGE_CHARS:
        message = message[:MAX_PROVIDER_MESSAGE_CHARS] + "..."
    out = f" ({label})" if label else ""
    return f"{out}: {message}" if message else out


# --- mapping shared by the adapters ------------------------------------------------------


def typed_error(
    reply: HttpReply, *, provider: str, label: str, key_ref: str | None, secrets: tuple[str, ...], overflow: bool
) -> ModelError:
    """The typed error for a provider's final non-2xx reply (``overflow``: the provider
    said the input is too long for its context window)."""
    detail = describe_error_body(reply, secrets)
    if overflow:
        return ModelInputRejection(f"{label} rejected the input as too long for the context window{detail}")
    if reply.status == 401:
        # Not even the provider's message: some echo a masked key back.
        return ModelRequestRefused(
            f"{label} refused the API key (HTTP 401; api_key_ref {key_ref!r})", provider=provider, status=401
        )
    return ModelRequestRefused(
        f"{label} refused the request: HTTP {reply.status}{detail}", provider=provider, status=reply.status
    )


class HttpModel:
    """One run's client for an HTTP provider: the call, the key header, the typed errors
    and the redaction, shared by the adapters. A subclass names its ``provider`` and
    ``path`` and maps the request and the response. Holds no per-call state, so it is safe
    from many threads."""

    provider: ClassVar[str]
    path: ClassVar[str]

    def __init__(self, config: Any, key: ResolvedKey, poster: JsonPoster) -> None:
        self._config = config
        self._key = key
        self._poster = poster
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
        secrets = self._key.secrets()
        headers = self.headers(self._key.header_value())
        reply = self._poster.post(self._url, headers, self.request_body(request), request.timeout_s, secrets)
        if not reply.ok:
            raise typed_error(
                reply,
                provider=self.provider,
                label=self._label,
                key_ref=self._config.api_key_ref,
                secrets=secrets,
                overflow=self.is_context_overflow(reply),
            )
        if reply.body is None:
            raise ModelResponseInvalid(f"{self._label} answered HTTP {reply.status} with a body that is not JSON")
        try:
            return self.parse(reply.body, request)
        except ModelResponseInvalid as exc:  # it may quote the model's output, which may quote the key
            raise ModelResponseInvalid(redact(exc.message, secrets)) from None


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

"""The transport of the HTTP providers: one JSON POST with bounded retries, over one
pooled ``httpx.Client`` per provider per process.

A provider's reply enters the system here and only here, and is scrubbed as it enters
(``runtime.models.scrub``): every configured key value is removed from the body and the
error text before anything else reads them.

Retries: connection errors, timeouts, 408, 429 and 5xx are retried with exponential
backoff and jitter (``schema.wire.retry``), or after the server's ``Retry-After`` (seconds
or an HTTP date), up to ``RetryPolicy.max_attempts`` and never past the call's
``timeout_s``; then ``ModelUnavailable`` (retryable: the Celery task tries the round again
later). Every other status is returned to the adapter, which knows its provider's error
bodies. Redirects are never followed: a 3xx is a refusal like any other status.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import structlog

from runtime.errors import ModelUnavailable
from runtime.models.provider_errors import describe_error
from runtime.models.scrub import scrub, scrub_text
from schema.wire.retry import RetryPolicy, backoff_s

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

"""The transport of the HTTP providers: the official SDKs (``openai``, ``anthropic``), one
pooled client per (provider, base URL, key) per process, with what we add on top.

Retries are the SDK's own (``_should_retry``): connection errors, timeouts, 408, 409,
429 and 5xx, obeying ``x-should-retry: true|false`` and ``Retry-After`` /
``retry-after-ms``. We add a budget: a call never runs past its ``timeout_s``, retries
and their waits included. Each attempt's timeout is clamped to what is left of the
budget, and a wait that would end past it is not waited: the call ends
``ModelUnavailable`` (retryable: the Celery task tries the round again later). Without a
``Retry-After`` the wait is ``schema.wire.retry.backoff_s``.

A provider's reply enters the system here and only here, and is scrubbed as it enters
(``runtime.models.scrub``): every configured key value is removed from the body and the
error text before anything else reads them; the SDK's own exception messages (which
quote the body) are never used. Redirects are never followed (the allowlist is checked
on the base URL, and a redirect would take the key somewhere else). Keys come only from
our settings: the SDK's environment lookups are bypassed (``auth_headers`` is ours).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anthropic
import httpx2
import openai
import structlog

from runtime.errors import ModelUnavailable
from runtime.models.limits import report_rate_limited
from runtime.models.provider_errors import describe_error
from runtime.models.replies import HttpReply, reply_of
from runtime.models.scrub import scrub_text
from schema.wire.retry import RetryPolicy, backoff_s

DEFAULT_RETRY = RetryPolicy()

@dataclass(frozen=True)
class _Budget:
    """The call running on this thread: its deadline (``time.monotonic()``), its
    timeout, the retry policy and the secrets to scrub from what the retry log says."""

    deadline: float
    timeout_s: float
    retry: RetryPolicy
    secrets: tuple[str, ...]


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("aidawork_model_budget", default=None)


class DeadlineExceeded(Exception):
    """The next retry would end past the call's budget (raised inside the SDK's loop)."""


class _Budgeted:
    """Mixed into the SDK clients: each attempt clamped to the call's budget, and our
    wait between attempts."""

    _aidawork_provider: str

    def _send_request(self, request: httpx2.Request, **kwargs: object) -> httpx2.Response:
        budget = _budget.get()
        if budget is not None:
            remaining = budget.deadline - time.monotonic()
            if remaining <= 0:
                raise httpx2.TimeoutException("the call's time budget is spent", request=request)
            timeout = request.extensions.get("timeout")
            if isinstance(timeout, dict):
                request.extensions["timeout"] = {
                    k: remaining if v is None else min(v, remaining) for k, v in timeout.items()
                }
        response: httpx2.Response = super()._send_request(request, **kwargs)  # type: ignore[misc]
        return response

    def _calculate_retry_timeout(
        self, remaining_retries: int, options: object, response_headers: httpx2.Headers | None = None
    ) -> float:
        budget = _budget.get()
        computed: float = super()._calculate_retry_timeout(  # type: ignore[misc]
            remaining_retries, options, response_headers
        )
        if budget is None or self._parse_retry_after_header(response_headers) is not None:  # type: ignore[attr-defined]
            return computed
        attempt = options.get_max_retries(self.max_retries) - remaining_retries + 1  # type: ignore[attr-defined]
        return backoff_s(attempt, budget.retry)

    def _sleep_for_retry(
        self, *, retries_taken: int, max_retries: int, options: object, response: httpx2.Response | None
    ) -> None:
        remaining_retries = max_retries - retries_taken
        if response is not None and response.status_code == 429:
            report_rate_limited(response.headers)  # the fleet's limit narrows before this thread waits
        delay = self._calculate_retry_timeout(remaining_retries, options, response.headers if response else None)
        budget = _budget.get()
        secrets = budget.secrets if budget is not None else ()
        problem = describe_error(reply_of(response, secrets)) if response is not None else "no answer"
        if budget is not None and (
            delay > budget.retry.max_wait_s or time.monotonic() + delay >= budget.deadline
        ):
            raise DeadlineExceeded(
                f"{self._aidawork_provider}: {problem} after {retries_taken + 1} attempts; the next attempt "
                f"(in {delay:.3g}s) would exceed the call's timeout of {budget.timeout_s:g}s"
            )
        structlog.get_logger("aidawork.models").warning(
            "model_call_retried",
            provider=self._aidawork_provider,
            attempt=retries_taken + 1,
            problem=problem,
            delay_s=round(delay, 3),
        )
        time.sleep(delay)


class OpenAI(_Budgeted, openai.OpenAI):  # named as the SDK's: its name is in the User-Agent
    pass


class Anthropic(_Budgeted, anthropic.Anthropic):
    pass


SdkClient = OpenAI | Anthropic
SDK_CLASSES: Mapping[str, type[OpenAI] | type[Anthropic]] = {"openai": OpenAI, "anthropic": Anthropic}


class ClientCache:
    """One SDK client per (base URL, key headers) per process for one provider, created
    on first use. The SDK clients are thread-safe and pool connections (one httpx client
    each). The key headers are the client's default headers, never a call's options:
    the SDKs log a call's options (headers included) at DEBUG."""

    def __init__(self, provider: str, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.provider = provider
        self.retry = retry
        self._clients: dict[tuple[str, tuple[tuple[str, str | None], ...]], SdkClient] = {}
        self._lock = threading.Lock()

    def get(self, base_url: str, headers: Mapping[str, object]) -> SdkClient:
        cache_key = (base_url, tuple(sorted((k, v if isinstance(v, str) else None) for k, v in headers.items())))
        client = self._clients.get(cache_key)
        if client is None:
            with self._lock:
                client = self._clients.get(cache_key)
                if client is None:
                    client = self._build(base_url, dict(headers))
                    self._clients[cache_key] = client
        return client

    def _build(self, base_url: str, headers: dict[str, Any]) -> SdkClient:
        # ``headers`` holds the SDK's ``Omit()`` where a header is removed: the SDKs take it
        # in ``default_headers``, whose annotation (``Mapping[str, str]``) does not say so.
        http = httpx2.Client(
            limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50), follow_redirects=False
        )
        cls = SDK_CLASSES[self.provider]
        client = cls(
            # Explicit, so the SDK reads no credential from the environment; never sent:
            # the default headers override the auth header (``HttpModel.headers``).
            api_key="unused-the-client-sends-its-own",
            default_headers=headers,
            base_url=base_url,
            max_retries=max(0, self.retry.max_attempts - 1),
            http_client=http,
        )
        client._aidawork_provider = self.provider
        # What the SDKs take from the environment besides credentials (which an explicit
        # key already shuts out): OpenAI's OPENAI_ORG_ID / OPENAI_PROJECT_ID, Anthropic's
        # ANTHROPIC_CUSTOM_HEADERS. A deployment's headers are ours alone.
        if isinstance(client, openai.OpenAI):
            client.organization = None
            client.project = None
        client._custom_headers = dict(headers)
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


T = TypeVar("T")
STATUS_ERRORS = (openai.APIStatusError, anthropic.APIStatusError)
TIMEOUT_ERRORS = (openai.APITimeoutError, anthropic.APITimeoutError)
CONNECTION_ERRORS = (openai.APIConnectionError, anthropic.APIConnectionError)
# What a stream that breaks off after its status raises while it is read.
STREAM_ERRORS = (openai.APIError, anthropic.APIError)


class StatusError(Exception):
    """A final error status from the provider (after the SDK's retries), scrubbed."""

    def __init__(self, reply: HttpReply) -> None:
        super().__init__(f"HTTP {reply.status}")
        self.reply = reply


def call_within_budget(
    provider: str, timeout_s: float, retry: RetryPolicy, secrets: tuple[str, ...], call: Callable[[], T]
) -> T:
    """Run one SDK call within ``timeout_s``, retries included. A final error status
    is raised as ``StatusError`` (the adapter knows its provider's error bodies); a
    retryable status the SDK gave up on, a timeout or a connection failure as
    ``ModelUnavailable``."""
    token = _budget.set(_Budget(time.monotonic() + timeout_s, timeout_s, retry, secrets))
    try:
        return call()
    except DeadlineExceeded as exc:
        raise ModelUnavailable(scrub_text(str(exc), secrets)) from None
    except STATUS_ERRORS as exc:
        reply = reply_of(exc.response, secrets)
        if reply.status == 429:  # a final one, not retried: the retried ones were reported as they came
            report_rate_limited(exc.response.headers)
        if reply.ok:  # an error event inside a 2xx stream (Anthropic ``event: error``, overloaded)
            raise ModelUnavailable(f"{provider}: the stream ended with an error event") from None
        if reply.should_retry != "false" and is_retried_status(reply.status):
            raise ModelUnavailable(
                f"{provider}: unavailable after {retry.max_attempts} attempts: {describe_error(reply)}"
            ) from None
        raise StatusError(reply) from None
    except TIMEOUT_ERRORS:
        raise ModelUnavailable(
            f"{provider}: no answer within the call's timeout of {timeout_s:g}s "
            f"(after {retry.max_attempts} attempts at most)"
        ) from None
    except CONNECTION_ERRORS as exc:
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {scrub_text(str(cause), secrets)}" if cause else type(exc).__name__
        raise ModelUnavailable(f"{provider}: connection failed after {retry.max_attempts} attempts: {detail}") from None
    except (httpx2.TimeoutException, httpx2.TransportError, *STREAM_ERRORS) as exc:  # mid-stream
        raise ModelUnavailable(
            f"{provider}: the stream broke off: {type(exc).__name__}: {scrub_text(str(exc), secrets)[:200]}"
        ) from None
    finally:
        _budget.reset(token)


def is_retried_status(status: int) -> bool:
    """The statuses the SDKs retry (without an ``x-should-retry`` saying otherwise)."""
    return status in (408, 409, 429) or status >= 500

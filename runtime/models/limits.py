"""What the fleet's provider rate limits need from the core, and nothing of how they are
enforced (the worker's token buckets in Redis, ``worker.ops.rate_limits``):

- ``CallLimitKey``: what a run's model calls count against (the provider, the configured
  key's name ``api_key_ref``, the model) and the output limit that is part of each call's
  token estimate; derived once per run from its model config (``call_limit_key``). A
  config without ``api_key_ref`` (the scripted model) has none: it is never limited.
- a call's token estimate is the one the budgets use (``runtime.budget``): its input
  estimate plus the bucket's output limit, which is how OpenAI itself counts a request
  against a tokens-per-minute limit when the request arrives (so it needs no settling).
- the HTTP transport reports every 429 it is answered (with the wait its ``Retry-After``
  asks for) to whoever listens on this thread (``listening_for_rate_limits``), so the
  worker can narrow the limit for the whole fleet.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime


@dataclass(frozen=True)
class CallLimitKey:
    provider: str
    api_key_ref: str | None  # None: the call sends no key (a local server)
    model: str
    max_output_tokens: int  # the output part of a call's estimate (runtime.budget)


def call_limit_key(provider: str, config: object, max_output_tokens: int) -> CallLimitKey | None:
    """The limit key of a run's model calls, or None when its provider has no configured
    key at all (the scripted model; a plugin provider whose config has no ``api_key_ref``).
    ``max_output_tokens``: the output part of each call's estimate, the one its budget
    reservation uses (``runtime.budget.max_output_tokens``)."""
    if not hasattr(config, "api_key_ref"):
        return None
    name = getattr(config, "name", None)
    if not isinstance(name, str):
        return None
    ref = getattr(config, "api_key_ref", None)
    return CallLimitKey(provider, ref if isinstance(ref, str) else None, name, max_output_tokens)


# --- the provider's 429s, reported to the caller ------------------------------------------

# Called with the wait the 429's Retry-After asks for (seconds), or None when it names none.
RateLimitListener = Callable[[float | None], None]

_listener: contextvars.ContextVar[RateLimitListener | None] = contextvars.ContextVar(
    "aidawork_rate_limit_listener", default=None
)


@contextmanager
def listening_for_rate_limits(listener: RateLimitListener) -> Iterator[None]:
    """Every 429 the provider answers a call made inside this block (on this thread) is
    reported to ``listener``, retried by the SDK or not."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def report_rate_limited(headers: Mapping[str, str] | None) -> None:
    """The transport was answered 429 (``headers``: the reply's)."""
    listener = _listener.get()
    if listener is not None:
        listener(retry_after_s(headers))


def retry_after_s(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """The wait a reply's ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)
    asks for, or None when it asks for none (or says nothing readable)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        seconds = _number(ms)
        if seconds is not None:
            return seconds / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None

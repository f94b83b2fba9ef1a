"""Which URLs a run's webhook may name, how long to wait between attempts, and the part of
a URL that may be logged. Pure functions: unit-tested without services."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from urllib.parse import unquote, urlsplit

from runtime.errors import RequestInvalid
from schema.wire.errors import ErrorCode
from schema.wire.retry import RetryPolicy, backoff_s

SCHEMES = ("http", "https")


class WebhookRefused(RequestInvalid):
    """Raised at submit when a run's ``webhook.url`` is not allowed: not http(s), with a
    dot segment, or not under one of the deployment's ``AIDAWORK_WEBHOOK_URLS`` prefixes
    (none: webhooks are off). Nothing is stored. The message never repeats the URL (it
    may hold a token)."""

    code = ErrorCode.WEBHOOK_REFUSED


def _url_problem(url: str) -> str | None:
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in SCHEMES or not url.startswith(f"{parts.scheme}://"):
        return "must be an http:// or https:// URL"
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        return "has an invalid port"
    if not parts.hostname:
        return "must name a host"
    if _has_dot_segment(parts.path):
        return "must not contain a dot segment (. or .., percent-encoded or not)"
    return None


def _has_dot_segment(path: str) -> bool:
    """A ``.`` or ``..`` segment, as written or after percent-decoding (repeated until
    nothing changes), ``\\`` counting as a separator: httpx resolves ``/hook/../x`` to
    ``/x`` before sending, and a receiver's server may decode ``%2e%2e`` or ``..%2f`` and
    resolve it, so a URL that matched a prefix as written would reach a path outside it."""
    while True:
        if any(segment in (".", "..") for segment in path.replace("\\", "/").split("/")):
            return True
        decoded = unquote(path)
        if decoded == path:
            return False
        path = decoded


def parse_prefixes(raw: str) -> list[str]:
    """``AIDAWORK_WEBHOOK_URLS``: comma-separated http(s) URL prefixes (empty: none)."""
    prefixes = [p.strip() for p in raw.split(",") if p.strip()]
    for i, prefix in enumerate(prefixes):
        problem = _url_problem(prefix)
        if problem is not None:
            raise ValueError(f"prefix #{i + 1} {problem}")
    return prefixes


def _under(url: str, prefix: str) -> bool:
    """``url`` starts with ``prefix`` on a boundary: the prefix ends with ``/``, or what
    follows it starts a new segment, the query or the fragment. Else ``https://h.example``
    would allow ``https://h.example.evil.net/`` or ``https://h.example@evil.net/``, and
    ``https://h.example/hook`` would allow ``https://h.example/hookevil``."""
    if not url.startswith(prefix):
        return False
    rest = url[len(prefix):]
    return prefix.endswith("/") or rest == "" or rest[0] in "/?#"


def check_url_shape(url: str) -> None:
    """``WebhookRefused`` unless ``url`` is an http(s) URL naming a host, without a dot
    segment: ``check_webhook_url`` without the prefixes."""
    problem = _url_problem(url)
    if problem is not None:
        raise WebhookRefused("webhook.url", problem)


def check_webhook_url(url: str, prefixes: Sequence[str]) -> None:
    """``WebhookRefused`` (field ``webhook.url``) unless ``url`` is allowed."""
    if not prefixes:
        raise WebhookRefused("webhook.url", "webhooks are not enabled here (AIDAWORK_WEBHOOK_URLS is empty)")
    check_url_shape(url)
    if not any(_under(url, prefix) for prefix in prefixes):
        raise WebhookRefused(
            "webhook.url", "is not under any of the allowed prefixes (AIDAWORK_WEBHOOK_URLS); ask the operator"
        )


def url_origin(url: str) -> str:
    """Scheme and host of ``url``, the only part of it ever logged: its userinfo, path or
    query may hold a token."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}"


def retry_delay_s(
    attempt: int, *, base_s: float, max_s: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before the attempt after failed attempt number ``attempt`` (1-based): the
    system's one backoff (``schema.wire.retry.backoff_s``): exponential (base, 2 x base,
    4 x base, ...) capped at ``max_s``, with "equal jitter" (half fixed, half random), so
    receivers coming back are not hit by every retry at once and no retry comes sooner
    than half its step."""
    return backoff_s(attempt, RetryPolicy(base_s=base_s, cap_s=max_s), rand)

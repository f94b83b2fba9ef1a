"""A provider's HTTP reply as it enters the system: status, body and text, scrubbed.

Its own module, below both the transport (which builds replies) and the error mapping
(which reads them), so that neither imports the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx2

from runtime.models.scrub import scrub, scrub_text
from schema.wire.json import JsonValue


@dataclass(frozen=True)
class HttpReply:
    """A final (non-retried) error response: its status, the JSON body if it had one,
    and the body text (for error messages), scrubbed."""

    status: int
    body: JsonValue
    text: str
    should_retry: str | None = None  # the server's x-should-retry header

    @property
    def ok(self) -> bool:
        return 200 <= self.status <= 299


def reply_of(response: httpx2.Response, secrets: tuple[str, ...]) -> HttpReply:
    """The reply as it enters the system: scrubbed of every configured key, text and
    decoded body alike (a key written with JSON escapes reappears only once decoded)."""
    try:
        raw = response.text
    except Exception:  # a streamed body never read
        raw = ""
    text = scrub_text(raw, secrets)
    try:
        body = scrub(json.loads(text), secrets) if text else None
    except (ValueError, RecursionError):
        body = None
    return HttpReply(response.status_code, body, text, response.headers.get("x-should-retry"))

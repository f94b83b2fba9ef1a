"""The one scrubbing function for data that comes from a model provider.

A provider's answer is untrusted text: a misconfigured or hostile endpoint can echo the
``Authorization`` header into an error's ``type``, a tool call's id, a tool name or the
answer itself. Every configured key value is replaced by ``[redacted]`` in every string
(object keys included) of a provider's reply as it enters the system, in
``HttpModel.complete`` and ``runtime.models.transport`` (the SDK clients), before anything builds a message, a row, an
event, a log line or an exception from it. Nothing downstream needs to scrub again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

REDACTED = "[redacted]"


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` (a decoded JSON value) with every secret removed from every string.
    Iterative, so a deeply nested answer cannot exhaust the stack."""
    if not secrets:
        return value
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, slot = stack.pop()
        item = parent[slot]
        if isinstance(item, str):
            parent[slot] = scrub_text(item, secrets)
        elif isinstance(item, dict):
            fresh = {scrub_text(str(k), secrets): v for k, v in item.items()}
            parent[slot] = fresh
            stack.extend((fresh, k) for k in fresh)
        elif isinstance(item, (list, tuple)):
            items = list(item)
            parent[slot] = items
            stack.extend((items, i) for i in range(len(items)))
    return root[0]


class ScrubbedDeltas:
    """Hands streamed text on to ``sink`` scrubbed of every secret, even one split across
    deltas: the last ``len(longest secret) - 1`` characters are held back until more text
    (or the end) shows whether they begin a secret."""

    def __init__(self, sink: Callable[[str], None], secrets: tuple[str, ...]) -> None:
        self._sink = sink
        self._secrets = secrets
        self._hold = max((len(s) for s in secrets), default=1) - 1
        self._pending = ""

    def push(self, text: str) -> None:
        if not text:
            return
        self._pending = scrub_text(self._pending + text, self._secrets)
        cut = len(self._pending) - self._hold
        if cut > 0:
            out, self._pending = self._pending[:cut], self._pending[cut:]
            self._sink(out)

    def flush(self) -> None:
        if self._pending:
            out, self._pending = scrub_text(self._pending, self._secrets), ""
            self._sink(out)

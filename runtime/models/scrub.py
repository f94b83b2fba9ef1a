"""The one scrubbing function for data that comes from a model provider.

A provider's answer is untrusted text: a misconfigured or hostile endpoint can echo the
``Authorization`` header into an error's ``type``, a tool call's id, a tool name or the
answer itself. Every configured key value is replaced by ``[redacted]`` in every string
(object keys included) of a provider's reply as it enters the system, in
``HttpModel.complete`` and ``runtime.models.transport`` (the SDK clients), before anything builds a message, a row, an
event, a log line or an exception from it. Nothing downstream needs to scrub again.

The answer may also carry a piece of a key (a proxy that quotes the first characters of
the ``Authorization`` header, a model that spells the key backwards): every piece of
``MIN_PIECE`` or more characters of a key, or of the key reversed, is redacted as well;
overlapping and touching pieces become one ``[redacted]``. A key shorter than that is
redacted whole. The pieces are found with a set lookup or ``str.find`` per piece, whichever
is fewer steps for the text at hand: this runs on every string of every reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import overload

from schema.wire.json import JsonObject, JsonValue

REDACTED = "[redacted]"
# Shorter pieces occur in ordinary text by chance (``sk-proj-``, ``-openai-``); eight
# characters of a random key do not.
MIN_PIECE = 8

Span = tuple[int, int]


@lru_cache(maxsize=32)
def _pieces(secrets: tuple[str, ...]) -> dict[int, frozenset[str]]:
    """The pieces to find, by length: every ``MIN_PIECE``-character window of each secret
    and of the secret reversed (a shorter secret: itself, both ways)."""
    by_length: dict[int, set[str]] = {}
    for secret in secrets:
        size = min(MIN_PIECE, len(secret))
        for text in (secret, secret[::-1]):
            by_length.setdefault(size, set()).update(text[i : i + size] for i in range(len(text) - size + 1))
    return {size: frozenset(group) for size, group in by_length.items() if size > 0}


def _found(text: str, size: int, group: frozenset[str]) -> Iterable[Span]:
    if len(text) - size + 1 <= len(group):  # fewer windows in the text than pieces to find
        return [(i, i + size) for i in range(len(text) - size + 1) if text[i : i + size] in group]
    spans: list[Span] = []
    for piece in group:
        at = text.find(piece)
        while at != -1:
            spans.append((at, at + size))
            at = text.find(piece, at + 1)
    return spans


def secret_spans(text: str, secrets: tuple[str, ...]) -> list[Span]:
    """Where ``text`` holds a piece of a secret: sorted, overlapping and touching spans
    merged."""
    found: list[Span] = []
    for size, group in _pieces(secrets).items():
        if len(text) >= size:
            found.extend(_found(text, size, group))
    if not found:
        return []
    found.sort()
    merged = [found[0]]
    for start, end in found[1:]:
        if start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _redact(text: str, spans: list[Span]) -> str:
    out: list[str] = []
    at = 0
    for start, end in spans:
        out += (text[at:start], REDACTED)
        at = end
    out.append(text[at:])
    return "".join(out)


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    spans = secret_spans(text, tuple(s for s in secrets if s))
    return _redact(text, spans) if spans else text


@overload
def scrub(value: JsonObject, secrets: tuple[str, ...]) -> JsonObject: ...


@overload
def scrub(value: JsonValue, secrets: tuple[str, ...]) -> JsonValue: ...


def scrub(value: JsonValue, secrets: tuple[str, ...]) -> JsonValue:
    """``value`` (a decoded JSON value) with every secret removed from every string: of
    the same shape (an object stays one; a tuple becomes a list), made of fresh objects
    and lists. Iterative, so a deeply nested answer cannot exhaust the stack."""
    if not secrets:
        return value
    root = _scrubbed(value, secrets)
    stack: list[JsonValue] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():  # values replaced, keys kept: no resize
                node[key] = _scrubbed(item, secrets)
            stack.extend(node.values())
        elif isinstance(node, list):
            node[:] = [_scrubbed(item, secrets) for item in node]
            stack.extend(node)
    return root


def _scrubbed(item: JsonValue, secrets: tuple[str, ...]) -> JsonValue:
    """``item`` scrubbed: a string; or a fresh object (keys scrubbed) or list, whose members
    are still to be scrubbed."""
    if isinstance(item, str):
        return scrub_text(item, secrets)
    if isinstance(item, dict):
        return {scrub_text(str(k), secrets): v for k, v in item.items()}
    if isinstance(item, list | tuple):
        return list(item)
    return item


class ScrubbedDeltas:
    """Hands streamed text on to ``sink`` scrubbed of every secret, even one (or a piece of
    one) split across deltas: the last ``len(longest secret) - 1`` characters are held back
    until more text (or the end) shows whether they begin a secret, and so is a piece that
    reaches into them, so that a key and the pieces touching it become one ``[redacted]``.
    What is held is the provider's raw text, so it is scrubbed once, whole."""

    def __init__(self, sink: Callable[[str], None], secrets: tuple[str, ...]) -> None:
        self._sink = sink
        self._secrets = tuple(s for s in secrets if s)
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = ""

    def push(self, text: str) -> None:
        if not text:
            return
        self._pending += text
        spans = secret_spans(self._pending, self._secrets)
        cut = len(self._pending) - self._hold
        cut = next((start for start, end in spans if start < cut < end), cut)
        if cut > 0:
            out = _redact(self._pending[:cut], [span for span in spans if span[1] <= cut])
            self._pending = self._pending[cut:]
            self._sink(out)

    def flush(self) -> None:
        if self._pending:
            out, self._pending = scrub_text(self._pending, self._secrets), ""
            self._sink(out)

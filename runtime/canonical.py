"""Canonical JSON and the one digest function every proof and fingerprint uses.

Canonical form: keys sorted, no insignificant whitespace, UTF-8 (not ASCII-escaped),
integral numbers written as integers (``2.0`` -> ``2``, ``1e16`` -> ``10000000000000000``,
taking a float at its shortest decimal form), so that a value does not change digest when
it crosses a JSON encoder or a jsonb column that formats numbers differently. NaN,
infinities and unpaired surrogates have no JSON form: encoding them raises ``ValueError``
(``UnicodeEncodeError`` is one). ``json_problem`` is the one check of what a value may hold
(no NaN or infinity, no NUL or unpaired surrogate, at most MAX_JSON_DEPTH levels and
MAX_INT_DIGITS digits): whatever passes it encodes, stores in jsonb and digests.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeAlias, TypeGuard

from runtime.errors import RequestInvalid
from schema.wire.json import JsonMapping, JsonObject, JsonValue


def _normalize(value: object) -> object:
    if isinstance(value, float) and math.isfinite(value):
        # Through the float's shortest decimal form, as a JSON encoder writes it and as
        # PostgreSQL's jsonb stores it: 1e16 and 1.5e300 come back from jsonb as integers.
        exact = Decimal(repr(value))
        return int(exact) if exact == exact.to_integral_value() else value
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value


# --- what a JSON value may hold ------------------------------------------------------------
# Every JSON value that comes from outside (a run request, a prerequisite, a delivered
# file, a task payload) is checked by ``json_problem`` before anything stores or digests it.

# Arrays and objects nested in one another, the outermost counting as 1. Far below what
# the encoders allow (pydantic serializes 255 levels, json.dumps about 990, jsonb more),
# so a value that passes still fits after the runtime wraps it in messages and events.
MAX_JSON_DEPTH = 64
# What the runtime builds around accepted values (a tool's result that returns a
# prerequisite's value inside an object, a model's response) is checked against twice
# that: still far below pydantic's 255 once a message or an event wraps it again.
MAX_RESULT_DEPTH = 2 * MAX_JSON_DEPTH
# Below CPython's 4300-digit limit on int <-> str conversion (json.dumps and json.loads
# raise ValueError above it); jsonb's numeric stores far more.
MAX_INT_DIGITS = 4000
_INT_BOUND = 10**MAX_INT_DIGITS  # compared, never converted: str() of a huge int raises

NON_FINITE = "NaN or Infinity (JSON has no such number)"
NUL_CHARACTER = "a NUL character (PostgreSQL cannot store it)"
UNPAIRED_SURROGATE = "an unpaired surrogate (not encodable as UTF-8)"
TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"
TOO_MANY_DIGITS = f"an integer with more than {MAX_INT_DIGITS} digits"
KEY_NOT_TEXT = "an object key that is not a string"

_BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")
# A key shown as ``.key``; any other (empty, long, with spaces, brackets, quotes or
# unprintable characters) is shown quoted and escaped: ``["a b"]``.
_PLAIN_KEY = re.compile(r'[^\s\[\]"\\]{1,64}')
_SHOWN_KEY_CHARS = 64


@dataclass(frozen=True)
class JsonProblem:
    """Why a value is refused, and where: ``path`` (``config.tools[1]``, ``value.a``)
    always renders as ASCII-safe text, whatever the keys hold."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


def join_path(path: str, part: str | int) -> str:
    """``path`` extended by a list index or an object key (a key that is not plain is
    quoted and escaped, so a path never carries a control character or a surrogate)."""
    if isinstance(part, int):
        return f"{path}[{part}]"
    if _PLAIN_KEY.fullmatch(part) and part.isprintable():
        return f"{path}.{part}" if path else part
    shown = part if len(part) <= _SHOWN_KEY_CHARS else part[:_SHOWN_KEY_CHARS] + "..."
    return f"{path}[{json.dumps(shown)}]"


def text_problem(text: str) -> str | None:
    """Why a string cannot be stored (a NUL, an unpaired surrogate), or None."""
    found = _BAD_CHARACTER.search(text)
    if found is None:
        return None
    return NUL_CHARACTER if found.group() == "\x00" else UNPAIRED_SURROGATE


def _scalar_problem(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -_INT_BOUND < value < _INT_BOUND else TOO_MANY_DIGITS
    if isinstance(value, float):
        return None if math.isfinite(value) else NON_FINITE
    if isinstance(value, str):
        return text_problem(value)
    return f"not a JSON value (a {type(value).__name__})"


def _key_problem(keys: Iterable[object]) -> str | None:
    for key in keys:
        if not isinstance(key, str):
            return KEY_NOT_TEXT
        found = text_problem(key)
        if found is not None:
            return f"an object key holds {found}"
    return None


_Path: TypeAlias = tuple["_Path", str | int] | None  # (parent, part): a path is rendered only when refused


def _render(node: _Path, root: str) -> str:
    parts: list[str | int] = []
    while node is not None:
        node, part = node
        parts.append(part)
    path = root
    for part in reversed(parts):
        path = join_path(path, part)
    return path


def json_problem(value: object, path: str = "", *, max_depth: int = MAX_JSON_DEPTH) -> JsonProblem | None:
    """The first thing (in document order) that makes ``value`` unfit to store, digest or
    send on: NaN or an infinity (``json.loads`` reads ``1e400`` as infinity), a NUL
    character or an unpaired surrogate in a string or an object key, nesting deeper than
    ``max_depth``, an integer with more than MAX_INT_DIGITS digits, or anything that is
    not JSON (dict with str keys, list or tuple, str, int, float, bool, None). ``path``
    names ``value`` itself. Iterative, so a value nested 100000 deep is refused, not a
    RecursionError."""
    stack: list[tuple[object, int, _Path]] = [(value, 0, None)]
    while stack:
        item, depth, node = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return JsonProblem(_render(node, path), f"nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                bad_key = _key_problem(item)
                if bad_key is not None:
                    return JsonProblem(_render(node, path), bad_key)
                children: list[tuple[object, int, _Path]] = [(v, depth + 1, (node, k)) for k, v in item.items()]
            else:
                children = [(v, depth + 1, (node, i)) for i, v in enumerate(item)]
            stack.extend(reversed(children))
            continue
        reason = _scalar_problem(item)
        if reason is not None:
            return JsonProblem(_render(node, path), reason)
    return None


def require_json(value: object, field: str) -> None:
    """Raise ``RequestInvalid`` naming the path and the reason when ``json_problem``
    finds one in ``value`` (the value of ``field``)."""
    problem = json_problem(value, field)
    if problem is not None:
        raise RequestInvalid(problem.path, problem.reason)


def canonical_json(value: object) -> str:
    """Serialize ``value`` to its canonical JSON text (stable across processes): a JSON
    value (a tuple is an array); anything else raises ``TypeError`` or ``ValueError``."""
    return json.dumps(_normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(value: object) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def chain_digest(previous: str, value: object) -> str:
    """Digest of ``value`` chained onto ``previous``: a history's digest grows by one step
    per message, so a round never re-hashes the whole conversation."""
    return hashlib.sha256(f"{previous}\n{canonical_json(value)}".encode()).hexdigest()


def fits_json(value: object, *, max_depth: int = MAX_JSON_DEPTH) -> TypeGuard[JsonValue]:
    """Whether ``json_problem`` finds nothing in ``value``: what the runtime stores and
    digests (a tuple passes, as the array it encodes to)."""
    return json_problem(value, max_depth=max_depth) is None


# --- reading the runtime's own stored shapes ---------------------------------------------
# What ``to_json`` wrote comes back as JSON; these read a member of the shape it has, and
# read a member of any other shape (never written) as absent.


def str_at(body: JsonMapping, key: str) -> str | None:
    """``body[key]`` when it is a string, else None."""
    value = body.get(key)
    return value if isinstance(value, str) else None


def object_of(value: JsonValue) -> JsonObject:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def objects_at(body: JsonMapping, key: str) -> list[JsonObject]:
    """The objects of the array ``body[key]`` (none when it is absent)."""
    value = body.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []

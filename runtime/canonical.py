"""Canonical JSON and the one digest function every proof and fingerprint uses.

Canonical form: keys sorted, no insignificant whitespace, UTF-8 (not ASCII-escaped),
integral numbers written as integers (``2.0`` -> ``2``, ``1e16`` -> ``10000000000000000``,
taking a float at its shortest decimal form), so that a value does not change digest when
it crosses a JSON encoder or a jsonb column that formats numbers differently. NaN,
infinities and unpaired surrogates have no JSON form: encoding them raises ``ValueError``
(``UnicodeEncodeError`` is one), and ``non_json_path`` names where such a value (or a NUL
character, which jsonb refuses) sits.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from typing import Any

JSON = Any  # a value made of dict / list / str / int / float / bool / None


def _normalize(value: JSON) -> JSON:
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


def non_json_path(value: JSON, path: str = "") -> str | None:
    """The path (``a.b[2]``) of the first value with no canonical JSON form (NaN, an
    infinity, an unpaired surrogate) or that PostgreSQL's jsonb cannot store (a NUL
    character), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, str):
        if "\x00" in value:  # jsonb cannot store a NUL character
            return path
        try:
            value.encode()
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = non_json_path(str(key), path) or non_json_path(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = non_json_path(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def canonical_json(value: JSON) -> str:
    """Serialize ``value`` to its canonical JSON text (stable across processes)."""
    return json.dumps(_normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(value: JSON) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def chain_digest(previous: str, value: JSON) -> str:
    """Digest of ``value`` chained onto ``previous``: a history's digest grows by one step
    per message, so a round never re-hashes the whole conversation."""
    return hashlib.sha256(f"{previous}\n{canonical_json(value)}".encode()).hexdigest()

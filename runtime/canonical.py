"""Canonical JSON and the one digest function every proof and fingerprint uses.

Canonical form: keys sorted, no insignificant whitespace, UTF-8 (not ASCII-escaped),
integral floats written as integers (``2.0`` -> ``2``) so that a value does not change
digest when it crosses a JSON encoder that formats numbers differently.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

JSON = Any  # a value made of dict / list / str / int / float / bool / None


def _normalize(value: JSON) -> JSON:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value


def canonical_json(value: JSON) -> str:
    """Serialize ``value`` to its canonical JSON text (stable across processes)."""
    return json.dumps(
        _normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def digest(value: JSON) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def chain_digest(previous: str, value: JSON) -> str:
    """Digest of ``value`` chained onto ``previous``: a history's digest grows by one step
    per message, so a round never re-hashes the whole conversation."""
    return hashlib.sha256(f"{previous}\n{canonical_json(value)}".encode()).hexdigest()

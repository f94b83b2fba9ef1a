"""The entries of ``AIDAWORK_MODEL_RATE_LIMITS`` and which one a run's model calls obey.

An entry is keyed ``API_KEY_REF/MODEL``: the configured key's name as a run's model
config gives it (``default``, a name from ``AIDAWORK_MODEL_KEYS``, or ``-`` for calls that
send no key), a ``/``, then the provider's model name (which may itself contain ``/``).
Either part may be ``*``. The most specific entry wins: ``ref/model``, then ``ref/*``,
then ``*/model``, then ``*/*``. Each (provider, key, model) the calls use gets its own
bucket of the entry's size: ``team-b/*`` limits every model of key ``team-b`` to the
entry's rates separately, as the providers count (per key and model).

An entry is ``{"requests_per_minute": N, "tokens_per_minute": M}`` (at least one of
them), optionally with ``request_burst`` / ``token_burst``: how much of the rate an idle
bucket may spend at once. The default burst is one second's worth (at least 1): the
providers enforce a per-minute limit over shorter spans too, so a full minute's worth at
once would be refused anyway.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtime.config import KEY_REF_PATTERN
from runtime.models.limits import CallLimitKey

ANY = "*"
NO_KEY = "-"  # the key part of an entry for calls that send no key (api_key_ref null)
MAX_MODEL_CHARS = 256
EXAMPLE = '{"default/gpt-4o-mini": {"requests_per_minute": 60, "tokens_per_minute": 100000}, "team-b/*": {...}}'


class RateLimit(BaseModel):
    """One entry's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1, le=100_000_000)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=100_000_000_000)
    request_burst: int | None = Field(default=None, ge=1, le=100_000_000)
    token_burst: int | None = Field(default=None, ge=1, le=100_000_000_000)

    @model_validator(mode="after")
    def _a_rate(self) -> RateLimit:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("give requests_per_minute, tokens_per_minute or both")
        if self.request_burst is not None and self.requests_per_minute is None:
            raise ValueError("request_burst needs requests_per_minute")
        if self.token_burst is not None and self.tokens_per_minute is None:
            raise ValueError("token_burst needs tokens_per_minute")
        return self

    @property
    def request_capacity(self) -> int:
        """0: requests are not limited."""
        return _capacity(self.requests_per_minute, self.request_burst)

    @property
    def token_capacity(self) -> int:
        return _capacity(self.tokens_per_minute, self.token_burst)


def _capacity(per_minute: int | None, burst: int | None) -> int:
    if per_minute is None:
        return 0
    return burst if burst is not None else max(1, math.ceil(per_minute / 60))


@dataclass(frozen=True)
class Bucket:
    """The limit one run's calls take from: the bucket's name (one per provider, key and
    model, fleet-wide) and the entry that sizes it."""

    name: str
    entry: str
    limit: RateLimit
    max_output_tokens: int


def _check_key(entry: str) -> tuple[str, str]:
    ref, slash, model = entry.partition("/")
    if not slash:
        raise ValueError(f"entry {entry[:80]!r}: expected API_KEY_REF/MODEL (either may be '*'), e.g. default/gpt-4o")
    if ref not in (ANY, NO_KEY) and not re.fullmatch(KEY_REF_PATTERN, ref):
        raise ValueError(
            f"entry {entry[:80]!r}: the key part must be '*', '-' (no key) or a key name matching {KEY_REF_PATTERN}"
        )
    if not model or len(model) > MAX_MODEL_CHARS or any(c.isspace() or not c.isprintable() for c in model):
        raise ValueError(f"entry {entry[:80]!r}: the model part must be '*' or a model name (1-256, no whitespace)")
    return ref, model


def parse_rate_limits(data: object) -> dict[str, RateLimit]:
    """The parsed JSON of ``AIDAWORK_MODEL_RATE_LIMITS`` as {entry: limit}, or a
    ``ValueError`` naming the entry and the field."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object such as {EXAMPLE}")
    limits: dict[str, RateLimit] = {}
    for entry, raw in data.items():
        if not isinstance(entry, str):
            raise ValueError("entry names are strings API_KEY_REF/MODEL")
        _check_key(entry)
        if isinstance(raw, RateLimit):
            limits[entry] = raw
            continue
        try:
            limits[entry] = RateLimit.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            message = str(err["msg"]).removeprefix("Value error, ")
            raise ValueError(f"entry {entry!r}: {where + ': ' if where else ''}{message}") from None
    return limits


class RateLimitRules:
    """The entries, and the bucket a run's calls take from (looked up once per run)."""

    def __init__(self, limits: Mapping[str, RateLimit]) -> None:
        self._limits = {_check_key(entry): (entry, limit) for entry, limit in limits.items()}

    def __bool__(self) -> bool:
        return bool(self._limits)

    def bucket_for(self, key: CallLimitKey | None) -> Bucket | None:
        if key is None:
            return None
        ref = key.api_key_ref if key.api_key_ref is not None else NO_KEY
        for candidate in ((ref, key.model), (ref, ANY), (ANY, key.model), (ANY, ANY)):
            found = self._limits.get(candidate)
            if found is not None:
                entry, limit = found
                return Bucket(f"{key.provider}/{ref}/{key.model}", entry, limit, key.max_output_tokens)
        return None

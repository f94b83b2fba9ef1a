"""The values a context rebuild passes between the core (``runtime.rebuild``, which
chooses and verifies) and the store (``schema.store.rebuilds``, which reads and writes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceMessage:
    """A stored message of the Root as the rebuild sees it."""

    message_id: int
    position: int
    run_id: str
    body: dict[str, object]


@dataclass(frozen=True)
class RebuildCandidate:
    ordinal: int
    source_message_ids: tuple[int, ...]
    last_source_position: int
    source_digest: str
    summary: str
    split: bool


@dataclass(frozen=True)
class ChainBuild:
    build_id: str
    ordinal: int
    consumed: bool


@dataclass(frozen=True)
class ReservationPlan:
    """Take over an unconsumed build of the chain (its reserver died before admitting
    it), or insert the next ordinal."""

    take_build_id: str | None
    ordinal: int
    predecessor_build_id: str | None

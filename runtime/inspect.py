"""What a past round's model saw, rebuilt from the store, and the check of the round's
stored ``messages_digest`` against it (the run inspector's "digest verified").

The context is rebuilt with the very functions the worker builds a round's context with
(``runtime.rebuild.checkpoint_history``, ``runtime.context.loaded_context``), so a
verified digest means: these stored messages are exactly what the model was sent. A
changed stored message (or a changed context-form rule) shows as a mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from runtime.context import loaded_context
from runtime.messages import Message
from runtime.rebuild import checkpoint_history
from schema.wire.claim import LoadedMessage
from schema.wire.inspect import DigestCheck


class RootMessage(Protocol):
    """A stored message of the Root, with the run and round that wrote it."""

    @property
    def run_id(self) -> UUID: ...
    @property
    def boundary_seq(self) -> int: ...
    @property
    def message(self) -> LoadedMessage: ...


@dataclass(frozen=True)
class SeenContext:
    messages: tuple[Message, ...]
    digest: str | None  # None: not recomputed (unchecked)
    check: DigestCheck


def seen_by(stored: Sequence[RootMessage], run_id: UUID, boundary_seq: int) -> list[LoadedMessage]:
    """The stored messages in round ``boundary_seq``'s context: those of the Root's
    earlier runs, and this run's from rounds before it; round 0 also saw the run's input
    (the run's first message), which it appended itself."""
    # A fork's copies of its parent's Root's earlier runs are its own, at boundary -1.
    first = next((m.message.position for m in stored if m.run_id == run_id and m.boundary_seq >= 0), None)
    return [
        m.message
        for m in stored
        if (m.run_id != run_id and (first is None or m.message.position < first))
        or (m.run_id == run_id and (m.boundary_seq < boundary_seq or m.message.position == first))
    ]


def round_context(
    stored: Sequence[RootMessage],
    run_id: UUID,
    boundary_seq: int,
    stored_digest: str,
    *,
    summary: str | None,
    max_output_bytes: int,
    current_from: int,
) -> SeenContext:
    """Round ``boundary_seq``'s context under the run's checkpoint (``summary``, and
    ``stored`` from its start position), checked against ``stored_digest``. A round
    before ``current_from`` (the round the checkpoint was admitted at) ran under a context
    a later rebuild replaced: it is shown but not checked."""
    history, start = checkpoint_history(summary)
    loaded, digest = loaded_context(seen_by(stored, run_id, boundary_seq), max_output_bytes, start)
    if boundary_seq < current_from:
        return SeenContext(history + loaded, None, "unchecked")
    return SeenContext(history + loaded, digest, "verified" if digest == stored_digest else "mismatch")

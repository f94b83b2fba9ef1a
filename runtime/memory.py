"""Conversation memory: the per-process cache of each run's model context.

A round on a warm worker loads only the messages committed since it last saw the run
(``last_position``), and the history's digest grows by chaining, so round 500 costs
about what round 5 does. The database stays the source of truth: a cold worker loads
the whole history once, and an entry is only ever extended with committed messages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from runtime.messages import Message


@dataclass(frozen=True)
class RunMemory:
    run_id: UUID
    input: str
    prepared: Any  # runtime.prepare.PreparedExecution (typed loosely to avoid a cycle)
    # The model's context: the rebuild summary (if any), then the Root's messages from
    # ``context_start`` on, in context form.
    history: tuple[Message, ...]
    # Position of the last message in ``history`` within its Root (-1: none yet).
    last_position: int
    # Chain digest of ``history`` ("" for an empty history).
    history_digest: str
    # The run's checkpoint this context was built from (advanced by context rebuilds).
    context_start: int = 0
    summary: str | None = None
    last_build_id: Any = None
    chain_anchor: int | None = None

    def extended(self, messages: tuple[Message, ...], last_position: int, history_digest: str) -> RunMemory:
        if not messages:
            return self
        return replace(
            self, history=self.history + messages, last_position=last_position, history_digest=history_digest
        )

    def positional(self) -> tuple[Message, ...]:
        """The Root's messages in the context (without the summary): the i-th has
        position ``context_start + i``."""
        return self.history[1:] if self.summary is not None else self.history


class ContextCache:
    """A bounded, thread-safe LRU of ``RunMemory`` by run id."""

    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[UUID, RunMemory] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: UUID) -> RunMemory | None:
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is not None:
                self._entries.move_to_end(run_id)
            return entry

    def put(self, entry: RunMemory) -> None:
        with self._lock:
            current = self._entries.get(entry.run_id)
            # Never replace a longer history with a shorter one (two threads racing).
            if current is not None and current.last_position > entry.last_position:
                return
            self._entries[entry.run_id] = entry
            self._entries.move_to_end(entry.run_id)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def discard(self, run_id: UUID) -> None:
        with self._lock:
            self._entries.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._entries)

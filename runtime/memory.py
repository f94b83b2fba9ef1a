"""Conversation memory: the per-process cache of each run's model context.

A round on a warm worker loads only the messages committed since it last saw the run
(``last_position``), and the history's digest grows by chaining, so round 500 costs
about what round 5 does. The database stays the source of truth: a cold worker loads
the whole history once, and an entry is only ever extended with committed messages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from uuid import UUID

from runtime.state import RunState


class ContextCache:
    """A bounded, thread-safe LRU of ``RunState`` by run id."""

    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[UUID, RunState] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: UUID) -> RunState | None:
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is not None:
                self._entries.move_to_end(run_id)
            return entry

    def put(self, entry: RunState) -> None:
        run_id = entry.run_id
        assert run_id is not None, "only a claimed run's state is cached"
        with self._lock:
            current = self._entries.get(run_id)
            # Never replace a longer history with a shorter one (two threads racing).
            if current is not None and current.last_position > entry.last_position:
                return
            self._entries[run_id] = entry
            self._entries.move_to_end(run_id)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def discard(self, run_id: UUID) -> None:
        with self._lock:
            self._entries.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._entries)

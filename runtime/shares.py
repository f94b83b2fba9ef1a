"""Fair share across owners and priorities within an owner, as a routing rule: which of
the fleet's round queues a round goes to, and at which broker priority.

Every worker consumes all ``queues`` round queues, and the broker hands out one message
per turn from each non-empty queue in rotation (``worker.engine.broker``). An owner's rounds go
to its ``weight`` consecutive queues, starting at a stable hash of the owner, so with
backlogs everywhere an owner of weight 3 gets about three turns for another's one, and an
owner's backlog, however long, holds one turn per rotation per queue, never the fleet.
Two owners whose queues overlap share those queues FIFO: size ``queues`` well above the
sum of the weights of the owners busy at once. A weight above ``queues`` counts as
``queues``.

Pure and stable: the same inputs give the same queue in every process (crc32, never
Python's salted ``hash``), so a re-send goes where the first send went."""

from __future__ import annotations

import zlib
from uuid import UUID

from schema.wire.route import MAX_PRIORITY, MIN_PRIORITY, Route


def owner_queues(owner: str, weight: int, queues: int) -> list[int]:
    """The queues (indices in 0..queues-1) the owner's rounds are spread over."""
    base = zlib.crc32(owner.encode()) % queues
    return [(base + k) % queues for k in range(max(1, min(weight, queues)))]


def queue_index(route: Route, run_id: UUID, boundary_seq: int, queues: int) -> int:
    """The queue of one round (or resume) of a run: one of its owner's queues, the next
    one at each boundary and starting elsewhere for each run, so an owner's backlog fills
    all its queues."""
    mine = owner_queues(route.owner, route.weight, queues)
    return mine[(zlib.crc32(run_id.bytes) + boundary_seq) % len(mine)]


def broker_priority(priority: int) -> int:
    """The message priority for a run's ``priority`` (9 the most urgent): kombu's Redis
    transport serves a queue's lowest number first, so the scale is turned over."""
    return MAX_PRIORITY - max(MIN_PRIORITY, min(MAX_PRIORITY, priority))

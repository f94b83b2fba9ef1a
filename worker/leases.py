"""The lease keeper: one heartbeat thread per worker process extends the lease of every
round the process holds, in one statement, every ``lease_s / 3``. A paused or dead
process stops heartbeating, its leases expire, and the reconciler hands its runs on.

The heartbeat reads its holdings, then writes: a round may commit (or give its claim
back) in between. That is safe because the statement only extends a lease that still
exists under the same fence (``schema.store.leases``): a commit or a release leaves none,
so a late heartbeat cannot re-arm it and refuse the next round's claim."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

import structlog
from sqlalchemy import Engine

from schema.store.leases import extend_leases

log = structlog.get_logger("aidawork.leases")


class LeaseKeeper:
    def __init__(self, engine: Engine, *, lease_s: float, interval_s: float) -> None:
        self._engine = engine
        self._lease_s = lease_s
        self._interval_s = interval_s
        self._held: dict[UUID, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def holding(self, run_id: UUID, fence: int) -> Iterator[None]:
        with self._lock:
            self._held[run_id] = fence
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="aidawork-leases", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                if self._held.get(run_id) == fence:
                    del self._held[run_id]

    def beat_once(self) -> None:
        with self._lock:
            holdings = list(self._held.items())
        if not holdings:
            return
        kept = extend_leases(self._engine, holdings, self._lease_s)
        with self._lock:
            # A round that left ``holding`` since the snapshot gave its lease back itself.
            lost = [(r, f) for r, f in holdings if r not in kept and self._held.get(r) == f]
        for run_id, fence in lost:
            log.warning("lease_lost", run_id=str(run_id), claim_fence=fence)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.beat_once()
            except Exception:  # the next beat tries again; a round's commit is fenced anyway
                log.exception("lease_heartbeat_failed")

    def stop(self) -> None:
        self._stop.set()

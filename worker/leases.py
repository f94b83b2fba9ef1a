"""The lease keeper: one heartbeat thread per worker process extends the lease of every
round the process holds, in one statement, every ``lease_s / 3``. A paused or dead
process stops heartbeating, its leases expire, and the reconciler hands its runs on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

import structlog
from sqlalchemy import Engine

from schema.store.runs import extend_leases

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
        for run_id, fence in holdings:
            if run_id not in kept:
                log.warning("lease_lost", run_id=str(run_id), claim_fence=fence)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.beat_once()
            except Exception:  # the next beat tries again; a round's commit is fenced anyway
                log.exception("lease_heartbeat_failed")

    def stop(self) -> None:
        self._stop.set()

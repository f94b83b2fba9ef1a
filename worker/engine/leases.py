"""The lease keeper: one heartbeat thread per worker process extends the lease of every
round the process holds, in one statement, every ``lease_s / 3``. A paused or dead
process stops heartbeating, its leases expire, and the reconciler hands its runs on.

The keeper is also the process's entry in the workers registry (``schema.store.workers``):
it registers the process once (at start-up for ``aidawork worker``, else at its first
claim), and from then on heartbeats the process every ``interval_s``
(AIDAWORK_WORKER_HEARTBEAT_S), holding rounds or not, until ``stop`` says it stopped on
purpose. The leases ride on those beats, in the same statement, once every ``renew_s``:
beating the registry often is one small row per process, while extending every lease each
second would rewrite every run in flight. So a worker that dies is seen to die within
seconds (beat then hands its runs on without waiting for their leases,
``schema.store.leases.take_over_dead_holders``), idle or not, which is also what lets a
claim tell a storm of deaths from a round that kills its workers.

The heartbeat reads its holdings, then writes: a round may commit (or give its claim
back) in between. That is safe because the statement only extends a lease that still
exists under the same fence (``schema.store.leases``): a commit or a release leaves none,
so a late heartbeat cannot re-arm it and refuse the next round's claim.

The keeper also holds the process to the schema's compatibility level
(``schema.store.compat``): the registration is refused when the schema needs newer code,
and every heartbeat re-reads the level. Once refused, ``worker_id`` raises
``SchemaIncompatible`` (so no claim is made: the round's message is sent again, for a
newer worker) and the ``on_incompatible`` callback runs once (``aidawork worker``: a warm
shutdown). Rounds already claimed finish and commit under their fences."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from uuid import UUID

import structlog
from sqlalchemy import Engine

from schema.store import workers as worker_store
from schema.store.compat import CODE_LEVEL, SchemaIncompatible, schema_level, too_old
from schema.store.leases import extend_leases

log = structlog.get_logger("aidawork.leases")


class LeaseKeeper:
    def __init__(self, engine: Engine, *, lease_s: float, interval_s: float, renew_s: float | None = None) -> None:
        """``interval_s``: between heartbeats; ``renew_s``: between extensions of the held
        leases (every heartbeat when not given, and never less often than that)."""
        self._engine = engine
        self._lease_s = lease_s
        self._interval_s = interval_s if renew_s is None else min(interval_s, renew_s)
        self._renew_s = self._interval_s if renew_s is None else renew_s
        self._renewed_at = time.monotonic()
        self._held: dict[UUID, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker_id: UUID | None = None
        self._unreleased: dict[UUID, int] = {}
        self._refused: SchemaIncompatible | None = None
        self._on_incompatible: Callable[[], None] | None = None

    def on_incompatible(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when the schema turns out to need newer code than this."""
        with self._lock:
            self._on_incompatible = callback

    def remember_unreleased(self, run_id: UUID, fence: int) -> None:
        """A claim this process gave up for an unavailable dependency but could not release
        (the database was down): its next claim of the run may take it back at once,
        without waiting for the lease to run out and without spending an attempt."""
        with self._lock:
            self._unreleased[run_id] = fence

    def take_unreleased(self, run_id: UUID) -> int | None:
        with self._lock:
            return self._unreleased.pop(run_id, None)

    @property
    def worker_id(self) -> UUID:
        """This process in the workers registry: what its claims name as their holder."""
        return self.register()

    def register(self) -> UUID:
        """Register the process (once; later calls return the same id) and start the
        heartbeat, which keeps the registration alive from then on. ``SchemaIncompatible``
        when the schema needs newer code than this, now or since."""
        refused = None
        with self._lock:
            if self._refused is None and self._worker_id is None:
                name = f"aidawork-{os.getpid()}@{socket.gethostname()}"
                try:
                    self._worker_id = worker_store.register_worker(self._engine, name, heartbeat_s=self._interval_s)
                except SchemaIncompatible as exc:
                    refused = exc
                else:
                    log.info("worker_registered", worker_id=str(self._worker_id), name=name, code_level=CODE_LEVEL)
                    self._start_locked()
            worker_id = self._worker_id
        if refused is not None:
            self._refuse(refused)
        if self._refused is not None:
            raise self._refused
        assert worker_id is not None
        return worker_id

    def check_schema_level(self) -> None:
        """Refuse from now on if the schema needs a higher level than this code's (a breaking
        migration was applied under this worker, with ``aidawork migrate --force``)."""
        with self._lock:
            if self._worker_id is None or self._refused is not None:
                return
        try:
            needed = schema_level(self._engine)
        except SchemaIncompatible as exc:  # the table is gone: a downgrade below 0021
            self._refuse(exc)
            return
        if needed > CODE_LEVEL:
            self._refuse(too_old(needed))

    def _refuse(self, exc: SchemaIncompatible) -> None:
        with self._lock:
            if self._refused is not None:
                return
            self._refused = exc
            callback = self._on_incompatible
        log.error("schema_level_refused", code_level=exc.code_level, schema_level=exc.schema_level, error=exc.message)
        if callback is not None:
            callback()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="aidawork-leases", daemon=True)
            self._thread.start()

    @contextmanager
    def holding(self, run_id: UUID, fence: int) -> Iterator[None]:
        with self._lock:
            self._held[run_id] = fence
            self._start_locked()
        try:
            yield
        finally:
            with self._lock:
                if self._held.get(run_id) == fence:
                    del self._held[run_id]

    def beat_once(self, *, renew: bool = True) -> None:
        """Heartbeat the process; ``renew``: extend the held leases in the same statement."""
        with self._lock:
            holdings = list(self._held.items()) if renew else []
            worker_id = self._worker_id
        if not holdings and worker_id is None:
            return
        kept = extend_leases(self._engine, holdings, self._lease_s, worker_id=worker_id)
        with self._lock:
            # A round that left ``holding`` since the snapshot gave its lease back itself.
            lost = [(r, f) for r, f in holdings if r not in kept and self._held.get(r) == f]
        for run_id, fence in lost:
            log.warning("lease_lost", run_id=str(run_id), claim_fence=fence)

    def _renew_due(self) -> bool:
        # Half a heartbeat early rather than one heartbeat late: a lease is extended at
        # most ``renew_s`` after the last extension, whatever the phase of the beats.
        return time.monotonic() - self._renewed_at >= self._renew_s - self._interval_s / 2

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            renew = self._renew_due()
            try:
                self.beat_once(renew=renew)
            except Exception:  # the next beat tries again; a round's commit is fenced anyway
                log.exception("lease_heartbeat_failed")
                continue
            if not renew:
                continue
            self._renewed_at = time.monotonic()
            try:  # as often as the leases: a level raised under the worker is rare
                self.check_schema_level()
            except Exception as exc:  # the database is unavailable: the next beat reads it again
                log.warning("schema_level_unread", error=type(exc).__name__)

    def stop(self) -> None:
        """Stop heartbeating; a registered process records that it stopped on purpose."""
        self._stop.set()
        with self._lock:
            worker_id = self._worker_id
        if worker_id is None:
            return
        try:
            worker_store.stop_worker(self._engine, worker_id)
        except Exception as exc:  # its silence will read as a death: it excuses, never charges
            log.warning("worker_stop_unrecorded", worker_id=str(worker_id), error=type(exc).__name__)

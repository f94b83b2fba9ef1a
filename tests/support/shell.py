"""The worker shell without services: a ``WorkerContext`` whose store is the in-memory
double (``tests.support.memory_store``), whose lease keeper and dispatcher are the fakes
below, and whose engine refuses to be touched. Rounds run in the real runtime (the
scripted model), through the real ``worker.engine.round`` / ``worker.engine.resume`` / ``worker.engine.rebuild``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

from kombu.exceptions import OperationalError as BrokerUnreachable

from runtime.prepare import prepare_execution
from schema.wire import OriginalToolRoundResume, RoundTask
from schema.wire.route import Route
from tests.support.memory_store import InMemoryStore
from tests.support.requests import scripted_request
from worker.client.context import runtime_for
from worker.engine.bootstrap import WorkerContext
from worker.engine.resume import execute_resume
from worker.engine.round import execute_round
from worker.ops.deltas import RunDelta
from worker.ops.settings import Settings


class EngineTouched(AssertionError):
    pass


class NoEngine:
    """Stands where the engine was: the shell must reach the database only through
    ``ctx.store``, so any use of the engine fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise EngineTouched(f"the shell used ctx.engine.{name} instead of ctx.store")


class FakeLeaseKeeper:
    """Records the claims held (``holding``) instead of heartbeating them."""

    def __init__(self) -> None:
        self.worker_id: UUID = uuid4()
        self.held: dict[UUID, int] = {}
        self.holdings: list[tuple[UUID, int]] = []  # every (run, fence) ever held, in order
        self.unreleased: dict[UUID, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def holding(self, run_id: UUID, fence: int) -> Iterator[None]:
        with self._lock:
            self.held[run_id] = fence
            self.holdings.append((run_id, fence))
        try:
            yield
        finally:
            with self._lock:
                if self.held.get(run_id) == fence:
                    del self.held[run_id]

    def remember_unreleased(self, run_id: UUID, fence: int) -> None:
        with self._lock:
            self.unreleased[run_id] = fence

    def take_unreleased(self, run_id: UUID) -> int | None:
        with self._lock:
            return self.unreleased.pop(run_id, None)

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class Sent:
    kind: str  # "round" or "resume"
    run_id: UUID
    boundary_seq: int
    resumes: tuple[OriginalToolRoundResume, ...] = ()
    # How it was routed (runtime.shares); left out of equality: tests of what is sent
    # compare the task, test_round_shell's routing tests the route.
    route: Route | None = field(default=None, compare=False)


@dataclass
class FakeDispatcher:
    """Records each task sent; with ``down`` set, every send raises as kombu does once its
    publish retries against an unreachable broker are spent."""

    sent: list[Sent] = field(default_factory=list)
    down: bool = False
    attempts: int = 0

    def _send(self, sent: Sent) -> None:
        self.attempts += 1
        if self.down:
            raise BrokerUnreachable("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        self.sent.append(sent)

    def round(self, run_id: UUID, boundary_seq: int, route: Route) -> None:
        self._send(Sent("round", run_id, boundary_seq, route=route))

    def resume(self, resumes: Sequence[OriginalToolRoundResume], route: Route) -> None:
        self._send(Sent("resume", resumes[0].run_id, resumes[0].boundary_seq, tuple(resumes), route))


@dataclass(frozen=True)
class Shell:
    """A context on fakes, and the fakes themselves (typed, for the assertions)."""

    ctx: WorkerContext
    store: InMemoryStore
    leases: FakeLeaseKeeper
    dispatch: FakeDispatcher

    def submit(self, turns: list[dict[str, Any]], *, trace_context: str | None = None, **kwargs: Any) -> UUID:
        """Store a run as ``worker.client.submit`` would (validated), without sending."""
        request, prepared = prepare_execution(self.ctx.runtime, scripted_request(turns, **kwargs))
        return self.store.submit_run(request, prepared.turn_config.model_dump(mode="json"), trace_context).run_id

    def deliver_sent(self, *, max_tasks: int = 50) -> list[str]:
        """Execute every task sent (and those they send) in order, as workers would; the
        dispositions, in order."""
        done: list[str] = []
        while self.dispatch.sent:
            assert len(done) < max_tasks, f"still sending tasks after {max_tasks}: {self.dispatch.sent}"
            task = self.dispatch.sent.pop(0)
            if task.kind == "round":
                disposition = execute_round(self.ctx, RoundTask(run_id=task.run_id, boundary_seq=task.boundary_seq))
            else:
                disposition = execute_resume(self.ctx, list(task.resumes))
            done.append(disposition.value)
        return done


@dataclass
class RecordingDeltas:
    """A delta sink that keeps what the worker published, by run."""

    published: list[tuple[UUID, RunDelta]] = field(default_factory=list)

    flushes: int = 0

    def publish(self, run_id: UUID, delta: RunDelta) -> None:
        self.published.append((run_id, delta))

    def flush(self, timeout_s: float) -> None:
        self.flushes += 1


def shell(**settings: Any) -> Shell:
    store, leases, dispatch = InMemoryStore(), FakeLeaseKeeper(), FakeDispatcher()
    config = Settings(dev=True, lease_s=30, **settings)
    ctx = WorkerContext(
        settings=config,
        engine=NoEngine(),  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        runtime=runtime_for(config),
        dispatch=dispatch,  # type: ignore[arg-type]
        leases=leases,  # type: ignore[arg-type]
        deltas=RecordingDeltas(),
    )
    return Shell(ctx, store, leases, dispatch)

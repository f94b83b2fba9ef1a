"""``InMemoryStore``: the store operations of ``schema.store.store.Store`` over plain dicts,
so the worker shell (``worker.engine.round``, ``worker.engine.resume``, ``worker.engine.rebuild``) runs in unit
tests without PostgreSQL (after procrastinate's ``InMemoryConnector``).

It keeps the guarantees the shell relies on, statement by statement as the SQL does them:
a claim bumps the fence and is refused (``None``) unless the run is at the boundary, not
ended or suspended, not leased by a live holder (or the caller's own unreleased claim),
first in its Root and (for a round) has no round stored there - (for a resume) exactly
the suspension named; a round's claim hands back the latest succeeded call's response at
its boundary (and then starts the execution); every write after a claim is fenced and raises ``FenceLost`` having
written nothing; a commit stores the round, its messages (tool results kept once, in the
tool row), tool rows and events and moves the boundary and the status. One lock guards
the state: the shell calls it from several threads. There is no workers registry, so a
dead holder's death is never excused by deaths elsewhere (as for a holder the registry
does not know). ``tests/db/test_memory_store_parity.py`` drives it and the real store
through the same sequence, so it cannot drift silently. Besides the ``Store`` methods it
has what tests need to set a scene: ``submit_run``, deliveries, ``expire_lease``,
``snapshot``. Its parts: ``memory_state`` (rows and shared helpers), ``memory_suspensions``,
``memory_rebuilds``."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any
from uuid import UUID, uuid4

from schema.store.claims import CHANGED_SINCE_CLAIM, ClaimRefusal, RefusedRun
from schema.store.errors import FenceLost, RootNotFound, ToolCallIdReused
from schema.store.leases import Due
from schema.store.port import StorePort
from schema.store.runs import Submitted
from schema.wire import RunRequest, RunStatus
from schema.wire.claim import Checkpoint, Claim, LoadedMessage, StoredRound
from schema.wire.json import JsonMapping
from schema.wire.record import Committed, RoundRecord, ToolInvocationRecord
from schema.wire.route import DEFAULT_WEIGHT, Route
from tests.support.memory_budgets import BudgetOps
from tests.support.memory_rebuilds import RebuildOps
from tests.support.memory_state import ACTIVE, CheckpointRow, RunRow, as_json, without_result
from tests.support.memory_suspensions import SuspensionOps


class InMemoryStore(SuspensionOps, RebuildOps, BudgetOps):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.RLock()
        self._now = clock
        self.roots: dict[UUID, dict[str, Any]] = {}
        self.runs: dict[UUID, RunRow] = {}
        self.checkpoints: dict[UUID, CheckpointRow] = {}
        self.rounds: dict[tuple[UUID, int], dict[str, Any]] = {}
        self.tool_invocations: list[dict[str, Any]] = []  # in id order
        self.messages: list[dict[str, Any]] = []  # in id order
        self.events: list[dict[str, Any]] = []
        self.model_calls: list[dict[str, Any]] = []  # ids ascending, as the table's identity
        self.local_reads: dict[tuple[UUID, str, str], dict[str, Any]] = {}
        self.prerequisites: dict[tuple[UUID, str], Any] = {}
        self.answers: dict[tuple[UUID, str], tuple[str, Any]] = {}
        self.executions: dict[tuple[UUID, str], dict[str, Any]] = {}
        self.builds: dict[UUID, dict[str, Any]] = {}
        self.consumptions: dict[UUID, dict[str, Any]] = {}
        self.budgets: dict[str, dict[str, Any]] = {}  # owner -> budget and its one window's spend
        self.calls: list[str] = []  # every Store method called, in order (fakes record their calls)
        self.weights: dict[str, int] = {}  # owners.weight, for the owners that have a row
        self.webhook_urls: dict[UUID, str] = {}  # runs.webhook_url, for the runs that have one

    # --- setting a scene ------------------------------------------------------------------

    def submit_run(self, request: RunRequest, config: dict[str, Any], trace_context: str | None = None) -> Submitted:
        with self._lock:
            if request.root_id is None:
                root_id = uuid4()
                self.roots[root_id] = {"owner": request.owner, "next_run_seq": 0}
            else:
                root_id = request.root_id
                if root_id not in self.roots or self.roots[root_id]["owner"] != request.owner:
                    raise RootNotFound(root_id, request.owner)
            root_seq = self.roots[root_id]["next_run_seq"]
            self.roots[root_id]["next_run_seq"] += 1
            run_id = uuid4()
            earlier = [r for r in self.runs.values() if r.root_id == root_id and r.root_seq < root_seq]
            previous = self.checkpoints[max(earlier, key=lambda r: r.root_seq).id] if earlier else CheckpointRow()
            self.runs[run_id] = RunRow(
                run_id, root_id, root_seq, request.owner, request.input, as_json(config), dispatched_at=self._now(),
                trace_context=trace_context, priority=request.priority,
            )
            self.checkpoints[run_id] = CheckpointRow(previous.context_start_position, previous.summary)
            self._event(run_id, 1, "run_queued", {"root_id": str(root_id), "root_seq": root_seq})
            route = Route(request.owner, self.weights.get(request.owner, DEFAULT_WEIGHT), request.priority)
            return Submitted(run_id=run_id, root_id=root_id, root_seq=root_seq, route=route)

    def route_of(self, run_id: UUID, owner: str | None = None) -> Route:
        with self._lock:
            self.calls.append("route_of")
            run = self.runs.get(run_id)
            if run is None:
                return Route(owner or "")
            return Route(run.owner, self.weights.get(run.owner, DEFAULT_WEIGHT), run.priority)

    def due_of(self, run_id: UUID, owner: str | None = None) -> Due:
        route = self.route_of(run_id, owner)
        with self._lock:
            run = self.runs.get(run_id)
            if run is None:
                return Due(run_id, 0, False, route)
            return Due(run_id, run.boundary_seq, (run_id, run.boundary_seq) in self.rounds, route)

    def expire_lease(self, run_id: UUID) -> None:
        """The holder died: its lease runs out."""
        with self._lock:
            run = self.runs[run_id]
            if run.lease_expires_at is not None:
                run.lease_expires_at = self._now() - 1

    def snapshot(self) -> dict[str, Any]:
        """Every piece of state, copied: equal snapshots mean nothing was written."""
        with self._lock:
            return copy.deepcopy({k: v for k, v in vars(self).items() if not k.startswith("_") and k != "calls"})

    def run(self, run_id: UUID) -> RunRow:
        with self._lock:
            return copy.deepcopy(self.runs[run_id])

    # --- claims ---------------------------------------------------------------------------

    def claim_round(
        self,
        run_id: UUID,
        boundary_seq: int,
        *,
        lease_s: float,
        after_position: int,
        cold: bool,
        holder: UUID,
        resume_of: list[str] | None = None,
        held_fence: int | None = None,
        start_call_digest: str | None = None,
    ) -> Claim | None:
        with self._lock:
            self.calls.append("claim_round")
            held = -1 if held_fence is None else held_fence
            run = self.runs.get(run_id)
            if run is None or not self._claimable(run, boundary_seq, held, resume_of):
                return None
            if run.execution_fence == run.claim_fence and run.claim_fence != held:
                run.round_attempts += 1
            if run.lease_expires_at is not None and run.claim_fence != held:
                run.round_claims += 1  # its holder died (no registry here: never excused)
            run.claim_fence += 1
            run.lease_expires_at = self._now() + lease_s
            run.status = "running"
            recorded = self._recorded(run_id, boundary_seq) if resume_of is None else None
            # A resume, or a round with an accepted response to go on from, executes at once.
            run.execution_fence = None if resume_of is None and recorded is None else run.claim_fence
            started_call_id = None
            if resume_of is None and recorded is None and start_call_digest is not None and not self.budgets.get(
                run.owner
            ):
                run.execution_fence = run.claim_fence  # a warm claim starts the round's call
                started_call_id = self._new_call(run_id, boundary_seq, run.round_attempts + 1, run.claim_fence,
                                                 start_call_digest, reserved=None)
            run.round_holders.append(holder)
            run.dispatched_at = self._now()
            cp = self.checkpoints[run_id]
            previous = self.rounds.get((run_id, boundary_seq - 1))
            after = max(after_position, cp.context_start_position - 1)
            return Claim(
                run_id=run.id,
                root_id=run.root_id,
                owner=run.owner,
                fence=run.claim_fence,
                boundary_seq=boundary_seq,
                attempt=run.round_attempts + 1,
                claims=run.round_claims,
                input=run.input if cold else None,
                config=copy.deepcopy(run.config) if cold else None,
                new_messages=tuple(m for m in self._loaded(run.root_id) if m.position > after),
                previous_fingerprint=previous["tool_fingerprint"] if previous else None,
                previous_repeat_count=previous["repeat_count"] if previous else 0,
                previous_round=StoredRound(**previous["stored"]) if previous else None,
                checkpoint=Checkpoint(cp.context_start_position, cp.summary, cp.last_build_id, cp.chain_anchor),
                recorded_response=recorded,
                trace_context=run.trace_context,
                queue_lag_s=max(0.0, self._now() - previous["committed_at"]) if previous else None,
                weight=self.weights.get(run.owner, DEFAULT_WEIGHT),
                priority=run.priority,
                earlier_model_calls=sum(
                    1
                    for c in self.model_calls
                    if (c["run_id"], c["boundary_seq"]) == (run_id, boundary_seq) and c["claim_fence"] < run.claim_fence
                ),
                started_call_id=started_call_id,
            )

    def _claimable(self, run: RunRow, boundary_seq: int, held: int, resume_of: list[str] | None) -> bool:
        if run.boundary_seq != boundary_seq or run.status not in ("queued", "running"):
            return False
        if not (run.lease_expires_at is None or run.lease_expires_at < self._now() or run.claim_fence == held):
            return False
        if self._earlier_active(run):
            return False
        stored = self.rounds.get((run.id, run.boundary_seq))
        if resume_of is None:
            return stored is None
        suspended = sorted(
            t["invocation_id"]
            for t in self.tool_invocations
            if t["run_id"] == run.id and t["boundary_seq"] == run.boundary_seq and t["status"] == "suspended"
        )
        return (
            stored is not None and stored["outcome"] == "suspend" and bool(suspended) and suspended == sorted(resume_of)
        )

    def _earlier_active(self, run: RunRow) -> bool:
        return any(
            r.root_id == run.root_id and r.root_seq < run.root_seq and r.status in ACTIVE for r in self.runs.values()
        )

    def _next_in_root(self, run: RunRow) -> UUID | None:
        queued = [r for r in self.runs.values() if r.root_id == run.root_id and r.root_seq > run.root_seq]
        queued = [r for r in queued if r.status == "queued"]
        return min(queued, key=lambda r: r.root_seq).id if queued else None

    def _loaded(self, root_id: UUID) -> list[LoadedMessage]:
        out = []
        for m in sorted((m for m in self.messages if m["root_id"] == root_id), key=lambda m: m["position"]):
            reads = None
            if m["body"].get("role") == "tool" and m["body"].get("name") == "read_files":
                found = {
                    path: r["content"]
                    for (run, call, path), r in self.local_reads.items()
                    if run == m["run_id"] and call == m["body"].get("tool_call_id")
                }
                reads = found or None
            out.append(LoadedMessage(m["position"], self._body(m["run_id"], m["body"]), reads))
        return out

    def load_messages(self, root_id: UUID, from_position: int) -> tuple[LoadedMessage, ...]:
        with self._lock:
            self.calls.append("load_messages")
            return tuple(m for m in self._loaded(root_id) if m.position >= from_position)

    def explain_refused_claim(self, run_id: UUID, boundary_seq: int, *, resume: bool) -> ClaimRefusal:
        with self._lock:
            self.calls.append("explain_refused_claim")
            r = self.runs.get(run_id)
            if r is None:
                return ClaimRefusal(False, "run_not_found", None)
            stored = (run_id, r.boundary_seq) in self.rounds
            leased = r.lease_expires_at is not None and r.lease_expires_at > self._now()
            # This store models no owner cap and no root_policy: no slot to wait for, no interrupt.
            run = RefusedRun(
                status=r.status, boundary_seq=r.boundary_seq, claim_fence=r.claim_fence, leased=leased,
                earlier_active=self._earlier_active(r), interrupt_pending=False, at_capacity=False,
                waits_for_slot=False, round_stored=stored,
            )
            if RunStatus(r.status).terminal:
                return ClaimRefusal(True, "run_ended", run)
            checks = [
                (r.boundary_seq != boundary_seq, "run_at_another_boundary"),
                (r.status == "suspended", "run_suspended"),
                (leased, "leased_by_live_holder"),
                (run["earlier_active"], "earlier_run_of_root_active"),
                (stored and not resume, "round_awaits_resume"),
                (resume and not stored, "suspended_round_gone"),
            ]
            return ClaimRefusal(False, next((why for failed, why in checks if failed), CHANGED_SINCE_CLAIM), run)

    # --- rounds and the model-call ledger -------------------------------------------------

    def record_model_call_started(
        self, run_id: UUID, boundary_seq: int, attempt: int, fence: int, request_digest: str,
        estimate_tokens: int = 0,
    ) -> int:
        with self._lock:
            self.calls.append("record_model_call_started")
            run = self._held(run_id, fence, status=None)
            run.execution_fence = fence
            reserved = self._reserve(run_id, run.owner, estimate_tokens)
            return self._new_call(run_id, boundary_seq, attempt, fence, request_digest,
                                  reserved=estimate_tokens if reserved else None)

    def _new_call(
        self, run_id: UUID, boundary_seq: int, attempt: int, fence: int, request_digest: str, *, reserved: int | None
    ) -> int:
        call_id = max((c["id"] for c in self.model_calls), default=0) + 1
        self.model_calls.append(
            {
                "id": call_id,
                "run_id": run_id,
                "boundary_seq": boundary_seq,
                "attempt": attempt,
                "claim_fence": fence,
                "status": "started",
                "request_digest": request_digest,
                "response_digest": None,
                "response": None,
                "input_tokens": None,
                "output_tokens": None,
                "error_code": None,
                "stale": False,
                "reserved_tokens": reserved,
                "reservation_open": reserved is not None,
            }
        )
        return call_id

    def record_model_call_finished(
        self,
        call_id: int,
        run_id: UUID,
        fence: int,
        *,
        response_digest: str | None,
        input_tokens: int | None,
        output_tokens: int | None,
        error_code: str | None,
        response: JsonMapping | None = None,
        request_digest: str | None = None,
    ) -> None:
        with self._lock:
            self.calls.append("record_model_call_finished")
            call = next((c for c in self.model_calls if c["id"] == call_id), None)
            if call is None or (call["run_id"], call["claim_fence"], call["status"]) != (run_id, fence, "started"):
                raise FenceLost(run_id, fence)  # not this holder's started call: nothing written
            run = self.runs.get(run_id)
            call.update(
                status="failed" if error_code else "succeeded",
                request_digest=request_digest or call["request_digest"],
                response_digest=response_digest,
                response=None if error_code or response is None else as_json(response),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                error_code=error_code,
                stale=run is None or run.claim_fence != fence,
            )
            if run is not None:
                self._settle(run.owner, call, (input_tokens or 0) + (output_tokens or 0))
            if call["stale"]:
                raise FenceLost(run_id, fence)

    def drop_unused_model_call(self, call_id: int, run_id: UUID, fence: int) -> None:
        with self._lock:
            self.calls.append("drop_unused_model_call")
            self.model_calls = [
                c for c in self.model_calls
                if (c["id"], c["run_id"], c["claim_fence"], c["status"]) != (call_id, run_id, fence, "started")
            ]

    def commit_round(self, record: RoundRecord) -> Committed:
        with self._lock:
            self.calls.append("commit_round")
            run = self.runs.get(record.run_id)
            if run is None or (run.claim_fence, run.boundary_seq, run.status) != (
                record.fence,
                record.boundary_seq,
                "running",
            ):
                raise FenceLost(record.run_id, record.fence)
            tools = [as_json({f.name: getattr(t, f.name) for f in fields(ToolInvocationRecord)}) for t in record.tools]
            if not record.resumed:
                ids = [t["tool_call_id"] for t in tools]
                known = {t["tool_call_id"] for t in self.tool_invocations if t["run_id"] == run.id}
                if len(set(ids)) != len(ids) or known & set(ids):
                    raise ToolCallIdReused(run.id)
            taken = {m["position"] for m in self.messages if m["root_id"] == run.root_id}
            assert not taken & {m.position for m in record.messages}, "a message position stored twice"
            self._write_round(run, record, tools)
            for call in self.model_calls:  # committed, the accepted response lives in the messages
                if (call["run_id"], call["boundary_seq"]) == (run.id, record.boundary_seq):
                    call["response"] = None
            next_run = self._next_in_root(run) if record.terminal else None
            return Committed(next_runs=() if next_run is None else (next_run,))

    def _write_round(self, run: RunRow, record: RoundRecord, tools: list[dict[str, Any]]) -> None:
        first_event_seq = run.event_seq
        run.boundary_seq += 0 if record.status == RunStatus.SUSPENDED else 1
        run.status = str(record.status)
        run.lease_expires_at, run.round_attempts, run.execution_fence, run.round_claims = None, 0, None, 0
        run.round_holders = []
        run.event_seq += len(record.events)
        run.dispatched_at = self._now()
        run.output, run.error_code, run.error_message = record.output, record.error_code, record.error_message
        key = (run.id, record.boundary_seq)
        if record.resumed:
            if key in self.rounds and self.rounds[key]["outcome"] == "suspend":
                self.rounds[key].update(
                    outcome=str(record.outcome), resume_fence=record.fence, committed_at=self._now()
                )
            for t in tools:
                for ti in self.tool_invocations:
                    match = (ti["run_id"], ti["invocation_id"], ti["status"])
                    if match == (run.id, t["resumes_invocation_id"], "suspended"):
                        ti.update(
                            status=t["status"],
                            result=t["result"],
                            result_digest=t["result_digest"],
                            claim_fence=record.fence,
                            invocation_id=t["invocation_id"],
                            proof=t["proof"] if t["proof"] is not None else ti["proof"],
                            suspension=t["suspension"] if t["suspension"] is not None else ti["suspension"],
                            approval=t["approval"] if t["approval"] is not None else ti.get("approval"),
                        )
        else:
            stored = {
                "claim_fence": record.fence,
                "system_digest": record.system_digest,
                "messages_digest": record.messages_digest,
                "tools_digest": record.tools_digest,
                "accepted_response_digest": record.accepted_response_digest,
                "proof": record.proof,
            }
            self.rounds[key] = {
                "outcome": str(record.outcome),
                "finish_reason": record.finish_reason,
                "tool_fingerprint": record.tool_fingerprint,
                "repeat_count": record.repeat_count,
                "resume_fence": None,
                "stored": stored,
                "committed_at": self._now(),
            }
            for t in tools:
                row = {k: v for k, v in t.items() if k != "resumes_invocation_id"}
                self.tool_invocations.append(
                    {**row, "run_id": run.id, "boundary_seq": record.boundary_seq, "claim_fence": record.fence}
                )
        for m in record.messages:
            body = as_json(m.body)
            self.messages.append(
                {
                    "id": len(self.messages) + 1,
                    "root_id": run.root_id,
                    "position": m.position,
                    "run_id": run.id,
                    "boundary_seq": record.boundary_seq,
                    "body": without_result(body) if body.get("role") == "tool" else body,
                    "chain_digest": m.chain_digest,
                }
            )
        for i, e in enumerate(record.events, start=1):
            data = as_json(e.data)
            self._event(
                run.id, first_event_seq + i, str(e.kind), without_result(data) if e.kind == "tool_completed" else data
            )

    # --- giving a claim back, ending a run, dispatch --------------------------------------

    def release_lease(
        self, run_id: UUID, fence: int, *, round_at_fault: bool, dispatch_after_s: float | None = None
    ) -> bool:
        with self._lock:
            self.calls.append("release_lease")
            run = self.runs.get(run_id)
            if run is None or run.claim_fence != fence or run.status != "running":
                return False
            run.lease_expires_at = None
            run.execution_fence = run.execution_fence if round_at_fault else None
            if dispatch_after_s is not None:
                run.dispatched_at = self._now() + dispatch_after_s
            return True

    def end_interrupted_run(self, run_id: UUID, fence: int) -> tuple[bool, tuple[UUID, ...]]:
        # This store models no root_policy: no run of it has an interrupt pending.
        return False, ()

    def fail_claimed_run(self, run_id: UUID, fence: int, error_code: str, message: str) -> tuple[UUID, ...]:
        with self._lock:
            self.calls.append("fail_claimed_run")
            run = self.runs.get(run_id)
            if run is None or run.status not in ACTIVE or run.claim_fence != fence:
                raise FenceLost(run_id, fence)
            run.status, run.lease_expires_at = "failed", None
            run.error_code, run.error_message = error_code, message
            run.event_seq += 1
            self._event(run_id, run.event_seq, "run_failed", {"error_code": error_code, "message": message})
            next_run = self._next_in_root(run)
            return () if next_run is None else (next_run,)

    def dispatch_failed(self, run_id: UUID) -> None:
        with self._lock:
            self.calls.append("dispatch_failed")
            run = self.runs.get(run_id)
            if run is not None and run.status in ACTIVE:
                run.dispatched_at = float("-inf")

    # --- a run's webhook --------------------------------------------------------------------

    def set_webhook(self, run_id: UUID, owner: str, url: str | None) -> bool:
        with self._lock:
            self.calls.append("set_webhook")
            run = self.runs.get(run_id)
            if run is None or run.owner != owner or (url is not None and run.status not in ACTIVE):
                return False
            if url is None:
                self.webhook_urls.pop(run_id, None)
            else:
                self.webhook_urls[run_id] = url
            return True

    def read_webhook_url(self, run_id: UUID, owner: str) -> str | None:
        with self._lock:
            self.calls.append("read_webhook_url")
            run = self.runs.get(run_id)
            return None if run is None or run.owner != owner else self.webhook_urls.get(run_id)


def _conforms(store: InMemoryStore) -> StorePort:
    return store  # mypy (make typecheck): the double implements every operation of the port, with its signature

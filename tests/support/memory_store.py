"""``InMemoryStore``: the store operations of ``schema.store.store.Store`` over plain dicts,
so the worker shell (``worker.round``, ``worker.resume``, ``worker.rebuild``) runs in unit
tests without PostgreSQL (after procrastinate's ``InMemoryConnector``).

It keeps the guarantees the shell relies on, statement by statement as the SQL does them:
a claim bumps the fence and is refused (``None``) unless the run is at the boundary, not
ended or suspended, not leased by a live holder (or the caller's own unreleased claim),
first in its Root and (for a round) has no round stored there - (for a resume) exactly
the suspension named; every write after a claim is fenced and raises ``FenceLost`` having
written nothing; a commit stores the round, its messages (tool results kept once, in the
tool row), tool rows and events and moves the boundary and the status. One lock guards
the state: the shell calls it from several threads. There is no workers registry, so a
dead holder's death is never excused by deaths elsewhere (as for a holder the registry
does not know). ``tests/db/test_memory_store_parity.py`` drives it and the real store
through the same sequence, so it cannot drift silently. Besides the ``Store`` methods it
has what tests need to set a scene: ``submit_run``, deliveries, ``expire_lease``,
``snapshot``."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any
from uuid import UUID, uuid4

from schema.store.claims import ClaimRefusal
from schema.store.errors import FenceLost, RootNotFound, ToolCallIdReused
from schema.store.rebuilds import PlanReservation, Reservation, VerifyPrefix
from schema.store.runs import Submitted
from schema.store.suspensions import DeliveryRefused, Receipt, SuspendedCall, SuspensionMaterial, file_digest
from schema.wire import OriginalToolRoundResume, RunRequest, RunStatus
from schema.wire.claim import Checkpoint, Claim, LoadedMessage, StoredRound
from schema.wire.rebuild import ChainBuild, RebuildCandidate, SourceMessage
from schema.wire.record import RoundRecord, ToolInvocationRecord

ACTIVE = ("queued", "running", "suspended")


def _json(value: Any) -> Any:
    """The value as it comes back from a jsonb column (fails on what JSON cannot hold)."""
    return json.loads(json.dumps(value))


def _without_result(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "result"}


@dataclass
class _Run:
    id: UUID
    root_id: UUID
    root_seq: int
    owner: str
    input: str
    config: dict[str, Any]
    status: str = "queued"
    boundary_seq: int = 0
    claim_fence: int = 0
    lease_expires_at: float | None = None
    round_attempts: int = 0
    execution_fence: int | None = None
    round_claims: int = 0
    round_holders: list[UUID] = field(default_factory=list)
    event_seq: int = 1
    dispatched_at: float = 0.0
    output: str | None = None
    error_code: str | None = None
    error_message: str | None = None


@dataclass
class _Checkpoint:
    context_start_position: int = 0
    summary: str | None = None
    last_build_id: UUID | None = None
    chain_anchor: int | None = None
    rebuilds: int = 0
    boundary_seq: int | None = None


class InMemoryStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.RLock()
        self._now = clock
        self.roots: dict[UUID, dict[str, Any]] = {}
        self.runs: dict[UUID, _Run] = {}
        self.checkpoints: dict[UUID, _Checkpoint] = {}
        self.rounds: dict[tuple[UUID, int], dict[str, Any]] = {}
        self.tool_invocations: list[dict[str, Any]] = []  # in id order
        self.messages: list[dict[str, Any]] = []  # in id order
        self.events: list[dict[str, Any]] = []
        self.model_calls: list[dict[str, Any]] = []  # a call's id is its index + 1
        self.local_reads: dict[tuple[UUID, str, str], dict[str, Any]] = {}
        self.prerequisites: dict[tuple[UUID, str], Any] = {}
        self.builds: dict[UUID, dict[str, Any]] = {}
        self.consumptions: dict[UUID, dict[str, Any]] = {}
        self.calls: list[str] = []  # every Store method called, in order (fakes record their calls)

    # --- setting a scene ------------------------------------------------------------------

    def submit_run(self, request: RunRequest, config: dict[str, Any]) -> Submitted:
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
            previous = self.checkpoints[max(earlier, key=lambda r: r.root_seq).id] if earlier else _Checkpoint()
            self.runs[run_id] = _Run(
                run_id, root_id, root_seq, request.owner, request.input, _json(config), dispatched_at=self._now()
            )
            self.checkpoints[run_id] = _Checkpoint(previous.context_start_position, previous.summary)
            self._event(run_id, 1, "run_queued", {"root_id": str(root_id), "root_seq": root_seq})
            return Submitted(run_id=run_id, root_id=root_id, root_seq=root_seq)

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

    def run(self, run_id: UUID) -> _Run:
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
    ) -> Claim | None:
        with self._lock:
            self.calls.append("claim_round")
            held = -1 if held_fence is None else held_fence
            run = self.runs.get(run_id)
            if run is None or not self._claimable(run, boundary_seq, held, resume_of):
                return None
            if run.execution_fence == run.claim_fence and run.claim_fence != held:
                run.round_attempts += 1
            run.claim_fence += 1
            run.lease_expires_at = self._now() + lease_s
            run.status = "running"
            run.execution_fence = None if resume_of is None else run.claim_fence
            run.round_claims += 1
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
            )

    def _claimable(self, run: _Run, boundary_seq: int, held: int, resume_of: list[str] | None) -> bool:
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

    def _earlier_active(self, run: _Run) -> bool:
        return any(
            r.root_id == run.root_id and r.root_seq < run.root_seq and r.status in ACTIVE for r in self.runs.values()
        )

    def _next_in_root(self, run: _Run) -> UUID | None:
        queued = [r for r in self.runs.values() if r.root_id == run.root_id and r.root_seq > run.root_seq]
        queued = [r for r in queued if r.status == "queued"]
        return min(queued, key=lambda r: r.root_seq).id if queued else None

    def _body(self, run_id: UUID, body: dict[str, Any]) -> dict[str, Any]:
        """A stored message body as read: a tool message gets its result back from its row."""
        body = copy.deepcopy(body)
        if body.get("role") == "tool":
            for t in self.tool_invocations:
                mine = t["run_id"] == run_id and t["tool_call_id"] == body.get("tool_call_id")
                if mine and t["result"] is not None:
                    body["result"] = copy.deepcopy(t["result"])
        return body

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
            run = {
                "status": r.status,
                "boundary_seq": r.boundary_seq,
                "claim_fence": r.claim_fence,
                "leased": leased,
                "earlier_active": self._earlier_active(r),
                "round_stored": stored,
            }
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
            return ClaimRefusal(False, next((why for failed, why in checks if failed), "changed_since_claim"), run)

    # --- rounds and the model-call ledger -------------------------------------------------

    def record_model_call_started(
        self, run_id: UUID, boundary_seq: int, attempt: int, fence: int, request_digest: str
    ) -> int:
        with self._lock:
            self.calls.append("record_model_call_started")
            run = self._held(run_id, fence, status=None)
            run.execution_fence = fence
            self.model_calls.append(
                {
                    "id": len(self.model_calls) + 1,
                    "run_id": run_id,
                    "boundary_seq": boundary_seq,
                    "attempt": attempt,
                    "claim_fence": fence,
                    "status": "started",
                    "request_digest": request_digest,
                    "response_digest": None,
                    "input_tokens": None,
                    "output_tokens": None,
                    "error_code": None,
                    "stale": False,
                }
            )
            return len(self.model_calls)

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
    ) -> None:
        with self._lock:
            self.calls.append("record_model_call_finished")
            call = self.model_calls[call_id - 1] if 0 < call_id <= len(self.model_calls) else None
            if call is None or (call["run_id"], call["claim_fence"], call["status"]) != (run_id, fence, "started"):
                raise FenceLost(run_id, fence)  # not this holder's started call: nothing written
            run = self.runs.get(run_id)
            call.update(
                status="failed" if error_code else "succeeded",
                response_digest=response_digest,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                error_code=error_code,
                stale=run is None or run.claim_fence != fence,
            )
            if call["stale"]:
                raise FenceLost(run_id, fence)

    def commit_round(self, record: RoundRecord) -> UUID | None:
        with self._lock:
            self.calls.append("commit_round")
            run = self.runs.get(record.run_id)
            if run is None or (run.claim_fence, run.boundary_seq, run.status) != (
                record.fence,
                record.boundary_seq,
                "running",
            ):
                raise FenceLost(record.run_id, record.fence)
            tools = [_json({f.name: getattr(t, f.name) for f in fields(ToolInvocationRecord)}) for t in record.tools]
            if not record.resumed:
                ids = [t["tool_call_id"] for t in tools]
                known = {t["tool_call_id"] for t in self.tool_invocations if t["run_id"] == run.id}
                if len(set(ids)) != len(ids) or known & set(ids):
                    raise ToolCallIdReused(run.id)
            taken = {m["position"] for m in self.messages if m["root_id"] == run.root_id}
            assert not taken & {m.position for m in record.messages}, "a message position stored twice"
            self._write_round(run, record, tools)
            return self._next_in_root(run) if record.terminal else None

    def _write_round(self, run: _Run, record: RoundRecord, tools: list[dict[str, Any]]) -> None:
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
                self.rounds[key].update(outcome=str(record.outcome), resume_fence=record.fence)
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
                "tool_fingerprint": record.tool_fingerprint,
                "repeat_count": record.repeat_count,
                "resume_fence": None,
                "stored": stored,
            }
            for t in tools:
                row = {k: v for k, v in t.items() if k != "resumes_invocation_id"}
                self.tool_invocations.append(
                    {**row, "run_id": run.id, "boundary_seq": record.boundary_seq, "claim_fence": record.fence}
                )
        for m in record.messages:
            body = _json(m.body)
            self.messages.append(
                {
                    "id": len(self.messages) + 1,
                    "root_id": run.root_id,
                    "position": m.position,
                    "run_id": run.id,
                    "boundary_seq": record.boundary_seq,
                    "body": _without_result(body) if body.get("role") == "tool" else body,
                    "chain_digest": m.chain_digest,
                }
            )
        for i, e in enumerate(record.events, start=1):
            data = _json(e.data)
            self._event(
                run.id, first_event_seq + i, str(e.kind), _without_result(data) if e.kind == "tool_completed" else data
            )

    def _event(self, run_id: UUID, seq: int, kind: str, data: dict[str, Any]) -> None:
        self.events.append({"run_id": run_id, "seq": seq, "kind": kind, "data": _json(data)})

    def _held(self, run_id: UUID, fence: int, *, status: str | None = "running") -> _Run:
        run = self.runs.get(run_id)
        if run is None or run.claim_fence != fence or (status is not None and run.status != status):
            raise FenceLost(run_id, fence)
        return run

    # --- giving a claim back, ending a run, dispatch --------------------------------------

    def release_lease(self, run_id: UUID, fence: int, *, round_at_fault: bool) -> bool:
        with self._lock:
            self.calls.append("release_lease")
            run = self.runs.get(run_id)
            if run is None or run.claim_fence != fence or run.status != "running":
                return False
            run.lease_expires_at = None
            run.execution_fence = run.execution_fence if round_at_fault else None
            return True

    def fail_claimed_run(self, run_id: UUID, fence: int, error_code: str, message: str) -> UUID | None:
        with self._lock:
            self.calls.append("fail_claimed_run")
            run = self.runs.get(run_id)
            if run is None or run.status not in ACTIVE or run.claim_fence != fence:
                raise FenceLost(run_id, fence)
            run.status, run.lease_expires_at = "failed", None
            run.error_code, run.error_message = error_code, message
            run.event_seq += 1
            self._event(run_id, run.event_seq, "run_failed", {"error_code": error_code, "message": message})
            return self._next_in_root(run)

    def dispatch_failed(self, run_id: UUID) -> None:
        with self._lock:
            self.calls.append("dispatch_failed")
            run = self.runs.get(run_id)
            if run is not None and run.status in ACTIVE:
                run.dispatched_at = float("-inf")

    # --- suspensions ----------------------------------------------------------------------

    def _suspended_calls(self, run_id: UUID) -> list[dict[str, Any]]:
        run = self.runs.get(run_id)
        if run is None:
            return []
        stored = self.rounds.get((run_id, run.boundary_seq))
        if stored is None or stored["outcome"] != "suspend":
            return []
        out = []
        for ti in self.tool_invocations:
            if (ti["run_id"], ti["boundary_seq"], ti["status"]) == (run_id, run.boundary_seq, "suspended"):
                out.append({**ti, "round_proof": stored["stored"]["proof"], "delivered": self._delivered(ti)})
        return out

    def _delivered(self, ti: dict[str, Any]) -> bool:
        suspension = ti["suspension"]
        if suspension["kind"] == "local_read":
            got = [k for k in self.local_reads if k[:2] == (ti["run_id"], ti["tool_call_id"])]
            return len(got) == len(suspension["paths"])
        return (ti["run_id"], suspension["key"]) in self.prerequisites

    @staticmethod
    def _resume_of(run_id: UUID, boundary_seq: int, c: dict[str, Any]) -> OriginalToolRoundResume:
        return OriginalToolRoundResume(
            run_id=run_id,
            invocation_id=c["invocation_id"],
            boundary_seq=boundary_seq,
            tool_call_id=c["tool_call_id"],
            tool_domain=c["tool_domain"],
            args_digest=c["args_digest"],
            work_owner=c["work_owner"],
            claim_fence=c["claim_fence"],
            round_proof=c["round_proof"],
            proof=c["proof"],
        )

    def _ready_resumes(self, run: _Run, event: dict[str, Any], kind: str) -> list[OriginalToolRoundResume]:
        calls = self._suspended_calls(run.id)
        ready = run.status == "suspended" and bool(calls) and all(c["delivered"] for c in calls)
        run.event_seq += 1
        if ready:
            run.status, run.dispatched_at = "running", self._now()
        self._event(run.id, run.event_seq, kind, {**event, "resumable": ready})
        return [self._resume_of(run.id, run.boundary_seq, c) for c in calls] if ready else []

    def resume_if_ready(self, run_id: UUID) -> list[OriginalToolRoundResume]:
        with self._lock:
            self.calls.append("resume_if_ready")
            run = self.runs.get(run_id)
            if run is None or run.status != "suspended":
                return []
            calls = self._suspended_calls(run_id)
            if not calls or not all(c["delivered"] for c in calls):
                return []
            event = {"tool_call_ids": [c["tool_call_id"] for c in calls], "reason": "inputs already delivered"}
            return self._ready_resumes(run, event, "resume_ready")

    def pending_resumes(self, run_id: UUID) -> list[OriginalToolRoundResume]:
        with self._lock:
            run = self.runs[run_id]
            return [self._resume_of(run_id, run.boundary_seq, c) for c in self._suspended_calls(run_id)]

    def load_suspension(self, invocation_id: str) -> SuspensionMaterial | None:
        with self._lock:
            self.calls.append("load_suspension")
            found = next(
                (t for t in self.tool_invocations if (t["invocation_id"], t["status"]) == (invocation_id, "suspended")),
                None,
            )
            if found is None:
                return None
            run_id, boundary_seq = found["run_id"], found["boundary_seq"]
            stored = self.rounds.get((run_id, boundary_seq))
            if self.runs[run_id].boundary_seq != boundary_seq or stored is None or stored["outcome"] != "suspend":
                return None
            calls = [
                SuspendedCall(
                    c["tool_call_id"],
                    c["tool_name"],
                    c["args"],
                    c["suspension"],
                    self._resume_of(run_id, boundary_seq, c),
                )
                for c in copy.deepcopy(self._suspended_calls(run_id))
            ]
            files: dict[str, dict[str, dict[str, Any]]] = {}
            for (run, call, path), r in self.local_reads.items():
                if run == run_id:
                    files.setdefault(call, {})[path] = dict(r)
            prerequisites = {k: copy.deepcopy(v) for (run, k), v in self.prerequisites.items() if run == run_id}
            return SuspensionMaterial(
                run_id, boundary_seq, StoredRound(**stored["stored"]), calls, files, prerequisites
            )

    def deliver_local_read(
        self, run_id: UUID, tool_call_id: str, files: dict[str, str], *, max_file_bytes: int = 1 << 20
    ) -> Receipt:
        """The files a suspended read asked for (the happy path of the real delivery)."""
        with self._lock:
            run = self.runs[run_id]
            call = next((c for c in self._suspended_calls(run_id) if c["tool_call_id"] == tool_call_id), None)
            if call is None or call["suspension"]["kind"] != "local_read":
                raise DeliveryRefused(run_id, f"it is not waiting for files for {tool_call_id!r}", "tool_call_id")
            if sorted(files) != sorted(call["suspension"]["paths"]):
                raise DeliveryRefused(run_id, "other paths than asked for", "files")
            for path, content in files.items():
                size = len(content.encode())
                self.local_reads[(run_id, tool_call_id, path)] = {
                    "content": content,
                    "digest": file_digest(content),
                    "size_bytes": size,
                }
            event = {
                "tool_call_id": tool_call_id,
                "kind": "local_read",
                "files": [{"path": p, "digest": file_digest(c)} for p, c in sorted(files.items())],
            }
            return Receipt(stored=True, resumes=self._ready_resumes(run, event, "input_delivered"))

    def resolve_prerequisite(self, run_id: UUID, key: str, value: Any) -> Receipt:
        with self._lock:
            run = self.runs[run_id]
            if (run_id, key) in self.prerequisites:
                return Receipt(stored=False, resumes=[])
            waiting = [
                c
                for c in self._suspended_calls(run_id)
                if c["suspension"]["kind"] == "prerequisite" and c["suspension"]["key"] == key
            ]
            if not waiting:
                raise DeliveryRefused(run_id, f"it is not waiting for prerequisite {key!r}", "key")
            self.prerequisites[(run_id, key)] = _json(value)
            event = {"kind": "prerequisite", "key": key, "tool_call_ids": [c["tool_call_id"] for c in waiting]}
            return Receipt(stored=True, resumes=self._ready_resumes(run, event, "input_delivered"))

    # --- context rebuilds -----------------------------------------------------------------

    def reserve_model_rebuild(
        self,
        *,
        run_id: UUID,
        fence: int,
        boundary_seq: int,
        chain_anchor: int,
        predecessor_build_id: UUID | None,
        plan_reservation: PlanReservation,
    ) -> Reservation:
        with self._lock:
            self.calls.append("reserve_model_rebuild")
            root_id = self._held(run_id, fence).root_id
            chain = sorted(
                (
                    ChainBuild(str(i), b["ordinal"], i in self.consumptions)
                    for i, b in self.builds.items()
                    if (b["root_id"], b["chain_anchor"]) == (root_id, chain_anchor)
                ),
                key=lambda b: b.ordinal,
            )
            plan = plan_reservation(chain, str(predecessor_build_id) if predecessor_build_id else None)
            held = {"run_id": run_id, "claim_fence": fence, "boundary_seq": boundary_seq}
            if plan.take_build_id is not None:
                build_id = UUID(plan.take_build_id)
                self.builds[build_id].update(held, source_message_ids=None, source_digest=None, summary=None)
            else:
                assert plan.ordinal not in {b.ordinal for b in chain}, "one build per (root, chain, ordinal)"
                build_id = uuid4()
                self.builds[build_id] = {
                    **held,
                    "root_id": root_id,
                    "chain_anchor": chain_anchor,
                    "ordinal": plan.ordinal,
                    "predecessor_build_id": plan.predecessor_build_id,
                    "source_message_ids": None,
                    "source_digest": None,
                    "summary": None,
                }
            predecessor = UUID(plan.predecessor_build_id) if plan.predecessor_build_id else None
            return Reservation(build_id, plan.ordinal, predecessor)

    def _sources(self, root_id: UUID, from_position: int) -> list[SourceMessage]:
        rows = sorted((m for m in self.messages if m["root_id"] == root_id), key=lambda m: m["position"])
        return [
            SourceMessage(m["id"], m["position"], str(m["run_id"]), self._body(m["run_id"], m["body"]))
            for m in rows
            if m["position"] >= from_position
        ]

    def load_context_sources(self, root_id: UUID, from_position: int) -> list[SourceMessage]:
        with self._lock:
            self.calls.append("load_context_sources")
            return self._sources(root_id, from_position)

    def record_candidate(self, build_id: UUID, run_id: UUID, fence: int, candidate: RebuildCandidate) -> None:
        with self._lock:
            self.calls.append("record_candidate")
            build = self.builds.get(build_id)
            if build is None or (build["run_id"], build["claim_fence"]) != (run_id, fence):
                raise FenceLost(run_id, fence)
            build.update(
                source_message_ids=list(candidate.source_message_ids),
                source_digest=candidate.source_digest,
                summary=candidate.summary,
            )

    def admit_model_rebuild_request(
        self,
        *,
        build_id: UUID,
        run_id: UUID,
        fence: int,
        boundary_seq: int,
        chain_anchor: int,
        context_start: int,
        candidate: RebuildCandidate,
        authorize: Callable[[int], None],
        verify_prefix: VerifyPrefix,
        after_snapshot: Callable[[], None] | None = None,
    ) -> None:
        with self._lock:
            self.calls.append("admit_model_rebuild_request")
            run = self._held(run_id, fence)
            authorize(fence)
            eligible = {str(r.id) for r in self.runs.values() if r.root_id == run.root_id}
            eligible = {i for i in eligible if self.runs[UUID(i)].status == "completed" or UUID(i) == run_id}
            verify_prefix(candidate, self._sources(run.root_id, context_start), eligible)
            if after_snapshot is not None:
                after_snapshot()
            assert build_id not in self.consumptions, "a build is consumed once"
            self.consumptions[build_id] = {
                "run_id": run_id,
                "boundary_seq": boundary_seq,
                "claim_fence": fence,
                "source_digest": candidate.source_digest,
            }
            cp = self.checkpoints[run_id]
            cp.boundary_seq, cp.context_start_position = boundary_seq, candidate.last_source_position + 1
            cp.summary, cp.rebuilds, cp.last_build_id, cp.chain_anchor = (
                candidate.summary,
                cp.rebuilds + 1,
                build_id,
                chain_anchor,
            )
            run.event_seq += 1
            event = {
                "build_id": str(build_id),
                "boundary_seq": boundary_seq,
                "source_messages": len(candidate.source_message_ids),
                "context_start": candidate.last_source_position + 1,
            }
            self._event(run_id, run.event_seq, "context_rebuilt", event)

"""The in-memory store's suspensions: what a suspended round waits for, deliveries (the
happy path of the real ones, for setting a scene), ``resume_if_ready`` and the material a
resume loads (``schema.store.suspensions``)."""

from __future__ import annotations

import copy
from typing import Any
from uuid import UUID

from schema.store.answers import Answer
from schema.store.effects import ExecutionRecord
from schema.store.resumes import LocalFile, SuspendedCall, SuspensionMaterial
from schema.store.suspensions import (
    ANSWERS_FOR,
    DeliveryRefused,
    Receipt,
    file_digest,
)
from schema.wire import OriginalToolRoundResume
from schema.wire.claim import StoredRound
from schema.wire.vocab import ToolAnswerKind
from tests.support.memory_state import RunRow, State, as_json


class SuspensionOps(State):
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
        if suspension["kind"] == "prerequisite":
            return (ti["run_id"], suspension["key"]) in self.prerequisites
        return (ti["run_id"], ti["invocation_id"]) in self.answers

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

    def _ready_resumes(self, run: RunRow, event: dict[str, Any], kind: str) -> list[OriginalToolRoundResume]:
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
            files: dict[str, dict[str, LocalFile]] = {}
            for (run, call, path), r in self.local_reads.items():
                if run == run_id:
                    files.setdefault(call, {})[path] = LocalFile(
                        content=r["content"], digest=r["digest"], size_bytes=r["size_bytes"]
                    )
            prerequisites = {k: copy.deepcopy(v) for (run, k), v in self.prerequisites.items() if run == run_id}
            current = {c.resume.invocation_id for c in calls}
            answers: dict[str, Answer] = {}
            approvals: dict[str, Answer] = {}
            for (run, invocation_id), (call_id, answer) in self.answers.items():
                if run != run_id:
                    continue
                if answer.kind in (ToolAnswerKind.APPROVE, ToolAnswerKind.REJECT):
                    approvals[call_id] = answer
                elif invocation_id in current:
                    answers[call_id] = answer
            return SuspensionMaterial(
                run_id, boundary_seq, StoredRound(**stored["stored"]), calls, files, prerequisites, answers, approvals
            )

    def answer_tool_call(self, run_id: UUID, tool_call_id: str, answer: Answer) -> Receipt:
        """An answer to a suspended call (the happy path of the real one, and its kind check)."""
        with self._lock:
            run = self.runs[run_id]
            call = next((c for c in self._suspended_calls(run_id) if c["tool_call_id"] == tool_call_id), None)
            if call is None:
                raise DeliveryRefused(run_id, f"it is not waiting for tool call {tool_call_id!r}", "tool_call_id")
            if answer.kind not in ANSWERS_FOR.get(call["suspension"]["kind"], frozenset()):
                raise DeliveryRefused(run_id, f"{tool_call_id!r} waits for another kind of answer", "kind")
            key = (run_id, call["invocation_id"])
            if key in self.answers:
                return Receipt(stored=False, resumes=[])
            self.answers[key] = (tool_call_id, copy.deepcopy(answer))
            event = {"tool_call_id": tool_call_id, "kind": call["suspension"]["kind"], "answer": str(answer.kind)}
            return Receipt(stored=True, resumes=self._ready_resumes(run, event, "input_delivered"))

    # --- at-most-once records (schema.store.effects) --------------------------------------

    def start_tool_execution(
        self, run_id: UUID, boundary_seq: int, tool_call_id: str, fence: int, *, retry_of: str | None
    ) -> ExecutionRecord | None:
        with self._lock:
            self.calls.append("start_tool_execution")
            self._held(run_id, fence)
            record = self.executions.get((run_id, tool_call_id))
            if record is not None and (retry_of is None or record.get("retry_of") == retry_of):
                return ExecutionRecord(record["status"], copy.deepcopy(record["result"]), record["executions"])
            executions = record["executions"] + 1 if record else 1
            self.executions[(run_id, tool_call_id)] = {
                "boundary_seq": boundary_seq, "claim_fence": fence, "executions": executions,
                "status": None, "result": None, "retry_of": retry_of,
            }
            return None

    def finish_tool_execution(
        self, run_id: UUID, tool_call_id: str, fence: int, status: str | None, result: object
    ) -> None:
        with self._lock:
            self.calls.append("finish_tool_execution")
            record = self.executions.get((run_id, tool_call_id))
            if record is None or record["claim_fence"] != fence:
                return
            if status is None:
                del self.executions[(run_id, tool_call_id)]
            else:
                record.update(status=status, result=as_json(result))

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
            self.prerequisites[(run_id, key)] = as_json(value)
            event = {"kind": "prerequisite", "key": key, "tool_call_ids": [c["tool_call_id"] for c in waiting]}
            return Receipt(stored=True, resumes=self._ready_resumes(run, event, "input_delivered"))

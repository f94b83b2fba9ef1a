"""The in-memory store's state and the helpers its parts share (``tests.support.memory_store``)."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from schema.store.errors import FenceLost
from schema.wire.claim import RecordedResponse

ACTIVE = ("queued", "running", "suspended")


def as_json(value: Any) -> Any:
    """The value as it comes back from a jsonb column (fails on what JSON cannot hold)."""
    return json.loads(json.dumps(value))


def without_result(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "result"}


@dataclass
class RunRow:
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
    trace_context: str | None = None
    priority: int = 5
    budget_wait: dict[str, Any] | None = None


@dataclass
class CheckpointRow:
    context_start_position: int = 0
    summary: str | None = None
    last_build_id: UUID | None = None
    chain_anchor: int | None = None
    rebuilds: int = 0
    boundary_seq: int | None = None


class State:
    """The double's state, as its parts (``InMemoryStore`` and its mixins) share it."""

    _lock: threading.RLock
    _now: Callable[[], float]
    roots: dict[UUID, dict[str, Any]]
    runs: dict[UUID, RunRow]
    checkpoints: dict[UUID, CheckpointRow]
    rounds: dict[tuple[UUID, int], dict[str, Any]]
    tool_invocations: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    model_calls: list[dict[str, Any]]
    local_reads: dict[tuple[UUID, str, str], dict[str, Any]]
    prerequisites: dict[tuple[UUID, str], Any]
    answers: dict[tuple[UUID, str], tuple[str, Any]]  # (run, invocation id) -> (tool call id, Answer)
    executions: dict[tuple[UUID, str], dict[str, Any]]  # (run, tool call id) -> at-most-once record
    builds: dict[UUID, dict[str, Any]]
    consumptions: dict[UUID, dict[str, Any]]
    calls: list[str]

    def _event(self, run_id: UUID, seq: int, kind: str, data: dict[str, Any]) -> None:
        self.events.append({"run_id": run_id, "seq": seq, "kind": kind, "data": as_json(data)})

    def _held(self, run_id: UUID, fence: int, *, status: str | None = "running") -> RunRow:
        run = self.runs.get(run_id)
        if run is None or run.claim_fence != fence or (status is not None and run.status != status):
            raise FenceLost(run_id, fence)
        return run

    def _recorded(self, run_id: UUID, boundary_seq: int) -> RecordedResponse | None:
        """The latest succeeded call's response at the boundary, as a round's claim hands it back."""
        for call in reversed(self.model_calls):
            mine = (call["run_id"], call["boundary_seq"], call["status"]) == (run_id, boundary_seq, "succeeded")
            if mine and call["response"] is not None:
                return RecordedResponse(call["request_digest"], copy.deepcopy(call["response"]))
        return None

    def _body(self, run_id: UUID, body: dict[str, Any]) -> dict[str, Any]:
        """A stored message body as read: a tool message gets its result back from its row."""
        body = copy.deepcopy(body)
        if body.get("role") == "tool":
            for t in self.tool_invocations:
                mine = t["run_id"] == run_id and t["tool_call_id"] == body.get("tool_call_id")
                if mine and t["result"] is not None:
                    body["result"] = copy.deepcopy(t["result"])
        return body

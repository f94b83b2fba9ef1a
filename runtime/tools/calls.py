"""What a tool call is given and gives back: what a suspended call waits for
(``ToolSuspension``, raised from a handler as ``NeedsInput``), the inputs delivered or
answered for it (``ToolInputs``), the handler's context (``ToolContext``), its output and
the call's outcome (``ToolOutcome``), and what an earlier execution recorded."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args
from uuid import UUID

from runtime.canonical import digest, str_at
from schema.wire.json import JsonMapping, JsonObject, JsonValue
from schema.wire.vocab import ToolAnswerKind, ToolStatus

# --- what a suspended call waits for ------------------------------------------------------

SuspensionKind = Literal["local_read", "prerequisite", "client_tool", "approval", "outcome_unknown"]
_SUSPENSION_KINDS: dict[JsonValue, SuspensionKind] = {kind: kind for kind in get_args(SuspensionKind)}


@dataclass(frozen=True)
class ToolSuspension:
    """What a suspended tool call waits for: files from the end user's machine
    (``local_read`` with ``paths``), a prerequisite resolved by the client (``key``), the
    result of a client-side tool (``client_tool``), a human's decision (``approval``), or
    an operator's word on an ``at_most_once`` call whose outcome is unknown."""

    kind: SuspensionKind
    paths: tuple[str, ...] = ()
    key: str | None = None
    reason: str | None = None

    def to_json(self) -> JsonObject:
        body: JsonObject = {"kind": self.kind}
        if self.kind == "local_read":
            body["paths"] = list(self.paths)
        elif self.kind == "prerequisite":
            body["key"] = self.key
        if self.reason is not None:
            body["reason"] = self.reason
        return body

    def proof_digest(self) -> str | None:
        """What a call's proof covers of its wait: the digest of the waits answered about
        the call itself; None for ``local_read`` and ``prerequisite`` (proofs of those were
        issued before the digest existed, and must keep verifying)."""
        return None if self.kind in ("local_read", "prerequisite") else digest(self.to_json())

    @classmethod
    def from_json(cls, data: JsonMapping) -> ToolSuspension:
        """What ``to_json`` wrote (a kind it never writes is a ``KeyError``)."""
        paths = data.get("paths", [])
        return cls(
            kind=_SUSPENSION_KINDS[data["kind"]],
            paths=tuple(str(p) for p in paths) if isinstance(paths, list) else (),
            key=str_at(data, "key"),
            reason=str_at(data, "reason"),
        )


class NeedsInput(Exception):
    """Raised inside a handler (by ``ToolContext.read`` / ``prerequisite``) when the input
    is not there yet: the call suspends."""

    def __init__(self, suspension: ToolSuspension) -> None:
        super().__init__(suspension.kind)
        self.suspension = suspension


@dataclass(frozen=True)
class LocalFile:
    path: str
    content: str
    digest: str
    size_bytes: int


@dataclass(frozen=True)
class ToolAnswer:
    """What someone outside said about one suspended call: its result (a client tool, or
    an operator for an outcome that was unknown), an approval (maybe with edited args),
    a rejection with its reason, or "run it again" (``retry``)."""

    kind: ToolAnswerKind
    value: JsonValue = None  # the result, or the edited args of an approval
    is_error: bool = False
    reason: str | None = None
    # The wait it answers (the suspended invocation's id): a retry restarts the call once.
    wait_id: str | None = None

    def decision_json(self) -> JsonObject:
        """A decision on a call (approve / reject) as its events and its row show it."""
        body: JsonObject = {"decision": str(self.kind)}
        if self.value is not None:
            body["args"] = self.value
        if self.reason is not None:
            body["reason"] = self.reason
        return body


@dataclass(frozen=True)
class ToolInputs:
    """Inputs delivered for one tool call and for its run. Empty on a call's first
    execution. ``answer`` is the answer to the call's current wait (a result, or
    ``retry``); ``approval`` is the decision on the call (``approve`` or ``reject``), which
    holds for every later execution of it."""

    files: Mapping[str, LocalFile] = field(default_factory=dict)
    prerequisites: Mapping[str, JsonValue] = field(default_factory=dict)
    answer: ToolAnswer | None = None
    approval: ToolAnswer | None = None

    def read(self, paths: Sequence[str]) -> list[LocalFile]:
        """The delivered files, or suspend the call until they are delivered."""
        if not paths or any(p not in self.files for p in paths):
            raise NeedsInput(ToolSuspension("local_read", paths=tuple(paths)))
        return [self.files[p] for p in paths]

    def prerequisite(self, key: str) -> JsonValue:
        if key not in self.prerequisites:
            raise NeedsInput(ToolSuspension("prerequisite", key=key))
        return self.prerequisites[key]


NO_INPUTS = ToolInputs()


@dataclass(frozen=True)
class ToolContext:
    """What a handler knows about the call it serves.

    ``idempotency_key`` is the same on every execution of this call (a retry, a round
    re-executed after a crash, an operator's ``retry-tool``) and different for every other
    call: pass it to the system the tool changes. ``attempt`` starts at the round's
    execution (1 first; more when the round is re-executed after a crash) and grows by one
    with each retry (``ToolRetry``). ``deadline`` is a ``time.time()`` instant.
    """

    run_id: UUID
    boundary_seq: int
    tool_call_id: str
    attempt: int
    owner: str
    idempotency_key: str
    deadline: float
    inputs: ToolInputs = NO_INPUTS

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.time())

    def read(self, paths: Sequence[str]) -> list[LocalFile]:
        return self.inputs.read(paths)

    def prerequisite(self, key: str) -> JsonValue:
        return self.inputs.prerequisite(key)


@dataclass(frozen=True)
class ToolOutput:
    """A result whose model-context form differs from what is stored: a durable local
    read stores a placeholder, and the model sees the file bodies."""

    result: JsonValue
    context: JsonValue


def failure_result(code: str, message: str) -> JsonObject:
    """The result of a failed call, as stored and as the model sees it."""
    return {"error": {"code": code, "message": message}}


@dataclass(frozen=True)
class ToolOutcome:
    """A call's outcome as its tool gave it: ``result`` and ``context`` are what the
    handler returned, checked to be JSON only by ``runtime.tool_calls.run_tool``."""

    status: ToolStatus
    result: object  # what is stored (None while suspended)
    context: object  # what the model's context shows
    suspension: ToolSuspension | None = None

    @classmethod
    def failed(cls, code: str, message: str) -> ToolOutcome:
        result = failure_result(code, message)
        return cls(ToolStatus.FAILED, result, result)

    @classmethod
    def suspended(cls, suspension: ToolSuspension) -> ToolOutcome:
        return cls(ToolStatus.SUSPENDED, None, None, suspension)

    @classmethod
    def completed(cls, output: object) -> ToolOutcome:
        """A handler's return: a ``ToolOutput``, or the result the model sees as well."""
        if isinstance(output, ToolOutput):
            return cls(ToolStatus.COMPLETED, output.result, output.context)
        return cls(ToolStatus.COMPLETED, output, output)


@dataclass(frozen=True)
class PriorExecution:
    """An ``at_most_once`` call that was started before, under an earlier claim: what it
    recorded (``status`` and ``result``), or ``status`` None when its end was never
    recorded (the worker died or lost its claim while it ran)."""

    status: ToolStatus | None
    result: JsonValue = None

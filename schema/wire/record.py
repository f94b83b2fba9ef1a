"""One round as the store takes it, built once from the core's result
(``runtime.record.round_record``). The fields of ``ToolInvocationRecord`` are the
columns of the commit's tool rows (``schema.store.rounds`` derives its column list from
them), so the tool invocation's field list is written here and in the table only."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from schema.wire import EventKind, RunStatus
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import RoundOutcomeKind, ToolDomain, ToolStatus


@dataclass(frozen=True)
class MessageRecord:
    position: int
    body: JsonObject  # the full message (the store keeps a tool result only once)
    chain_digest: str


@dataclass(frozen=True)
class EventRecord:
    kind: EventKind
    data: JsonObject


@dataclass(frozen=True)
class ToolInvocationRecord:
    tool_call_id: str
    tool_name: str
    tool_domain: ToolDomain | None  # None: the model named a tool that is not enabled
    args: JsonObject
    args_digest: str
    status: ToolStatus
    result: JsonValue  # JSON; None while suspended
    result_digest: str | None
    suspension: JsonObject | None  # what a suspended call waits for
    invocation_id: str | None
    work_owner: str | None
    proof: str | None
    resumes_invocation_id: str | None  # set when a resume re-ran this call
    approval: JsonObject | None = None  # a person's decision on the call (maybe edited args)


@dataclass(frozen=True)
class RoundRecord:
    run_id: UUID
    boundary_seq: int
    fence: int
    outcome: RoundOutcomeKind
    status: RunStatus  # the run's status after the round
    output: str | None
    error_code: str | None
    error_message: str | None
    system_digest: str
    messages_digest: str
    tools_digest: str
    accepted_response_digest: str | None
    tool_fingerprint: str | None
    repeat_count: int
    proof: str | None
    resumed: bool  # True: completes the suspended round in place
    messages: tuple[MessageRecord, ...]
    tools: tuple[ToolInvocationRecord, ...]
    events: tuple[EventRecord, ...]
    finish_reason: str | None = None  # how the model's answer ended (the provider's word)

    @property
    def terminal(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True)
class Committed:
    """What a round's commit did besides storing the round: whether a pending interrupt
    (``root_policy: interrupt``) ended the run at this boundary, cancelled, and the
    queued runs to send now (a Root's next, an owner's next in a freed slot)."""

    next_runs: tuple[UUID, ...] = ()
    interrupted: bool = False

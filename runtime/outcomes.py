"""The values a round produces: the ``RoundResult`` (what to persist) and its outcome
(what comes next: ``Continue | Suspend | Finish | Fail``, or a ``RebuildRequired``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runtime.messages import Message, ToolCall
from runtime.proofs import OwnedRoundProjection, OwnedToolCallProjection
from runtime.tools import ToolAnswer, ToolSuspension
from schema.wire import EventKind
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import ToolDomain, ToolStatus


@dataclass(frozen=True)
class Continue:
    kind: Literal["continue"] = "continue"


@dataclass(frozen=True)
class Finish:
    output: str
    kind: Literal["finish"] = "finish"


@dataclass(frozen=True)
class Fail:
    error_code: str
    message: str
    kind: Literal["fail"] = "fail"


@dataclass(frozen=True)
class Suspend:
    """Some tool calls of the round wait for input; the run stops consuming a worker."""

    waiting: tuple[ToolCall, ...]
    kind: Literal["suspend"] = "suspend"


@dataclass(frozen=True)
class RebuildRequired:
    """The provider rejected the input as too long: rebuild the context and call again.
    Never committed; the caller rebuilds and re-runs the round under the same claim."""

    message: str
    kind: Literal["rebuild"] = "rebuild"


RoundOutcome = Continue | Finish | Fail | Suspend | RebuildRequired


@dataclass(frozen=True)
class StoredMessage:
    """A new message: ``message`` is stored in full; ``context`` is its context form
    (what later model calls see); ``chain_digest`` chains the context forms."""

    position: int
    message: Message
    context: Message
    chain_digest: str


@dataclass(frozen=True)
class ToolInvocation:
    call: ToolCall
    domain: ToolDomain | None  # None: the model named a tool that is not enabled
    status: ToolStatus
    result: JsonValue  # stored (None while suspended)
    args_digest: str
    result_digest: str | None
    suspension: ToolSuspension | None = None
    # Set on suspended calls: the proof a resume must match.
    projection: OwnedToolCallProjection | None = None
    # Set when a resume re-ran this call: the stored invocation it completes.
    resumes_invocation_id: str | None = None
    # The decision a person took on this call (approval), if it needed one.
    approval: ToolAnswer | None = None


@dataclass(frozen=True)
class RoundEvent:
    kind: EventKind
    data: JsonObject


@dataclass(frozen=True)
class RoundDigests:
    system: str
    messages: str
    tools: str
    accepted_response: str | None


@dataclass(frozen=True)
class RoundResult:
    boundary_seq: int
    outcome: RoundOutcome
    new_messages: tuple[StoredMessage, ...]
    tool_invocations: tuple[ToolInvocation, ...]
    events: tuple[RoundEvent, ...]
    digests: RoundDigests
    # Issued by the driver; the caller stores its proof with the round. None for a resume
    # (it completes a round that already has one).
    projection: OwnedRoundProjection | None = None
    # The repeated-call breaker's state after this round (stored with the round).
    tool_fingerprint: str | None = None
    repeat_count: int = 0
    resumed: bool = False
    # How the model's answer ended, as the provider said it (``ModelResponse.finish_reason``).
    finish_reason: str | None = None

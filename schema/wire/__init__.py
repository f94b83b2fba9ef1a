"""Pydantic models that cross a process or database boundary: the run request, the
round task payload, events and the status view. Frozen, extra fields forbidden.

The bottom layer: ``runtime`` and ``schema.store`` both import it, it imports neither.
Its modules hold what both sides share: ``errors`` (the error base), ``vocab`` (the
enums the tables' CHECKs are built from), ``claim`` (what a claim returns), ``record``
(a round as the store takes it), ``rebuild`` (a context rebuild's values), ``retry``."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schema.wire.agents import AGENT_REF_PATTERN
from schema.wire.json import JsonObjectField
from schema.wire.route import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from schema.wire.vocab import WebhookStatus

MAX_INPUT_CHARS = 1_000_000
MAX_WEBHOOK_URL_CHARS = 2048
OWNER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
MAX_OWNER_CHARS = 128
# An idempotency key: visible ASCII (a UUID, a ULID, base64 and the like), no spaces.
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9._:@/+=~-]+$"
MAX_IDEMPOTENCY_KEY_CHARS = 255


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class RootPolicy(StrEnum):
    """What a submit does when its Root has an active (queued, running, suspended) run."""

    ENQUEUE = "enqueue"  # wait for it (the default)
    REJECT = "reject"  # refuse the submit (ROOT_BUSY), store nothing
    INTERRUPT = "interrupt"  # cancel it, keep its committed messages
    ROLLBACK = "rollback"  # cancel it, drop its messages (and input) from the Root


class Webhook(_Wire):
    """Where the run's ending and suspension events are POSTed, signed. The URL must start
    with one of the deployment's ``AIDAWORK_WEBHOOK_URLS`` prefixes (checked at submit)."""

    url: str = Field(min_length=1, max_length=MAX_WEBHOOK_URL_CHARS)


class RunRequest(_Wire):
    """What an upstream service submits. ``config`` is validated by
    ``runtime.prepare.prepare_execution`` (it knows the tools and providers); ``webhook``
    by the submitting process (it knows the allowed URL prefixes). In place of ``config``,
    ``agent`` names one of the owner's saved agents (``NAME`` for its latest version, or
    ``NAME@VERSION``), with ``overrides`` limited to the paths the agent allows."""

    owner: str = Field(min_length=1, max_length=MAX_OWNER_CHARS, pattern=OWNER_PATTERN)
    root_id: UUID | None = None
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    config: JsonObjectField | None = None
    agent: str | None = Field(default=None, pattern=AGENT_REF_PATTERN, max_length=80)
    overrides: JsonObjectField | None = None
    webhook: Webhook | None = None
    # The same owner and key return the same run (schema.store.runs, submit_run_txn).
    idempotency_key: str | None = Field(
        default=None, min_length=1, max_length=MAX_IDEMPOTENCY_KEY_CHARS, pattern=IDEMPOTENCY_KEY_PATTERN
    )
    root_policy: RootPolicy = RootPolicy.ENQUEUE
    # Orders the run's rounds within its owner's share of the fleet: 9 the most urgent,
    # 0 the least (runtime.shares).
    priority: int = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)

    @model_validator(mode="after")
    def _config_or_agent(self) -> RunRequest:
        if (self.config is None) == (self.agent is None):
            raise ValueError("send config or agent (a saved agent's name), exactly one of them")
        if self.overrides is not None and self.agent is None:
            raise ValueError("overrides: only with agent (a plain run sends its whole config)")
        return self


class RoundTask(_Wire):
    """The payload of one ``aidawork.run_round`` task: ids only, so Flower shows no
    prompts, file bodies or secrets."""

    run_id: UUID
    boundary_seq: int = Field(ge=0)


class OriginalToolRoundResume(_Wire):
    """The authority to re-run one suspended tool call: a copy of its stored projection
    (issued by the driver that suspended it) with that projection's proof."""

    run_id: UUID
    invocation_id: str
    boundary_seq: int
    tool_call_id: str
    tool_domain: str
    args_digest: str
    work_owner: str
    claim_fence: int
    round_proof: str
    proof: str

    def projection_fields(self) -> dict[str, object]:
        data = self.model_dump(mode="json", exclude={"proof"})
        return {**data, "run_id": str(self.run_id)}


class EventKind(StrEnum):
    """What a run event says happened. The comment above each kind is its meaning on the
    generated Events reference page."""

    # The run was stored and its first round sent (data: its Root and place in it).
    RUN_QUEUED = "run_queued"
    # A round's model call was accepted: its answer text and the tool calls it asked for.
    MODEL_RESPONDED = "model_responded"
    # A tool call ended, succeeded or failed, with its result (an approval, if it had one).
    TOOL_COMPLETED = "tool_completed"
    # A tool call waits for something outside the run: a file, a value, a client, a person.
    TOOL_SUSPENDED = "tool_suspended"
    # The run holds no worker until its waits are answered (or its owner's budget can take it).
    RUN_SUSPENDED = "run_suspended"
    # An answer to a wait arrived: a file, a prerequisite, a client tool's result, a decision.
    INPUT_DELIVERED = "input_delivered"
    # The suspended round went on: its original tool calls ran again, without a model call.
    ROUND_RESUMED = "round_resumed"
    # A suspended round whose inputs were all there already (no delivery needed) is ready.
    RESUME_READY = "resume_ready"
    # The model repeated the same tool call too often: the run fails (REPEATED_IDENTICAL_TOOL_CALL).
    BREAKER_TRIPPED = "breaker_tripped"
    # The context did not fit the model's window and was rebuilt in a transaction.
    CONTEXT_REBUILT = "context_rebuilt"
    # The run ended with the model's final answer (data: the output).
    RUN_COMPLETED = "run_completed"
    # The run ended with an error code and message.
    RUN_FAILED = "run_failed"
    # The run was cancelled, interrupted or rolled back.
    RUN_CANCELLED = "run_cancelled"


TERMINAL_EVENTS = frozenset({EventKind.RUN_COMPLETED, EventKind.RUN_FAILED, EventKind.RUN_CANCELLED})
# The events a run's webhook is sent (the outbox trigger of migration 0012 lists them too).
WEBHOOK_EVENTS = frozenset({*TERMINAL_EVENTS, EventKind.RUN_SUSPENDED})


class RunEvent(_Wire):
    run_id: UUID
    seq: int
    kind: EventKind
    # Untyped still: worker.cli.run_view reads its members unchecked (JsonObjectField once it narrows them).
    data: dict[str, Any]
    created_at: datetime


class WaitingFor(_Wire):
    """A suspended tool call and what it waits for; or (kind ``budget``, no tool call) a
    run parked until its owner's token budget can take its next model call."""

    tool_call_id: str | None = None  # None for a budget wait
    tool_name: str | None = None
    kind: str  # local_read | prerequisite | client_tool | approval | outcome_unknown | budget
    paths: list[str] | None = None  # local_read: the files asked for
    key: str | None = None  # prerequisite: its key
    args: JsonObjectField | None = None  # client_tool, approval, outcome_unknown: the call's args
    reason: str | None = None  # outcome_unknown: why it is not known
    delivered: bool
    # budget: the owner's window (1h | 1d | 30d) and when it ends, its budget, the tokens
    # used and reserved in it when the run parked, and the next call's estimate.
    budget_window: str | None = None
    window_ends_at: datetime | None = None
    token_budget: int | None = None
    used_tokens: int | None = None
    reserved_tokens: int | None = None
    estimate_tokens: int | None = None


class WebhookDeliveryView(_Wire):
    """One webhook delivery of a run (one per event sent), as ``aidawork status --json``
    shows it. ``id`` is the ``AIDAWORK-Delivery`` header the receiver de-duplicates by."""

    id: int
    event_seq: int
    event_kind: EventKind
    status: WebhookStatus
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None


class RootRunView(_Wire):
    """One run of a Root, as listed for the Root."""

    run_id: UUID
    root_seq: int
    status: RunStatus
    rounds: int
    output: str | None
    error_code: str | None
    error_message: str | None
    created_at: datetime
    finished_at: datetime | None


class RunView(_Wire):
    """What ``aidawork status RUN_ID --json`` prints."""

    run_id: UUID
    root_id: UUID
    owner: str
    status: RunStatus
    rounds: int
    model_calls: int
    # Token usage summed over every model call on record, stale ones included: the spend.
    input_tokens: int = 0
    output_tokens: int = 0
    # Calls paid for by a holder that had lost its claim (the round could not commit).
    stale_model_calls: int = 0
    rebuilds: int = 0
    # The saved agent the run was made from, as NAME@VERSION (None: a run with its own config).
    agent: str | None = None
    # A fork's parent run and the rounds of it the fork copied (None: not a fork).
    forked_from: UUID | None = None
    forked_at_round: int | None = None
    output: str | None
    error_code: str | None
    error_message: str | None
    created_at: datetime
    finished_at: datetime | None
    waiting_for: list[WaitingFor] = Field(default_factory=list)
    # Webhook deliveries of this run's events, oldest first (empty without a webhook).
    webhooks: list[WebhookDeliveryView] = Field(default_factory=list)

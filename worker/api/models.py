"""The request and response bodies of the HTTP API (``schema.wire`` has the views it
shares with the Python client): frozen, and a field nobody declared is refused."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from runtime.config import TurnConfig
from schema.wire import (
    IDEMPOTENCY_KEY_PATTERN,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_INPUT_CHARS,
    MAX_OWNER_CHARS,
    OWNER_PATTERN,
    RootPolicy,
    RootRunView,
    Webhook,
)
from schema.wire.agents import (
    AGENT_NAME_PATTERN,
    AGENT_REF_PATTERN,
    MAX_AGENT_DESCRIPTION_CHARS,
    MAX_OVERRIDABLE,
    AgentView,
)
from schema.wire.json import JsonField, JsonObjectField
from schema.wire.route import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from worker.client import MAX_REASON_CHARS


def _not_a_boolean(value: object) -> object:
    # pydantic's lax int takes true/false as 1/0; JSON Schema's integer does not.
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not a boolean")
    return value


WholeNumber = Annotated[int, BeforeValidator(_not_a_boolean)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSubmission(_Body):
    """A run request (see ``schema.wire.RunRequest``). ``owner`` is the token's owner: omit
    it, or send the same value; another owner is refused (403 OWNER_MISMATCH, field ``owner``)."""

    owner: str | None = Field(
        default=None, min_length=1, max_length=MAX_OWNER_CHARS, pattern=OWNER_PATTERN,
        description="the token's owner (omit it, or send that one): another owner is refused, 403 OWNER_MISMATCH",
    )
    root_id: UUID | None = Field(default=None, description="a Root of this token's owner; omit it to start a new Root")
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    # Validated by runtime.prepare (it knows the providers and tools); the document shows
    # its real schema, TurnConfig (worker.api.openapi).
    config: JsonObjectField | None = None
    agent: str | None = Field(
        default=None, max_length=80, pattern=AGENT_REF_PATTERN,
        description="in place of config: one of this owner's saved agents, NAME (its latest version) or NAME@VERSION",
    )
    overrides: JsonObjectField | None = Field(
        default=None,
        description="with agent only: values merged into the agent's config, each under one of the agent's "
        "overridable paths",
    )
    webhook: Webhook | None = Field(
        default=None,
        description="POST the run's run_completed / run_failed / run_cancelled / run_suspended events here, "
        "signed (AIDAWORK-Signature); the URL must be under the deployment's AIDAWORK_WEBHOOK_URLS",
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_IDEMPOTENCY_KEY_CHARS,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="the same key (of this owner, within AIDAWORK_IDEMPOTENCY_TTL_S) returns the same run: 201 the "
        "first time, 200 with the same body after; with a different request, 409 IDEMPOTENCY_KEY_REUSED. "
        "Or the Idempotency-Key header (both given: they must be equal)",
    )
    root_policy: RootPolicy = Field(
        default=RootPolicy.ENQUEUE,
        description="when the Root has an active run: enqueue (wait for it), reject (409 ROOT_BUSY, nothing stored), "
        "interrupt (cancel it, keep its messages), rollback (cancel it, drop its messages)",
    )
    priority: WholeNumber = Field(
        default=DEFAULT_PRIORITY,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="orders the run's rounds within its owner's share of the fleet: 9 the most urgent, 0 the least",
    )


# A dotted path under one of the config's fields: what ``worker.client.agents`` accepts.
OverridePath = Annotated[str, Field(pattern=rf"^({'|'.join(TurnConfig.model_fields)})(\.[a-z_]+)*$")]
_OVERRIDABLE = "dotted config paths a run's overrides may set (system_prompt, model.temperature, policy)"


class AgentCreation(_Body):
    """A new saved agent: version 1 of ``name``."""

    name: str = Field(pattern=AGENT_NAME_PATTERN, description="a letter, then up to 63 letters, digits, _ or -")
    description: str = Field(default="", max_length=MAX_AGENT_DESCRIPTION_CHARS)
    # The document shows TurnConfig (worker.api.openapi), as for a run's config.
    config: JsonObjectField
    overridable: list[OverridePath] = Field(default_factory=list, max_length=MAX_OVERRIDABLE, description=_OVERRIDABLE)


class AgentUpdate(_Body):
    """The fields to change (at least one); the others are kept from the latest version.
    A field sent as null is not a change: the document allows no null here."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    description: str | None = Field(default=None, max_length=MAX_AGENT_DESCRIPTION_CHARS)
    config: JsonObjectField | None = None
    overridable: list[OverridePath] | None = Field(default=None, max_length=MAX_OVERRIDABLE, description=_OVERRIDABLE)


class AgentList(_Body):
    agents: list[AgentView] = Field(description="the latest version of each of this owner's agents, by name")


class AgentDeleted(_Body):
    name: str
    deleted_versions: int


class Delivery(_Body):
    tool_call_id: str = Field(min_length=1)
    files: dict[str, str] = Field(description="path -> UTF-8 text, exactly the paths the tool call asked for")


class Prerequisite(_Body):
    key: str = Field(min_length=1)
    value: JsonField = Field(description="any JSON value")


class ToolResult(_Body):
    """The result of a suspended call that waits for one: a client tool's
    (``client_tool``), or an operator's word on an ``at_most_once`` call whose outcome is
    unknown (``outcome_unknown``)."""

    tool_call_id: str = Field(min_length=1)
    result: JsonField = Field(description="any JSON value: what the call returned")
    is_error: StrictBool = Field(default=False, description="the call failed: the model sees a failed result")


class ToolApproval(_Body):
    """A person's decision on a call that waits for approval (``approval``)."""

    # The route's rules as JSON schema: an approval takes no reason, a rejection no args
    # and a reason with some text in it (worker.client.check_rejection).
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"properties": {"decision": {"const": "approve"}, "reason": {"type": "null"}}},
                {
                    "properties": {
                        "decision": {"const": "reject"},
                        "args": {"type": "null"},
                        "reason": {"type": "string", "pattern": r"\S", "maxLength": MAX_REASON_CHARS},
                    },
                    "required": ["reason"],
                },
            ]
        }
    )

    tool_call_id: str = Field(min_length=1)
    decision: Literal["approve", "reject"]
    args: JsonObjectField | None = Field(
        default=None,
        description="approve only: the call's args, edited (the whole object), checked against the tool's schema",
    )
    reason: str | None = Field(
        default=None, description="reject only, and required there: why (shown to the model; at most 2000 characters)"
    )


class ToolRetry(_Body):
    """Run an ``at_most_once`` call whose outcome is unknown (``outcome_unknown``) once
    more, knowingly: it may then have happened twice."""

    tool_call_id: str = Field(min_length=1)


class SubmittedRun(_Body):
    run_id: UUID
    root_id: UUID
    root_seq: int


class DeliveryReceipt(_Body):
    stored: bool = Field(description="false: this exact input (or answer) was already there; nothing changed")
    resuming: bool = Field(description="the run had all its inputs and was sent to resume")


class Cancelled(_Body):
    run_id: UUID
    cancelled: bool


class RootRuns(_Body):
    root_id: UUID
    runs: list[RootRunView]


class IssuedStreamToken(_Body):
    token: str = Field(description="for GET /v1/runs/{run_id}/events?stream_token=..., this run only")
    expires_at: datetime

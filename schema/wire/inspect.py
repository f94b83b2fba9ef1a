"""What the run inspector (``/ui``, and ``GET /v1/runs``, ``GET /v1/runs/{id}/rounds``)
reads: a list of an owner's runs, and one run's rounds with what each round's model saw,
its tool calls with their full outputs, and the model-call ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from schema.wire import RunStatus
from schema.wire.json import JsonField, JsonObjectField


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunListItem(_Wire):
    run_id: UUID
    root_id: UUID
    status: RunStatus
    rounds: int
    model_calls: int
    input: str = Field(description="the run's input, its first 200 characters")
    created_at: datetime
    finished_at: datetime | None


class RunList(_Wire):
    runs: list[RunListItem]


class ModelCallRow(_Wire):
    boundary_seq: int
    attempt: int
    claim_fence: int
    status: str
    request_digest: str
    response_digest: str | None
    input_tokens: int | None
    output_tokens: int | None
    error_code: str | None
    stale: bool
    started_at: datetime
    finished_at: datetime | None


class ToolCallRow(_Wire):
    boundary_seq: int
    tool_call_id: str
    tool_name: str
    tool_domain: str | None
    args: JsonObjectField
    status: str
    result: JsonField = Field(description="the full raw output, whatever the model's context was given")
    suspension: JsonObjectField | None
    approval: JsonObjectField | None
    created_at: datetime


DigestCheck = Literal["verified", "mismatch", "unchecked"]


class RoundView(_Wire):
    boundary_seq: int
    outcome: str
    finish_reason: str | None
    started_at: datetime | None = Field(description="the first model call at this boundary (or the previous commit)")
    finished_at: datetime = Field(description="the round's commit (a resumed round: its resume)")
    duration_ms: float | None
    messages_digest: str = Field(description="as stored with the round")
    recomputed_digest: str | None = Field(description="the chain digest of the context rebuilt from the store")
    digest_check: DigestCheck = Field(
        description="verified: the two are equal; mismatch: they differ (a stored message changed); unchecked: "
        "the round ran under a context since replaced by a rebuild"
    )
    context: list[JsonObjectField] = Field(description="what the model saw: the messages as sent, in order")
    tool_calls: list[ToolCallRow]
    model_calls: list[ModelCallRow]
    duplicate_model_calls: bool = Field(description="more than one model call at this boundary")


class RunRounds(_Wire):
    run_id: UUID
    status: RunStatus
    rounds: list[RoundView]
    # Model calls at a boundary with no committed round yet (the round in progress, or lost).
    pending_model_calls: list[ModelCallRow]

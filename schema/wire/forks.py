"""Forks and the per-round record two runs are compared by.

A fork is a new run, on a new Root, whose first ``at_round`` rounds are its parent's,
copied by the store (``schema.store.forks``), never recomputed; it goes on from there,
with at most one edit: a new user message after round ``at_round`` (``edit_input``), or
the result of one of that round's tool calls replaced (``edit_tool_result``), and its
config maybe changed (``config_overrides``). Rounds are numbered from 1 for people;
round k is ``boundary_seq`` k - 1.

``RoundRecordView`` is what ``aidawork diff`` compares per round: the four digests, the
model's accepted response (the assistant message) and the tool results, as stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from schema.wire.agents import OVERRIDE_PATH_PATTERN
from schema.wire.json import JsonField, JsonObject, JsonValue
from schema.wire.route import Route

MAX_OVERRIDES = 32


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolResultEdit(_Wire):
    """The result one tool call of the fork point's round is given instead of its own."""

    tool_call_id: str = Field(min_length=1, max_length=255, description="a call the round at at_round made")
    result: JsonField = Field(description="any JSON value: what the next model call sees as the call's result")
    is_error: bool = Field(default=False, strict=True, description="the result is a failure (the model is told so)")


class ForkRequest(_Wire):
    """What a fork takes besides the parent's id (the owner is the caller's)."""

    at_round: int = Field(
        ge=0, le=2**31 - 1, strict=True, description="the parent's rounds to copy (1-based: rounds 1..at_round)"
    )
    edit_input: str | None = Field(
        default=None, min_length=1, max_length=1_000_000,
        description="at_round 0: the fork's input; else a user message added after round at_round",
    )
    edit_tool_result: ToolResultEdit | None = Field(
        default=None, description="the result of a tool call of round at_round, replaced"
    )
    config_overrides: dict[str, JsonField] = Field(
        default_factory=dict, max_length=MAX_OVERRIDES,
        description="dotted config paths (policy.max_rounds, model.turns) and their values, set on the parent's "
        "config; objects merge key by key",
        json_schema_extra={"propertyNames": {"pattern": OVERRIDE_PATH_PATTERN}},
    )


@dataclass(frozen=True)
class ForkPlan:
    """A fork request checked and resolved by the client, as the store takes it."""

    parent_id: UUID
    owner: str
    at_round: int
    config: JsonObject  # the fork's config, validated
    input: str | None  # at_round 0: the fork's input (None: the parent's)
    added_message: JsonObject | None  # at_round > 0: the user message added after the round
    tool_result: ToolResultEdit | None
    trace_context: str | None = None


@dataclass(frozen=True)
class Forked:
    run_id: UUID
    root_id: UUID
    parent_id: UUID
    at_round: int  # the boundary the fork's execution starts at
    route: Route


@dataclass(frozen=True)
class ToolResultView:
    tool_call_id: str
    name: str | None
    result: JsonValue
    is_error: bool


@dataclass(frozen=True)
class RoundRecordView:
    """One committed round as stored: its digests, its assistant message (None for a
    round that failed before the model answered) and its tool results, in call order."""

    boundary_seq: int
    outcome: str
    system_digest: str
    messages_digest: str
    tools_digest: str
    accepted_response_digest: str | None
    response: JsonObject | None
    tool_results: tuple[ToolResultView, ...]


@dataclass(frozen=True)
class RunRecordView:
    run_id: UUID
    status: str
    forked_from: UUID | None
    forked_at_round: int | None
    rounds: tuple[RoundRecordView, ...]


RoundVerdict = Literal["same", "differs", "only_in_a", "only_in_b"]
# What a round's comparison looks at, in the order a report names them.
COMPARED = ("system_digest", "messages_digest", "tools_digest", "response", "tool_results")


class RoundDiff(_Wire):
    round: int = Field(description="1-based")
    verdict: RoundVerdict
    differs: list[str] = Field(default_factory=list, description=f"which of {', '.join(COMPARED)}")
    a: dict[str, JsonField] = Field(default_factory=dict, description="run A's values of the fields that differ")
    b: dict[str, JsonField] = Field(default_factory=dict, description="run B's values of the fields that differ")


class RunDiff(_Wire):
    run_a: UUID
    run_b: UUID
    rounds: list[RoundDiff]

    @property
    def same(self) -> bool:
        return all(r.verdict == "same" for r in self.rounds)

"""An exported run (``aidawork export``): a self-contained transcript that ``aidawork
replay`` and the pytest plugin read. Format ``aidawork.case/1``.

What each round's model saw is carried whole: the system prompt and tool specs once (the
run's config fixes them), the context the run started from (``prior``), and per round the
messages it appended, as stored (``body``) and as later model calls saw them (``context``,
when it differs: a slimmed or durable-read tool result). With the round's digests, its
accepted response, its tool calls and results and its HMAC proof, every digest can be
recomputed offline (``runtime.cases.verify``). ``link`` chains the rounds: the last one is
the case's ``chain_digest``, which an operator can publish so that a holder without the
deployment's key can check a case."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from schema.wire.json import JsonField, JsonObjectField

CASE_FORMAT = "aidawork.case/1"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseRun(_Wire):
    run_id: UUID
    root_id: UUID
    owner: str
    status: str
    input: str
    # The saved agent's NAME@VERSION the run was made from (its config is ``config``).
    agent: str | None = None
    config: JsonObjectField = Field(description="the run's config as validated at submit (a TurnConfig)")


class CasePrior(_Wire):
    """The model context the run's first round extended, in context form: the summary of
    an earlier context rebuild (if any), then the Root's earlier messages."""

    messages: list[JsonObjectField] = Field(default_factory=list)
    # The Root position of the run's first message (the prior ones are before it).
    first_position: int = 0


class CaseRequest(_Wire):
    """The digests of what the round's model was sent; ``request_digest`` is the model-call
    ledger's (``runtime.loop.request_digest``)."""

    system_digest: str
    messages_digest: str
    tools_digest: str
    request_digest: str


class CaseMessage(_Wire):
    position: int
    body: JsonObjectField = Field(description="the message as stored (Message.to_json)")
    context: JsonObjectField | None = Field(default=None, description="as the model saw it, when that differs")


class CaseToolCall(_Wire):
    tool_call_id: str
    tool_name: str
    tool_domain: str | None
    args: JsonObjectField
    args_digest: str
    status: str
    result: JsonField = None
    result_digest: str | None = None
    # What the model's context was given, when it differs from ``result`` (a durable
    # local read: the stored placeholder joined with the delivered files).
    context: JsonField = None
    # A person's decision on the call (approval), or the answer it was given from outside
    # (a client tool's result, an operator's word): replay serves such a call from here.
    approval: JsonObjectField | None = None
    answered: bool = False


class CaseRound(_Wire):
    boundary_seq: int
    claim_fence: int
    outcome: str
    finish_reason: str | None = None
    output: str | None = None
    error_code: str | None = None
    request: CaseRequest
    response: JsonObjectField | None = Field(description="the accepted response (ModelResponse.to_json), if any")
    response_digest: str | None
    tool_calls: list[CaseToolCall] = Field(default_factory=list)
    messages: list[CaseMessage] = Field(default_factory=list)
    proof: str | None = Field(description="the round's HMAC-SHA256 proof (runtime.proofs), keyed by the deployment")
    link: str = Field(description="the chain digest of the case up to and including this round")


class Case(_Wire):
    format: Literal["aidawork.case/1"]
    chain_digest: str = Field(description="the last round's link (of the run itself when it has no round)")
    run: CaseRun
    system: str = Field(description="the system prompt every round was sent")
    # The tool specs every round was sent; None when the exporting process's tools differ
    # from the run's (then only ``tools_digest`` says what they were).
    tools: list[JsonObjectField] | None
    prior: CasePrior = Field(default_factory=CasePrior)
    rounds: list[CaseRound]

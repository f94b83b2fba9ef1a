"""What a claim hands the worker: the run's position, the messages its cache lacks, the
previous round as stored (breaker state, projection fields and proof), and the model
response an earlier holder of the same round already paid for. Built by the store
(``schema.store.claims.claim_round``), consumed by the worker and the core."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from schema.wire.json import JsonObject
from schema.wire.route import DEFAULT_PRIORITY, DEFAULT_WEIGHT, Route


@dataclass(frozen=True)
class Checkpoint:
    """Where the run's model context starts (advanced by a context rebuild)."""

    context_start: int
    summary: str | None
    last_build_id: UUID | None
    chain_anchor: int | None


@dataclass(frozen=True)
class LoadedMessage:
    """A committed message of the Root as stored (``messages.body``), with the bodies of
    its durable local reads by path when it is a ``read_files`` result."""

    position: int
    body: JsonObject
    reads: dict[str, str] | None


@dataclass(frozen=True)
class StoredRound:
    """A stored round's projection fields (without run and boundary, which name the row)
    and its proof, as ``runtime.proofs`` verifies them."""

    claim_fence: int
    system_digest: str
    messages_digest: str
    tools_digest: str
    accepted_response_digest: str | None
    proof: str | None


@dataclass(frozen=True)
class RecordedResponse:
    """The latest model response accepted at the claimed boundary by an earlier holder
    whose round never committed (``model_calls``, status succeeded), with the digest of
    the request it answered. The core reuses it only for the very same request."""

    request_digest: str
    response: JsonObject  # ModelResponse.to_json()


@dataclass(frozen=True)
class Claim:
    run_id: UUID
    root_id: UUID
    owner: str
    fence: int
    boundary_seq: int
    attempt: int  # this execution's number: 1 + earlier executions of the round that failed
    claims: int  # claims at this boundary, this one included
    input: str | None  # only on a cold claim
    config: JsonObject | None  # only on a cold claim
    new_messages: tuple[LoadedMessage, ...]  # committed since the caller's after_position
    previous_fingerprint: str | None  # the previous round's breaker state
    previous_repeat_count: int
    previous_round: StoredRound | None
    checkpoint: Checkpoint
    # An earlier holder's accepted model response at this boundary (a round's claim only).
    recorded_response: RecordedResponse | None
    # The W3C traceparent stored with the run at submit (None: not traced).
    trace_context: str | None = None
    # Model calls made at this boundary under earlier claims: a call now is a duplicate.
    earlier_model_calls: int = 0
    # The ledger row of the round's model call, written by this (warm) claim itself
    # (schema.store.claims): the call is made under it, with no before-call statement.
    started_call_id: int | None = None
    # Seconds from the previous round's commit to this claim (None at boundary 0).
    queue_lag_s: float | None = None
    # The owner's weight and the run's priority, read by the claim: how the run's next
    # round is routed (runtime.shares), with no read of its own.
    weight: int = DEFAULT_WEIGHT
    priority: int = DEFAULT_PRIORITY

    @property
    def route(self) -> Route:
        return Route(self.owner, self.weight, self.priority)

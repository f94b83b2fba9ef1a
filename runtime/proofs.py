"""Round ownership proofs.

A round's projection (``OwnedRoundProjection``: run id, boundary, claim fence and the
digests of the system prompt, messages, tools and accepted response) and a suspended
tool call's projection (``OwnedToolCallProjection``) carry an HMAC-SHA256 proof keyed by
the server secret, so they survive serialization (a Celery message, a database row) and
nobody without the secret can forge or alter one by guessing text. Inside one process,
the authority also remembers the projections it issued (a weak-keyed set): a consumer
that requires ``issued_here`` refuses an object built anywhere else, even with a valid
proof copied into it.
"""

from __future__ import annotations

import hashlib
import hmac
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import NotRequired, TypedDict, Unpack
from uuid import UUID

from runtime.canonical import canonical_json
from runtime.errors import AidaworkError
from schema.wire.claim import StoredRound
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonObject

ROUND_PROOF_INVALID = ErrorCode.ROUND_PROOF_INVALID


class ProjectionRefused(AidaworkError):
    """A projection's proof does not verify, or it was not issued by this process's
    driver. Retrying cannot help."""

    code = ROUND_PROOF_INVALID


@dataclass(frozen=True, eq=False)
class OwnedRoundProjection:
    run_id: str
    boundary_seq: int
    claim_fence: int
    system_digest: str
    messages_digest: str
    tools_digest: str
    accepted_response_digest: str | None
    proof: str

    def fields(self) -> JsonObject:
        data: JsonObject = asdict(self)
        del data["proof"]
        return data


@dataclass(frozen=True, eq=False)
class OwnedToolCallProjection:
    run_id: str
    boundary_seq: int
    claim_fence: int
    tool_call_id: str
    tool_domain: str
    args_digest: str
    invocation_id: str
    work_owner: str
    round_proof: str
    proof: str
    # What the call waits for (``ToolSuspension.digest``), for the waits answered about the
    # call itself (client tools, approvals, unknown outcomes): a stored suspension altered
    # from or into one of them does not verify. Absent for the older kinds, whose proofs
    # (stored before it existed) must keep verifying.
    suspension_digest: str | None = None

    def fields(self) -> JsonObject:
        data: JsonObject = asdict(self)
        del data["proof"]
        if data["suspension_digest"] is None:
            del data["suspension_digest"]
        return data


class RoundFields(TypedDict):
    """What a round's proof covers (``OwnedRoundProjection`` less its proof)."""

    run_id: str
    boundary_seq: int
    claim_fence: int
    system_digest: str
    messages_digest: str
    tools_digest: str
    accepted_response_digest: str | None


class ToolCallFields(TypedDict):
    """What a suspended call's proof covers (``OwnedToolCallProjection`` less its proof)."""

    run_id: str
    boundary_seq: int
    claim_fence: int
    tool_call_id: str
    tool_domain: str
    args_digest: str
    invocation_id: str
    work_owner: str
    round_proof: str
    suspension_digest: NotRequired[str | None]


class ProofAuthority:
    """Issues and verifies projections with one server secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the proof secret must be at least 16 bytes")
        self._secret = secret
        self._issued: weakref.WeakSet[object] = weakref.WeakSet()

    def sign(self, kind: str, fields: Mapping[str, object]) -> str:
        message = canonical_json({"kind": kind, "fields": fields}).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def issue_round(self, **fields: Unpack[RoundFields]) -> OwnedRoundProjection:
        projection = OwnedRoundProjection(**fields, proof=self.sign("round", fields))
        self._issued.add(projection)
        return projection

    def issue_tool_call(self, **fields: Unpack[ToolCallFields]) -> OwnedToolCallProjection:
        if fields.get("suspension_digest") is None:
            fields.pop("suspension_digest", None)
        projection = OwnedToolCallProjection(**fields, proof=self.sign("tool_call", fields))
        self._issued.add(projection)
        return projection

    def verifies(self, kind: str, fields: Mapping[str, object], proof: str) -> bool:
        # Bytes: compare_digest refuses str with non-ASCII characters (a forged proof may have them).
        return hmac.compare_digest(self.sign(kind, fields).encode(), proof.encode("utf-8", "surrogatepass"))

    def verifies_stored_round(self, run_id: UUID, boundary_seq: int, stored: StoredRound) -> bool:
        """Whether a round row as stored carries the proof its driver issued: a row
        altered or written by anyone without the server secret does not verify. Checked
        by the next round (the previous round's row) and by a resume (the suspended one)."""
        if stored.proof is None:
            return False
        fields = asdict(stored)
        del fields["proof"]
        fields.update(run_id=str(run_id), boundary_seq=boundary_seq)
        return self.verifies("round", fields, stored.proof)

    def issued_here(self, projection: object) -> bool:
        return projection in self._issued

    def require_issued(self, projection: object) -> None:
        if not self.issued_here(projection):
            raise ProjectionRefused("the projection was not issued by this process's driver")

"""Original tool resume: re-run the suspended tool calls of a round, without calling the
model again, once their inputs have been delivered.

The one who resumes carries an ``OriginalToolRoundResume`` per suspended call. It is
checked strictly, field by field, against the stored suspension (run, invocation,
boundary, tool call, domain, args digest, Work owner, the suspending claim's fence and
the round's proof), and its own proof must verify under the server secret: any mismatch
is a ``ResumeRefused`` and nothing is changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from uuid import UUID

from runtime.deps import OrchestratorDeps
from runtime.errors import AidaworkError
from runtime.hooks import NoHooks, RoundHooks
from runtime.loop import Appender, close_tool_round
from runtime.messages import ToolCall
from runtime.outcomes import RoundDigests, RoundEvent, RoundResult
from runtime.proofs import ProofAuthority
from runtime.state import RunState
from runtime.tool_calls import run_tool, with_call_projection
from runtime.tools import ToolInputs, ToolSuspension
from schema.wire import EventKind, OriginalToolRoundResume
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonValue
from schema.wire.vocab import ToolStatus

CHECKED_FIELDS = (
    "run_id",
    "invocation_id",
    "boundary_seq",
    "tool_call_id",
    "tool_domain",
    "args_digest",
    "work_owner",
    "claim_fence",
    "round_proof",
)


class ResumeRefused(AidaworkError):
    """A resume does not match the stored suspension (or its proof does not verify).
    Nothing was changed; retrying the same resume cannot help."""

    code = ErrorCode.RESUME_REFUSED

    def __init__(self, run_id: UUID, field: str, reason: str) -> None:
        super().__init__(f"run {run_id}: resume refused on {field}: {reason}")
        self.run_id = run_id
        self.field = field


@dataclass(frozen=True)
class StoredSuspension:
    """A suspended tool call as stored, with the round it belongs to."""

    call: ToolCall
    resume: OriginalToolRoundResume  # built from the stored columns
    suspension: ToolSuspension


def check_resume(proofs: ProofAuthority, resume: OriginalToolRoundResume, stored: StoredSuspension) -> None:
    """Strict field-by-field check against the stored suspension, then the proof."""
    for name in CHECKED_FIELDS:
        given, expected = getattr(resume, name), getattr(stored.resume, name)
        if given != expected:
            raise ResumeRefused(resume.run_id, name, f"{given!r} does not match the stored {expected!r}")
    fields = resume.projection_fields()
    covered = stored.suspension.proof_digest()
    if covered is not None:
        fields["suspension_digest"] = covered
    if not proofs.verifies("tool_call", fields, resume.proof):
        raise ResumeRefused(resume.run_id, "proof", "the proof does not verify")


def check_resumes(
    proofs: ProofAuthority, resumes: Sequence[OriginalToolRoundResume], stored: Sequence[StoredSuspension]
) -> None:
    """Every stored suspension of the round must be resumed, each by its own resume."""
    by_call = {s.call.id: s for s in stored}
    if not resumes:
        raise ResumeRefused(stored[0].resume.run_id if stored else UUID(int=0), "resumes", "no resume given")
    seen = set()
    for resume in resumes:
        suspension = by_call.get(resume.tool_call_id)
        if suspension is None:
            raise ResumeRefused(resume.run_id, "tool_call_id", f"{resume.tool_call_id!r} is not suspended")
        check_resume(proofs, resume, suspension)
        seen.add(resume.tool_call_id)
    missing = sorted(set(by_call) - seen)
    if missing:
        raise ResumeRefused(resumes[0].run_id, "tool_call_id", f"no resume for suspended calls {missing}")


def resume_original_tool_round(
    deps: OrchestratorDeps,
    state: RunState,
    digests: RoundDigests,
    stored: Sequence[StoredSuspension],
    inputs: Mapping[str, ToolInputs],
    hooks: RoundHooks | None = None,
) -> RoundResult:
    """Re-run exactly the suspended calls of round ``state.boundary_seq`` with their
    delivered ``inputs`` (by tool call id); the model is not called. A call that still
    lacks input suspends again. The caller has checked the resumes (``check_resumes``)
    before claiming the run."""
    hooks = hooks or NoHooks()
    new = Appender.after(state, deps)
    round_proof = stored[0].resume.round_proof
    runs = []
    for suspension in stored:
        call_inputs = inputs.get(suspension.call.id, ToolInputs())
        invocation, context = run_tool(deps, state, suspension.call, call_inputs, hooks)
        invocation = replace(invocation, resumes_invocation_id=suspension.resume.invocation_id)
        if invocation.status == ToolStatus.SUSPENDED:  # still missing input: suspend again, under this claim
            invocation = with_call_projection(deps, state, invocation, round_proof)
        runs.append((invocation, context))
    resumed_calls: list[JsonValue] = [s.call.id for s in stored]
    events = [RoundEvent(EventKind.ROUND_RESUMED, {"boundary_seq": state.boundary_seq, "tool_calls": resumed_calls})]
    return close_tool_round(deps, state, new, runs, events, digests, resumed=True)

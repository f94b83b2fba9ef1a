"""The I/O shell of a resume: the original tool calls of a suspended round re-run,
without calling the model, once their inputs have been delivered.

1. load the stored suspension and the delivered inputs (read only);
2. check every ``OriginalToolRoundResume`` strictly against it (a mismatch is a
   ``ResumeRefused``: nothing has been written);
3. claim the run, guarded on that very suspension (fence + 1);
4. re-run the suspended calls and commit, as any round (``worker.engine.round.run_claimed``).
"""

from __future__ import annotations

import time
from uuid import UUID

from pydantic import TypeAdapter, ValidationError

from runtime.canonical import require_json
from runtime.errors import RequestInvalid
from runtime.messages import ToolCall
from runtime.outcomes import RoundDigests
from runtime.prepare import invalid_from
from runtime.resume import ResumeRefused, StoredSuspension, check_resumes, resume_original_tool_round
from runtime.tools import LocalFile, ToolAnswer, ToolInputs, ToolSuspension
from schema.store.answers import Answer
from schema.store.resumes import SuspendedCall, SuspensionMaterial
from schema.wire import OriginalToolRoundResume
from worker.engine.bootstrap import WorkerContext
from worker.engine.round import RoundDisposition, claim_or_refuse, run_claimed

_RESUMES = TypeAdapter(list[OriginalToolRoundResume])


def parse_resumes(payload: object) -> list[OriginalToolRoundResume]:
    """The payload of a ``resume_round`` task as resumes, or ``RequestInvalid`` naming the
    field (``resumes``, ``resumes[0].proof``): whatever the broker delivered, a payload
    that is not a non-empty list of resumes is refused, never a crash."""
    require_json(payload, "resumes")
    if not isinstance(payload, list) or not payload:
        raise RequestInvalid("resumes", "must be a non-empty list of resumes")
    try:
        return _RESUMES.validate_python(payload)
    except ValidationError as exc:
        raise invalid_from(exc, "resumes") from None


def execute_resume(ctx: WorkerContext, resumes: list[OriginalToolRoundResume]) -> RoundDisposition:
    if not resumes or len({(r.run_id, r.boundary_seq) for r in resumes}) != 1:
        raise ResumeRefused(resumes[0].run_id if resumes else UUID(int=0), "resumes", "one run and round per resume")
    material = ctx.store.load_suspension(resumes[0].invocation_id)
    if material is None:
        raise ResumeRefused(resumes[0].run_id, "invocation_id", "no suspended tool call has this invocation id")
    run_id, boundary_seq = material.run_id, material.boundary_seq
    stored = [_stored(call) for call in material.calls]
    proofs = ctx.runtime.base.proofs
    # Checked once, before the claim: a refused resume changes nothing.
    check_resumes(proofs, resumes, stored)
    if not proofs.verifies_stored_round(run_id, boundary_seq, material.round):
        raise ResumeRefused(run_id, "round_proof", "the suspended round's stored proof does not verify")

    cached = ctx.runtime.contexts.get(run_id)
    claim_started_ns = time.time_ns()
    held_fence = ctx.leases.take_unreleased(run_id)
    claim = claim_or_refuse(
        ctx,
        run_id,
        boundary_seq,
        lambda: ctx.store.claim_round(
            run_id,
            boundary_seq,
            lease_s=ctx.settings.lease_s,
            after_position=cached.last_position if cached else -1,
            cold=cached is None,
            holder=ctx.leases.worker_id,
            resume_of=[r.invocation_id for r in resumes],
            held_fence=held_fence,
        ),
        resume=True,
    )
    if claim is None:
        return RoundDisposition.DROPPED
    observation = ctx.observe.claimed(claim, claim_started_ns, resume=True)
    stored_round = material.round
    digests = RoundDigests(
        stored_round.system_digest,
        stored_round.messages_digest,
        stored_round.tools_digest,
        stored_round.accepted_response_digest,
    )
    inputs = _inputs(material)
    return run_claimed(
        ctx,
        claim,
        cached,
        lambda deps, state, hooks: resume_original_tool_round(deps, state, digests, stored, inputs, hooks),
        observation,
    )


def _stored(call: SuspendedCall) -> StoredSuspension:
    return StoredSuspension(
        call=ToolCall(id=call.tool_call_id, name=call.tool_name, args=call.args),
        resume=call.resume,
        suspension=ToolSuspension.from_json(call.suspension),
    )


def _answer(answer: Answer | None, wait_id: str | None = None) -> ToolAnswer | None:
    if answer is None:
        return None
    return ToolAnswer(answer.kind, answer.value, answer.is_error, answer.reason, wait_id=wait_id)


def _inputs(material: SuspensionMaterial) -> dict[str, ToolInputs]:
    inputs = {}
    for call in material.calls:
        call_id = call.tool_call_id
        files = {
            path: LocalFile(path=path, content=f["content"], digest=f["digest"], size_bytes=f["size_bytes"])
            for path, f in material.files.get(call_id, {}).items()
        }
        inputs[call_id] = ToolInputs(
            files=files,
            prerequisites=material.prerequisites,
            answer=_answer(material.answers.get(call_id), call.resume.invocation_id),
            approval=_answer(material.approvals.get(call_id)),
        )
    return inputs

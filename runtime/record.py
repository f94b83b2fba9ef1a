"""The round as the store takes it (``schema.wire.record.RoundRecord``), built once from
the core's ``RoundResult`` and the claim it ran under. Pure: the caller checks that the
result's projections were issued by its driver before storing it."""

from __future__ import annotations

from runtime.outcomes import Fail, Finish, RoundResult, ToolInvocation
from schema.wire import RunStatus
from schema.wire.claim import Claim
from schema.wire.record import EventRecord, MessageRecord, RoundRecord, ToolInvocationRecord
from schema.wire.vocab import RoundOutcomeKind

# The run's status after a round with this outcome.
STATUS_AFTER = {
    RoundOutcomeKind.CONTINUE: RunStatus.RUNNING,
    RoundOutcomeKind.SUSPEND: RunStatus.SUSPENDED,
    RoundOutcomeKind.FINISH: RunStatus.COMPLETED,
    RoundOutcomeKind.FAIL: RunStatus.FAILED,
}


def tool_record(invocation: ToolInvocation) -> ToolInvocationRecord:
    projection = invocation.projection
    return ToolInvocationRecord(
        tool_call_id=invocation.call.id,
        tool_name=invocation.call.name,
        tool_domain=invocation.domain,
        args=invocation.call.args,
        args_digest=invocation.args_digest,
        status=invocation.status,
        result=invocation.result,
        result_digest=invocation.result_digest,
        suspension=invocation.suspension.to_json() if invocation.suspension else None,
        invocation_id=projection.invocation_id if projection else invocation.resumes_invocation_id,
        work_owner=projection.work_owner if projection else None,
        proof=projection.proof if projection else None,
        resumes_invocation_id=invocation.resumes_invocation_id,
        approval=invocation.approval.decision_json() if invocation.approval else None,
    )


def round_record(claim: Claim, result: RoundResult) -> RoundRecord:
    outcome = result.outcome
    kind = RoundOutcomeKind(outcome.kind)
    return RoundRecord(
        run_id=claim.run_id,
        boundary_seq=claim.boundary_seq,
        fence=claim.fence,
        outcome=kind,
        status=STATUS_AFTER[kind],
        output=outcome.output if isinstance(outcome, Finish) else None,
        error_code=outcome.error_code if isinstance(outcome, Fail) else None,
        error_message=outcome.message if isinstance(outcome, Fail) else None,
        system_digest=result.digests.system,
        messages_digest=result.digests.messages,
        tools_digest=result.digests.tools,
        accepted_response_digest=result.digests.accepted_response,
        tool_fingerprint=result.tool_fingerprint,
        repeat_count=result.repeat_count,
        proof=result.projection.proof if result.projection else None,
        resumed=result.resumed,
        messages=tuple(MessageRecord(m.position, m.message.to_json(), m.chain_digest) for m in result.new_messages),
        tools=tuple(tool_record(t) for t in result.tool_invocations),
        events=tuple(EventRecord(e.kind, e.data) for e in result.events),
        finish_reason=result.finish_reason,
    )

"""``aidawork export``: one run's case (``schema.wire.case``), built from the store's rows
(``schema.store.cases``) with the runtime's own context rules, then verified as a reader
will verify it (``runtime.cases.verify``), so an export that would not verify is refused
instead of written."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import structlog
from sqlalchemy import Engine

from runtime.canonical import digest
from runtime.cases.chain import links, run_link
from runtime.cases.replay import RecordedModel, prepare_replay
from runtime.cases.verify import CaseInvalid, case_policy, verify_case
from runtime.context import context_form, durable_local_read_context, loaded_context
from runtime.deps import Runtime
from runtime.errors import RequestInvalid
from runtime.messages import Message
from runtime.models.base import ModelResponse
from runtime.proofs import ProofAuthority
from runtime.rebuild import checkpoint_history
from schema.store.cases import CaseMessageRow, CaseRows, read_case_rows
from schema.wire.case import CASE_FORMAT, Case, CaseMessage, CasePrior, CaseRequest, CaseRound, CaseRun, CaseToolCall
from schema.wire.errors import AidaworkError, ErrorCode
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import MessageRole

log = structlog.get_logger("aidawork.export")


class ExportRefused(AidaworkError):
    """The run cannot be exported as a self-contained case; nothing was written."""

    code = ErrorCode.EXPORT_REFUSED


def export_case(
    engine: Engine, runtime: Runtime, run_id: UUID, *, owner: str | None = None, proofs: ProofAuthority | None = None
) -> Case:
    """The run's case (``RunNotFound`` unless it exists, for ``owner`` when given),
    verified with ``proofs`` when given."""
    case = build_case(read_case_rows(engine, run_id, owner), runtime)
    try:
        verify_case(case, proofs=proofs)
    except CaseInvalid as exc:
        raise ExportRefused(f"run {run_id}: the stored record does not verify: {exc.message}") from None
    log.info("run_exported", run_id=str(run_id), rounds=len(case.rounds), chain_digest=case.chain_digest)
    return case


def build_case(rows: CaseRows, runtime: Runtime) -> Case:
    run = rows.run
    run_id = run["id"]
    if run["rebuilds"]:
        raise ExportRefused(f"run {run_id}: its context was rebuilt; a case holds runs with a single context")
    if run["error_code"] == ErrorCode.ROLLED_BACK:
        raise ExportRefused(f"run {run_id}: its messages were dropped by a rollback")
    config: JsonObject = run["config"]
    own = [m for m in rows.messages if m.run_id == run_id]
    earlier = [m.message for m in rows.messages if m.run_id != run_id]
    summary, _ = checkpoint_history(run["summary"])
    shell = Case(
        format=CASE_FORMAT,
        chain_digest="",
        run=CaseRun(run_id=run_id, root_id=run["root_id"], owner=run["owner"], status=run["status"],
                    input=run["input"], agent=run["agent"], config=config),
        system=str(config.get("system_prompt", "")),
        tools=None,
        prior=CasePrior(messages=[m.to_json() for m in summary], first_position=run["context_start_position"]),
        rounds=[],
    )
    max_output_bytes = case_policy(shell).max_tool_output_bytes
    prior, _ = loaded_context(earlier, max_output_bytes)
    first = own[0].message.position if own else run["context_start_position"] + len(earlier)
    rounds = [_round(rows, row, own, max_output_bytes) for row in rows.rounds]
    case = shell.model_copy(update={
        "prior": CasePrior(messages=[m.to_json() for m in summary + prior], first_position=first),
        "tools": _tool_specs(runtime, shell, rows.rounds),
        "rounds": rounds,
    })
    return _linked(case)


def _linked(case: Case) -> Case:
    """The case with each round's link and the chain digest filled in."""
    found = links(case)
    rounds = [r.model_copy(update={"link": link}) for r, link in zip(case.rounds, found, strict=True)]
    return case.model_copy(update={"rounds": rounds, "chain_digest": found[-1] if found else run_link(case)})


def _tool_specs(runtime: Runtime, case: Case, rounds: list[dict[str, Any]]) -> list[JsonObject] | None:
    """The tool specs the run's config composes in this process, if they are the ones its
    rounds were sent (same digest); else None (the case then carries their digest only)."""
    try:
        specs = list(prepare_replay(runtime, case.run.config, case.run.owner, RecordedModel(case)).tool_specs)
    except RequestInvalid as exc:
        log.warning("export_tools_unknown", run_id=str(case.run.run_id), error=exc.message)
        return None
    if rounds and any(r["tools_digest"] != digest(specs) for r in rounds):
        log.warning("export_tools_differ", run_id=str(case.run.run_id))
        return None
    return specs


def _round(rows: CaseRows, row: dict[str, Any], own: list[CaseMessageRow], max_output_bytes: int) -> CaseRound:
    seq = row["boundary_seq"]
    messages = [m.message for m in own if m.boundary_seq == seq]
    reads = {str(m.body.get("tool_call_id")): m for m in messages if m.reads is not None}
    run = rows.run
    last = seq == rows.rounds[-1]["boundary_seq"]
    request = CaseRequest(
        system_digest=row["system_digest"],
        messages_digest=row["messages_digest"],
        tools_digest=row["tools_digest"],
        request_digest=digest(
            {"system": row["system_digest"], "messages": row["messages_digest"], "tools": row["tools_digest"]}
        ),
    )
    return CaseRound(
        boundary_seq=seq,
        claim_fence=row["claim_fence"],
        outcome=row["outcome"],
        finish_reason=row["finish_reason"],
        output=run["output"] if last and row["outcome"] == "finish" else None,
        error_code=run["error_code"] if last and row["outcome"] == "fail" else None,
        request=request,
        response=_response(rows, row, messages),
        response_digest=row["accepted_response_digest"],
        tool_calls=[_tool_call(t, reads) for t in rows.tool_calls if t["boundary_seq"] == seq],
        messages=[_message(m, max_output_bytes) for m in messages],
        proof=row["proof"],
        link="",
    )


def _message(stored: Any, max_output_bytes: int) -> CaseMessage:
    context = context_form(Message.from_json(stored.body), max_output_bytes, stored.reads).to_json()
    return CaseMessage(position=stored.position, body=stored.body,
                       context=None if digest(context) == digest(stored.body) else context)


def _tool_call(row: dict[str, Any], reads: dict[str, Any]) -> CaseToolCall:
    read = reads.get(row["tool_call_id"])
    context: JsonValue = None if read is None else durable_local_read_context(row["result"], read.reads)
    return CaseToolCall(
        tool_call_id=row["tool_call_id"], tool_name=row["tool_name"], tool_domain=row["tool_domain"],
        args=row["args"], args_digest=row["args_digest"], status=row["status"], result=row["result"],
        result_digest=row["result_digest"], context=context, approval=row["approval"],
        answered=bool(row["answered"]) or read is not None,
    )


def _response(rows: CaseRows, row: dict[str, Any], messages: list[Any]) -> JsonObject | None:
    """The accepted response: the ledger's, else rebuilt from the round's assistant message
    (a provider's reused call ids were renamed after the ledger kept the response)."""
    accepted = row["accepted_response_digest"]
    if accepted is None:
        return None
    for seq, response_digest, response in rows.responses:
        if seq == row["boundary_seq"] and response_digest == accepted:
            return response
    said = next((m.body for m in messages if m.body.get("role") == MessageRole.ASSISTANT), None)
    if said is not None:
        message = Message.from_json(said)
        rebuilt = ModelResponse(message.content, message.tool_calls, finish_reason=row["finish_reason"]).to_json()
        if digest(rebuilt) == accepted:
            return rebuilt
    raise ExportRefused(f"round {row['boundary_seq']}: its accepted response is not on record")

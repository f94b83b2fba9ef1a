"""Reading and verifying an exported case, offline: every digest it carries is recomputed
from what it holds, each round's messages are checked against its response and tool
results (so a result changed in one place and not the other is found), each round's proof
with the deployment's key when one is given, and the digest chain, against a published
digest when one is given. The first check that fails raises ``CaseTampered`` naming the
round; nothing is replayed from a case that does not verify."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from runtime.canonical import chain_digest, digest
from runtime.cases.chain import chain_of, links
from runtime.config import Policy
from runtime.context import slim_tool_results_for_next_round
from runtime.messages import ToolCall, tool_message
from runtime.models.base import ModelResponse
from runtime.prepare import format_loc, integral_numbers
from runtime.proofs import ProofAuthority
from schema.wire.case import CASE_FORMAT, Case, CaseRound, CaseToolCall
from schema.wire.errors import AidaworkError, ErrorCode
from schema.wire.json import JsonObject
from schema.wire.vocab import MessageRole, ToolStatus


class CaseInvalid(AidaworkError):
    """The file is not a case this code can read (not the ``aidawork.case/1`` format, or a
    field of the wrong shape). Retrying cannot help."""

    code = ErrorCode.CASE_INVALID


class CaseTampered(CaseInvalid):
    """A digest, a proof or the chain of a case does not verify: it was changed after
    export. ``boundary_seq`` names the round (None: the case as a whole); the message counts
    rounds from 1, as ``aidawork diff`` and ``fork`` do."""

    code = ErrorCode.CASE_TAMPERED

    def __init__(self, boundary_seq: int | None, problem: str) -> None:
        where = "the case" if boundary_seq is None else f"round {boundary_seq + 1}"
        super().__init__(f"{where}: {problem}")
        self.boundary_seq = boundary_seq


def parse_case(raw: object) -> Case:
    """The case in ``raw`` (decoded JSON), or ``CaseInvalid`` naming what is wrong."""
    if not isinstance(raw, Mapping):
        raise CaseInvalid("a case must be a JSON object")
    if raw.get("format") != CASE_FORMAT:
        raise CaseInvalid(f"not an {CASE_FORMAT} case (format: {raw.get('format')!r})")
    try:
        return Case.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise CaseInvalid(f"{format_loc(err['loc'])}: {err['msg']}") from None


def case_policy(case: Case) -> Policy:
    """The run's policy, as its config states it (the context-form rules depend on it)."""
    policy = case.run.config.get("policy", {})
    try:
        return Policy.model_validate(integral_numbers(policy))
    except ValidationError as exc:
        raise CaseInvalid(f"run.config.policy: {exc.errors()[0]['msg']}") from None


@dataclass(frozen=True)
class Verified:
    chain_digest: str
    proofs_checked: bool
    published_checked: bool


def verify_case(case: Case, *, proofs: ProofAuthority | None = None, published: str | None = None) -> Verified:
    """Check everything the case says of itself; with ``proofs`` (the deployment's key)
    each round's proof, with ``published`` the chain against that digest."""
    max_output_bytes = case_policy(case).max_tool_output_bytes
    if case.system != case.run.config.get("system_prompt", ""):
        raise CaseTampered(None, "its system prompt is not the one of the run's config")
    running = _prior_digest(case)
    for index, round_ in enumerate(case.rounds):
        if round_.boundary_seq != index:
            raise CaseTampered(round_.boundary_seq, f"rounds out of order (expected boundary_seq {index})")
        running = _check_round(case, round_, running, max_output_bytes)
    for round_, link in zip(case.rounds, links(case), strict=True):
        if proofs is not None and not _proof_verifies(proofs, case, round_):
            raise CaseTampered(
                round_.boundary_seq,
                "its proof does not verify with this deployment's key (AIDAWORK_SECRET_KEY): the round was "
                "changed, or the case comes from another deployment",
            )
        if round_.link != link:
            raise CaseTampered(round_.boundary_seq, "the digest chain breaks here (the round or the run was changed)")
    chain = chain_of(case)
    if case.chain_digest != chain:
        raise CaseTampered(None, "the chain_digest does not match the rounds' digest chain")
    if published is not None and published != chain:
        raise CaseTampered(None, f"the digest chain ends at {chain}, not at the published {published}")
    return Verified(chain, proofs is not None, published is not None)


def _prior_digest(case: Case) -> str:
    current = ""
    for body in case.prior.messages:
        current = chain_digest(current, body)
    return current


def _check_round(case: Case, round_: CaseRound, running: str, max_output_bytes: int) -> str:
    """The round's own digests and its messages; the context chain after the round."""
    seq, request = round_.boundary_seq, round_.request
    expected_request = digest(
        {"system": request.system_digest, "messages": request.messages_digest, "tools": request.tools_digest}
    )
    if request.request_digest != expected_request:
        raise CaseTampered(seq, "its request_digest does not match its system, messages and tools digests")
    if request.system_digest != digest(case.system):
        raise CaseTampered(seq, "its system_digest does not match the case's system prompt")
    if case.tools is not None and request.tools_digest != digest(case.tools):
        raise CaseTampered(seq, "its tools_digest does not match the case's tool specs")
    if (round_.response is None) != (round_.response_digest is None) or (
        round_.response is not None and round_.response_digest != digest(round_.response)
    ):
        raise CaseTampered(seq, "its response does not match its response_digest")
    calls = {c.tool_call_id: c for c in round_.tool_calls}
    for call in round_.tool_calls:
        _check_call(seq, call)
    asked = False
    for message in round_.messages:
        if message.body.get("role") == MessageRole.ASSISTANT and not asked:
            asked = _check_asked(seq, running, round_)
        if message.body.get("role") == MessageRole.USER and message.body.get("content") != case.run.input:
            raise CaseTampered(seq, "its input message does not match the run's input")
        _check_message(seq, message.body, message.context, round_, calls, max_output_bytes)
        running = chain_digest(running, message.context or message.body)
    if not asked and running != request.messages_digest:
        raise CaseTampered(seq, "its messages do not match its messages_digest")
    return running


def _check_asked(seq: int, running: str, round_: CaseRound) -> bool:
    if running != round_.request.messages_digest:
        raise CaseTampered(seq, "the messages the model was sent do not match its messages_digest")
    return True


def _check_call(seq: int, call: CaseToolCall) -> None:
    if call.args_digest != digest(call.args):
        raise CaseTampered(seq, f"tool call {call.tool_call_id}: its args do not match its args_digest")
    completed = call.status != ToolStatus.SUSPENDED
    if completed and (call.result_digest is None or call.result_digest != digest(call.result)):
        raise CaseTampered(seq, f"tool call {call.tool_call_id}: its result does not match its result_digest")


def _check_message(
    seq: int,
    body: JsonObject,
    context: JsonObject | None,
    round_: CaseRound,
    calls: Mapping[str, CaseToolCall],
    max_output_bytes: int,
) -> None:
    """An assistant message is the response; a tool message is its call's result, and its
    context form is what the context rules make of the result."""
    role = body.get("role")
    if role == MessageRole.ASSISTANT:
        response = ModelResponse.from_json(round_.response) if round_.response is not None else None
        if response is None or not _same(response.as_message().to_json(), body) or context not in (None, body):
            raise CaseTampered(seq, "its assistant message does not match its response")
        listed = [(c.id, c.name, c.args) for c in response.tool_calls]
        recorded = [(c.tool_call_id, c.tool_name, c.args) for c in round_.tool_calls]
        if sorted(listed, key=str) != sorted(recorded, key=str):
            raise CaseTampered(seq, "its tool calls do not match the calls of its response")
        return
    if role != MessageRole.TOOL:
        return
    call = calls.get(str(body.get("tool_call_id")))
    if call is None:
        raise CaseTampered(seq, f"a tool message answers {body.get('tool_call_id')!r}, which no call of it has")
    as_call = ToolCall(call.tool_call_id, call.tool_name, call.args)
    failed = call.status == ToolStatus.FAILED
    stored = tool_message(as_call, call.result, is_error=failed)
    seen = slim_tool_results_for_next_round(
        tool_message(as_call, call.result if call.context is None else call.context, is_error=failed),
        max_output_bytes,
    )
    if not _same(body, stored.to_json()) or not _same(context or body, seen.to_json()):
        raise CaseTampered(seq, f"tool call {call.tool_call_id}: its message does not match its result")


def _same(a: JsonObject, b: JsonObject) -> bool:
    """Equal as JSON (``2`` and ``2.0`` alike: a jsonb column may have written either)."""
    return digest(a) == digest(b)


def _proof_verifies(proofs: ProofAuthority, case: Case, round_: CaseRound) -> bool:
    if round_.proof is None:
        return False
    fields = {
        "run_id": str(case.run.run_id),
        "boundary_seq": round_.boundary_seq,
        "claim_fence": round_.claim_fence,
        "system_digest": round_.request.system_digest,
        "messages_digest": round_.request.messages_digest,
        "tools_digest": round_.request.tools_digest,
        "accepted_response_digest": round_.response_digest,
    }
    return proofs.verifies("round", fields, round_.proof)

"""What a replay found, round by round: ``same`` (every digest, the outcome and every tool
call as recorded), ``differs`` (and what: ``system``, ``messages``, ``tools``, ``response``,
``outcome``, ``tool_calls``, ``tool_name``, ``args``, ``result``, ``schema``), ``new`` (a
round the record does not have) or ``missing`` (a recorded round the replay did not reach).
A round whose tool call drifted (a tool not enabled here, args the tool's schema refuses,
a call the record cannot serve) carries ``drift``: the replay stopped there, failing closed.
Rounds are shown counted from 1, as ``aidawork diff`` and ``fork`` count them (the JSON
also gives each round's ``boundary_seq``, from 0)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from runtime.outcomes import Fail, RoundResult, ToolInvocation
from schema.wire.case import CaseRound, CaseToolCall
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import ToolStatus


class RoundStatus(StrEnum):
    SAME = "same"
    DIFFERS = "differs"
    NEW = "new"
    MISSING = "missing"


@dataclass(frozen=True)
class RoundReport:
    boundary_seq: int
    status: RoundStatus
    what: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # Why the replay stopped at this round (a drifted call), or None.
    drift: str | None = None

    def to_json(self) -> JsonObject:
        return {"round": self.boundary_seq + 1, "boundary_seq": self.boundary_seq, "status": self.status.value,
                "what": list(self.what), "notes": list(self.notes), "drift": self.drift}

    def line(self) -> str:
        text = f"round {self.boundary_seq + 1}: {self.status.value}"
        if self.what:
            text += f" ({', '.join(self.what)})"
        if self.drift:
            text += f" - DRIFT: {self.drift}"
        return text + "".join(f"\n    {note}" for note in self.notes)


@dataclass(frozen=True)
class ReplayReport:
    run_id: str
    model: str  # recorded | live
    tools: str  # recorded | live
    chain_digest: str
    proofs_checked: bool
    rounds: tuple[RoundReport, ...] = field(default_factory=tuple)

    @property
    def drifted(self) -> RoundReport | None:
        return next((r for r in self.rounds if r.drift is not None), None)

    @property
    def ok(self) -> bool:
        """No call drifted, and (with the recorded model) every round is the same; a live
        model is expected to answer differently, so only a drift fails its replay."""
        if self.drifted is not None:
            return False
        return self.model == "live" or all(r.status == RoundStatus.SAME for r in self.rounds)

    def to_json(self) -> JsonObject:
        rounds: list[JsonValue] = [r.to_json() for r in self.rounds]
        return {"run_id": self.run_id, "ok": self.ok, "model": self.model, "tools": self.tools,
                "chain_digest": self.chain_digest, "proofs_checked": self.proofs_checked, "rounds": rounds}

    def text(self) -> str:
        proofs = "proofs verified" if self.proofs_checked else "proofs NOT checked (no AIDAWORK_SECRET_KEY)"
        head = f"replay of run {self.run_id} (model {self.model}, tools {self.tools}; {proofs})"
        drifted = self.drifted
        if drifted is not None:
            verdict = f"FAILED CLOSED at round {drifted.boundary_seq + 1}: {drifted.drift}"
        else:
            verdict = "ok" if self.ok else "FAILED: some rounds differ"
        return "\n".join([head, *(r.line() for r in self.rounds), verdict])


def short(digest: str | None) -> str:
    return "none" if digest is None else digest[:12]


def compare_round(result: RoundResult, recorded: CaseRound | None) -> RoundReport:
    """The replayed round against the recorded one (None: the record has no such round)."""
    seq = result.boundary_seq
    if recorded is None:
        return RoundReport(seq, RoundStatus.NEW, notes=(f"outcome {_outcome(result)}",))
    what: list[str] = []
    notes: list[str] = []
    digests, request = result.digests, recorded.request
    for name, replayed, stored in (
        ("system", digests.system, request.system_digest),
        ("messages", digests.messages, request.messages_digest),
        ("tools", digests.tools, request.tools_digest),
        ("response", digests.accepted_response, recorded.response_digest),
    ):
        if replayed != stored:
            what.append(name)
            notes.append(f"{name} digest: recorded {short(stored)}, replayed {short(replayed)}")
    recorded_outcome = recorded.outcome + (f" {recorded.error_code}" if recorded.error_code else "")
    if _outcome(result) != recorded_outcome:
        what.append("outcome")
        notes.append(f"outcome: recorded {recorded_outcome}, replayed {_outcome(result)}")
    drift = _compare_calls(result.tool_invocations, recorded.tool_calls, what, notes)
    status = RoundStatus.DIFFERS if what else RoundStatus.SAME
    return RoundReport(seq, status, tuple(dict.fromkeys(what)), tuple(notes), drift)


def _outcome(result: RoundResult) -> str:
    outcome = result.outcome
    return f"fail {outcome.error_code}" if isinstance(outcome, Fail) else outcome.kind


def failure_code(result: JsonValue) -> str | None:
    """The code of a failed call's result (``runtime.tools.calls.failure_result``)."""
    error = result.get("error") if isinstance(result, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _failure_message(result: JsonValue) -> str:
    error = result.get("error") if isinstance(result, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else ""


def _compare_calls(
    replayed: tuple[ToolInvocation, ...], recorded: list[CaseToolCall], what: list[str], notes: list[str]
) -> str | None:
    """Each replayed call against the recorded one in the same place; the drift, if any."""
    if len(replayed) != len(recorded):
        what.append("tool_calls")
        notes.append(f"tool calls: recorded {len(recorded)}, replayed {len(replayed)}")
    drift = None
    for invocation, stored in zip(replayed, recorded, strict=False):
        name = invocation.call.name
        if name != stored.tool_name:
            what.append("tool_name")
            notes.append(f"call {stored.tool_call_id}: recorded tool {stored.tool_name}, replayed {name}")
            continue
        if invocation.args_digest != stored.args_digest:
            what.append("args")
            notes.append(f"call {stored.tool_call_id} ({name}): args differ")
        code = failure_code(invocation.result) if invocation.status == ToolStatus.FAILED else None
        stored_code = failure_code(stored.result) if stored.status == ToolStatus.FAILED else None
        if code == ErrorCode.TOOL_ARGS_INVALID and stored_code != code:
            what.append("schema")
            drift = drift or (f"{name}: the call's args no longer validate against the tool's schema "
                              f"({_failure_message(invocation.result)})")
        elif code == ErrorCode.TOOL_UNKNOWN and stored_code != code:
            what.append("tool_name")
            drift = drift or f"{name}: the tool is not enabled in this config (or no longer exists)"
        elif invocation.result_digest != stored.result_digest or invocation.status != stored.status:
            what.append("result")
            notes.append(f"call {stored.tool_call_id} ({name}): result differs (recorded {stored.status} "
                         f"{short(stored.result_digest)}, replayed {invocation.status} "
                         f"{short(invocation.result_digest)})")
    if drift is not None:
        notes.append(drift)
    return drift

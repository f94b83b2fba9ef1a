"""Forks and diffs, the pure parts: a fork's config (the parent's with the request's
overrides, validated like any run's), the rules the store applies while it copies the
parent's rounds (re-signing their proofs for the fork, chaining an edited history), and
the per-round comparison of two runs' records (``aidawork diff``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal
from uuid import UUID

from pydantic import ValidationError

from runtime.agents import apply_overrides, blamed_on_overrides
from runtime.canonical import chain_digest, digest, join_path, require_json
from runtime.context import context_form
from runtime.deps import Runtime
from runtime.errors import RequestInvalid
from runtime.messages import Message, user_message
from runtime.prepare import PreparedExecution, invalid_from, prepare_turn
from runtime.proofs import ProofAuthority
from schema.wire.agents import OVERRIDE_PATH_PATTERN, AgentView
from schema.wire.claim import LoadedMessage, StoredRound
from schema.wire.forks import COMPARED, ForkRequest, RoundDiff, RoundRecordView, RunDiff, RunRecordView
from schema.wire.json import JsonMapping, JsonObject, JsonValue

OVERRIDES_FIELD = "config_overrides"


def parse_fork_request(raw: ForkRequest | Mapping[str, object]) -> ForkRequest:
    """The fork request, or ``RequestInvalid`` naming the field: a value no store can hold
    (``json_problem``), a field out of its bounds, or two edits (a fork takes at most one)."""
    if isinstance(raw, ForkRequest):
        edit = raw.edit_tool_result
        result = None if edit is None else {"tool_call_id": edit.tool_call_id, "result": edit.result}
        require_json({"edit_input": raw.edit_input, "edit_tool_result": result,
                      "config_overrides": raw.config_overrides}, "")
        request = raw
    else:
        if not isinstance(raw, Mapping):
            raise RequestInvalid("request", "must be a JSON object")
        require_json(dict(raw), "")
        try:
            request = ForkRequest.model_validate(dict(raw))
        except ValidationError as exc:
            raise invalid_from(exc) from None
    if request.edit_input is not None and request.edit_tool_result is not None:
        raise RequestInvalid("edit_tool_result", "a fork takes at most one edit: edit_input or edit_tool_result")
    return request


def nested_overrides(dotted: Mapping[str, JsonValue]) -> JsonObject:
    """``{"policy.max_rounds": 9}`` as the object an agent's overrides are
    (``{"policy": {"max_rounds": 9}}``); ``RequestInvalid`` naming a path that is not a
    dotted config path, or one inside another path given."""
    for path in dotted:
        if not re.fullmatch(OVERRIDE_PATH_PATTERN, path):
            raise RequestInvalid(join_path(OVERRIDES_FIELD, path), "not a dotted config path (policy.max_rounds)")
    for path in dotted:
        outer = next((p for p in dotted if path.startswith(p + ".")), None)
        if outer is not None:
            raise RequestInvalid(f"{OVERRIDES_FIELD}.{path}", f"inside {outer}, which is set too: give one of them")
    nested: JsonObject = {}
    for path, value in dotted.items():
        *parents, leaf = path.split(".")
        here = nested
        for part in parents:
            # No path is inside another: each object on the way is one made here.
            child = here.setdefault(part, {})
            assert isinstance(child, dict)
            here = child
        here[leaf] = value
    return nested


def fork_config(runtime: Runtime, parent_config: JsonMapping, dotted: Mapping[str, JsonValue], owner: str) -> (
    PreparedExecution
):
    """The parent's config with ``dotted`` set, validated as a run config by this process
    (the parent's alone is validated too: a tool or provider gone since is refused now,
    not at the fork's first round). A refused value is named ``config_overrides.<path>``."""
    overrides = nested_overrides(dotted)
    # The merge of a saved agent's overrides, allowing exactly the paths given.
    base = AgentView(owner=owner, name="fork", version=1, description="", config=dict(parent_config),
                     overridable=list(dotted), created_at=datetime.now(UTC))
    try:
        return prepare_turn(runtime, apply_overrides(base, overrides), owner)
    except RequestInvalid as exc:
        blamed = blamed_on_overrides(exc, overrides)
        if blamed.field.startswith("overrides."):
            raise RequestInvalid(OVERRIDES_FIELD + blamed.field.removeprefix("overrides"), blamed.reason) from None
        raise RequestInvalid(exc.field, f"the run's config does not validate any more: {exc.reason}") from None


def added_user_message(text: str) -> JsonObject:
    """The stored body of the user message an ``edit_input`` adds after the fork's round."""
    return user_message(text).to_json()


@dataclass(frozen=True)
class ForkRules:
    """What the store needs of the core while it copies a parent's rounds into a fork
    (``schema.store.forks.ForkRules``)."""

    proofs: ProofAuthority
    max_output_bytes: int  # the fork's policy: how its context shows a long tool result

    def sign(self, run_id: UUID, boundary_seq: int, stored: StoredRound) -> str:
        """The proof of a round row as the fork stores it (as ``verifies_stored_round``
        checks it): the parent's digests, the fork's run id, fence and boundary."""
        fields = {
            "run_id": str(run_id),
            "boundary_seq": boundary_seq,
            "claim_fence": stored.claim_fence,
            "system_digest": stored.system_digest,
            "messages_digest": stored.messages_digest,
            "tools_digest": stored.tools_digest,
            "accepted_response_digest": stored.accepted_response_digest,
        }
        return self.proofs.sign("round", fields)

    def chain(self, previous: str, message: LoadedMessage) -> str:
        """The chain digest of a message appended to a history whose digest is ``previous``."""
        form = context_form(Message.from_json(message.body), self.max_output_bytes, message.reads)
        return chain_digest(previous, form.to_json())

    def with_result(self, body: JsonObject, result: JsonValue, is_error: bool) -> JsonObject:
        """A tool message's body with its result replaced."""
        return replace(Message.from_json(body), result=result, is_error=is_error).to_json()


# --- diff ----------------------------------------------------------------------------------


def _results(view: RoundRecordView) -> list[JsonValue]:
    return [{"tool_call_id": t.tool_call_id, "name": t.name, "result": t.result, "is_error": t.is_error}
            for t in view.tool_results]


def _compared(view: RoundRecordView, field: str) -> JsonValue:
    if field == "response":
        return view.response
    if field == "tool_results":
        return _results(view)
    value: JsonValue = getattr(view, field)
    return value


def compare_round(number: int, a: RoundRecordView | None, b: RoundRecordView | None) -> RoundDiff:
    """One round of two runs: the same, which fields differ (with both sides' values), or
    only one run has it."""
    if a is None or b is None:
        verdict: Literal["only_in_a", "only_in_b"] = "only_in_b" if a is None else "only_in_a"
        return RoundDiff(round=number, verdict=verdict)
    differs = []
    for field in COMPARED:
        # The response: its accepted digest and the assistant message as stored, both.
        keys = [(a.accepted_response_digest, b.accepted_response_digest)] if field == "response" else []
        if any(x != y for x, y in keys) or digest(_compared(a, field)) != digest(_compared(b, field)):
            differs.append(field)
    return RoundDiff(
        round=number,
        verdict="differs" if differs else "same",
        differs=differs,
        a={f: _compared(a, f) for f in differs},
        b={f: _compared(b, f) for f in differs},
    )


def diff_runs(a: RunRecordView, b: RunRecordView) -> RunDiff:
    """Every round either run committed, compared (``compare_round``), by round."""
    by_a = {r.boundary_seq: r for r in a.rounds}
    by_b = {r.boundary_seq: r for r in b.rounds}
    rounds = [compare_round(seq + 1, by_a.get(seq), by_b.get(seq)) for seq in sorted(by_a.keys() | by_b.keys())]
    return RunDiff(run_a=a.run_id, run_b=b.run_id, rounds=rounds)

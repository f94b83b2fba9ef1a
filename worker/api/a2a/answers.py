"""Answers to a suspended task: the data parts of a message sent with the task's id,
each one answer to one wait the status message listed, applied through the client's own
functions (``worker.client``: the same field checks, and the original tool call resumes
without a model call).

The answer shapes (one JSON object per data part; the marker field says which):

- ``{"tool_call_id", "result", "is_error"?}``: a client tool's result, or an operator's word
  on a call whose outcome is unknown (``client.tool_result``);
- ``{"tool_call_id", "decision": "approve", "args"?}`` / ``{"tool_call_id", "decision":
  "reject", "reason"}``: a call waiting for approval (``client.approve`` / ``reject``);
- ``{"tool_call_id", "retry": true}``: run an unknown-outcome call again (``client.retry_tool``);
- ``{"tool_call_id", "files": {path: text}}``: files for a local read (``client.deliver``);
- ``{"key", "value"}``: a prerequisite (``client.resolve``).

Every answer of a message is checked (its shape, its fields, and that the task waits for
it) before any is stored, so a refused message stores nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from a2a.helpers import get_data_parts
from a2a.types.a2a_pb2 import Message, Part

from runtime.errors import RequestInvalid
from schema.store.suspensions import Receipt
from schema.wire import WaitingFor
from worker import client
from worker.client.context import ClientContext

ReplyKind = Literal["result", "approve", "reject", "retry", "files", "value"]
# The field that marks each shape, its required and optional fields.
_SHAPES: Mapping[str, tuple[frozenset[str], frozenset[str]]] = {
    "result": (frozenset({"tool_call_id", "result"}), frozenset({"is_error"})),
    "decision": (frozenset({"tool_call_id", "decision"}), frozenset({"args", "reason"})),
    "retry": (frozenset({"tool_call_id", "retry"}), frozenset()),
    "files": (frozenset({"tool_call_id", "files"}), frozenset()),
    "value": (frozenset({"key", "value"}), frozenset()),
}
# The wait kinds each answer can answer.
ANSWERS: Mapping[ReplyKind, frozenset[str]] = {
    "result": frozenset({"client_tool", "outcome_unknown"}),
    "approve": frozenset({"approval"}),
    "reject": frozenset({"approval"}),
    "retry": frozenset({"outcome_unknown"}),
    "files": frozenset({"local_read"}),
    "value": frozenset({"prerequisite"}),
}
_SAFE_INT = 2**53  # a protobuf Value holds every number as a double


class ReplyInvalid(Exception):
    """An answer that cannot be taken: ``field`` is its path in the request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Reply:
    """One answer, its fields checked: ``target`` is the tool call it answers (for
    ``value``, the prerequisite's key); ``where`` its path in the request."""

    kind: ReplyKind
    target: str
    where: str
    body: Mapping[str, Any]


def json_of(part: Part) -> Any:
    """A data part's value as JSON, whole numbers as ints again (``4`` arrives as ``4.0``,
    which a tool's ``integer`` argument would refuse)."""
    return _ints(get_data_parts([part])[0])


def _ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < _SAFE_INT:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def replies_of(message: Message) -> list[Reply]:
    """The answers a message to a suspended task carries: data parts only."""
    replies = []
    for i, part in enumerate(message.parts):
        where = f"message.parts[{i}]"
        if not part.HasField("data"):
            raise ReplyInvalid(where, "a message to a task that waits for input carries answers, one data part each")
        replies.append(reply_of(json_of(part), f"{where}.data"))
    if not replies:
        raise ReplyInvalid("message.parts", "send the answers, one data part each")
    return replies


def reply_of(data: object, where: str) -> Reply:
    """One answer's shape and fields (the client's checks), or ``ReplyInvalid``."""
    if not isinstance(data, dict):
        raise ReplyInvalid(where, "an answer is a JSON object")
    markers = [m for m in _SHAPES if m in data]
    if len(markers) != 1:
        raise ReplyInvalid(where, "an answer has one of result, decision, retry, files or value")
    required, optional = _SHAPES[markers[0]]
    missing, unknown = sorted(required - data.keys()), sorted(data.keys() - required - optional)
    if missing or unknown:
        name = missing[0] if missing else unknown[0]
        raise ReplyInvalid(f"{where}.{name}", "is required" if missing else "is not a field of this answer")
    try:
        return _checked(markers[0], data, where)
    except RequestInvalid as exc:
        raise ReplyInvalid(f"{where}.{exc.field}", exc.reason) from None


def _checked(marker: str, data: dict[str, Any], where: str) -> Reply:
    target = data.get("key") if marker == "value" else data.get("tool_call_id")
    match marker:
        case "result":
            client.check_tool_result(target, data["result"], data.get("is_error", False))
            kind: ReplyKind = "result"
        case "decision":
            kind = _decision(data, where)
        case "retry":
            client.check_tool_call_id(target)
            if data["retry"] is not True:
                raise RequestInvalid("retry", "must be true")
            kind = "retry"
        case "files":
            client.check_delivery(target, data["files"])
            kind = "files"
        case _:
            client.check_prerequisite(target, data["value"])
            kind = "value"
    assert isinstance(target, str)  # the checks above refuse anything else
    return Reply(kind, target, where, data)


def _decision(data: dict[str, Any], where: str) -> ReplyKind:
    decision = data["decision"]
    if decision == "approve":
        if "reason" in data:
            raise RequestInvalid("reason", "only a rejection takes a reason")
        client.check_approval(data["tool_call_id"], data.get("args"))
        return "approve"
    if decision == "reject":
        if "args" in data:
            raise RequestInvalid("args", "only an approval takes args")
        if "reason" not in data:
            raise RequestInvalid("reason", "a rejection must say why")
        client.check_rejection(data["tool_call_id"], data["reason"])
        return "reject"
    raise RequestInvalid("decision", 'must be "approve" or "reject"')


def check_waited_for(replies: Sequence[Reply], waits: Sequence[WaitingFor]) -> None:
    """Each answer names a wait of the task not yet answered, of a kind it answers, and no
    two answer the same one (the store checks again, in its transaction, as it stores)."""
    seen: set[tuple[str, str]] = set()
    for reply in replies:
        key = ("key" if reply.kind == "value" else "call", reply.target)
        field = f"{reply.where}.{'key' if reply.kind == 'value' else 'tool_call_id'}"
        if key in seen:
            raise ReplyInvalid(field, "answered twice in this message")
        seen.add(key)
        wait = next((w for w in waits if _names(w, reply)), None)
        if wait is None:
            listed = ", ".join(f"{w.tool_call_id or w.kind} ({w.kind})" for w in waits if not w.delivered) or "nothing"
            raise ReplyInvalid(field, f"the task does not wait for {reply.target!r} (it waits for: {listed})")
        if wait.kind not in ANSWERS[reply.kind]:
            raise ReplyInvalid(field, f"{reply.target!r} waits for {wait.kind}, which this answer does not give")


def _names(wait: WaitingFor, reply: Reply) -> bool:
    if wait.delivered:
        return False
    if reply.kind == "value":
        return wait.kind == "prerequisite" and wait.key == reply.target
    return wait.tool_call_id == reply.target


def apply(ctx: ClientContext, run_id: UUID, reply: Reply) -> Receipt:
    """Store one answer (and send the resume when it was the last one missing)."""
    body, target = reply.body, reply.target
    match reply.kind:
        case "result":
            return client.tool_result(run_id, target, body["result"], is_error=body.get("is_error", False), ctx=ctx)
        case "approve":
            return client.approve(run_id, target, args=body.get("args"), ctx=ctx)
        case "reject":
            return client.reject(run_id, target, reason=body["reason"], ctx=ctx)
        case "retry":
            return client.retry_tool(run_id, target, ctx=ctx)
        case "files":
            return client.deliver(run_id, target, body["files"], ctx=ctx)
        case "value":
            return client.resolve(run_id, target, body["value"], ctx=ctx)

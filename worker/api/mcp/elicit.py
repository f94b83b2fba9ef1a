"""What a suspended run asks of an MCP client that can elicit, and the answers its
elicitation results give (pure).

Each open wait is one form elicitation (``elicitation/create``), keyed by the waiting tool
call's id: unique over the run's life, as the protocol asks of a key. They travel in an
``InputRequiredResult`` (multi round-trip requests, 2026-07-28) or a task's
``inputRequests`` (the tasks extension). An answer becomes the same reply a
``task.answer`` call or an A2A data part gives (``worker.api.a2a.answers``), so one set
of checks and one way of storing serves all three.

A form holds flat, primitive fields only, so a JSON value (a client tool's result, a
prerequisite) is a string field: its text is read as JSON when it parses, else taken as
the string itself. ``decline`` refuses what a wait asks where a refusal means something
(an approval is rejected, a client tool fails); ``cancel``, or ``decline`` elsewhere,
answers nothing: the run keeps waiting, and the call says so instead of asking again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputResponse

from schema.wire import RunView, WaitingFor
from worker.api.a2a.answers import Reply, reply_of
from worker.api.mcp.results import open_waits

_ARGS_CHARS = 500  # of a call's args quoted in a form's message
DECLINED = "declined by the user"
_RESULT = {"type": "string", "title": "Result", "description": "the tool's result: JSON, or plain text"}
_FAILED = {"type": "boolean", "title": "Failed", "description": "the tool failed (the model sees a failed result)",
           "default": False}


def _call(wait: WaitingFor) -> str:
    args = json.dumps(wait.args or {}, ensure_ascii=False)
    if len(args) > _ARGS_CHARS:
        args = args[:_ARGS_CHARS] + "..."
    return f"{wait.tool_name}({args})"


def _form(wait: WaitingFor) -> tuple[str, dict[str, Any], list[str]] | None:
    """The message, the fields and the required fields of ``wait``'s form."""
    match wait.kind:
        case "client_tool":
            return f"{_call(wait)} needs its result.", {"result": _RESULT, "is_error": _FAILED}, ["result"]
        case "outcome_unknown":
            retry = {"type": "boolean", "title": "Run it again", "default": False,
                     "description": "run the call once more (it may then have happened twice)"}
            message = f"{_call(wait)} may or may not have happened ({wait.reason}): give its result, or run it again."
            return message, {"result": _RESULT, "is_error": _FAILED, "retry": retry}, []
        case "approval":
            decision = {"type": "string", "title": "Decision", "enum": ["approve", "reject"], "default": "approve"}
            reason = {"type": "string", "title": "Reason", "description": "why not (for a rejection)"}
            return f"Allow {_call(wait)}?", {"decision": decision, "reason": reason}, ["decision"]
        case "local_read":
            paths = list(wait.paths or ())
            fields = {p: {"type": "string", "title": p, "description": "the file's text"} for p in paths}
            return f"{wait.tool_name} reads files on the client: {', '.join(paths)}", fields, paths
        case "prerequisite":
            value = {"type": "string", "title": "Value", "description": "JSON, or plain text"}
            return f"The run needs the value of {wait.key!r}.", {"value": value}, ["value"]
    return None  # a kind this server does not know how to ask for


def input_requests(view: RunView) -> dict[str, ElicitRequest]:
    """One elicitation per open wait of the run, keyed by its tool call id."""
    requests = {}
    for wait in open_waits(view):
        form = _form(wait)
        if form is None or wait.tool_call_id is None:
            continue
        message, fields, required = form
        schema = {"type": "object", "properties": fields, "required": required}
        requests[wait.tool_call_id] = ElicitRequest(
            params=ElicitRequestFormParams(message=message, requested_schema=schema)
        )
    return requests


def wire_requests(view: RunView) -> dict[str, Any]:
    """``input_requests`` as a task's ``inputRequests`` (JSON)."""
    return {k: r.model_dump(by_alias=True, mode="json", exclude_none=True) for k, r in input_requests(view).items()}


@dataclass
class Elicited:
    """The replies a client's elicitation results give, and whether one of them answered
    nothing (dismissed), so the call stops asking."""

    replies: list[Reply] = field(default_factory=list)
    dismissed: bool = False


def _json(text: object) -> object:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _result(wait: WaitingFor, content: Mapping[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {"tool_call_id": wait.tool_call_id}
    if "result" in content:
        data["result"] = _json(content["result"])
    if "is_error" in content:
        data["is_error"] = content["is_error"]
    return data


def _accepted(wait: WaitingFor, content: Mapping[str, Any]) -> dict[str, Any]:
    call = wait.tool_call_id
    match wait.kind:
        case "outcome_unknown" if content.get("retry") is True:
            return {"tool_call_id": call, "retry": True}
        case "approval" if content.get("decision") == "reject":
            return {"tool_call_id": call, "decision": "reject", "reason": content.get("reason") or "rejected"}
        case "approval":
            return {"tool_call_id": call, "decision": content.get("decision")}
        case "local_read":
            return {"tool_call_id": call, "files": {p: content.get(p) for p in wait.paths or ()}}
        case "prerequisite":
            return {"key": wait.key, "value": _json(content.get("value"))}
    return _result(wait, content)


def _declined(wait: WaitingFor) -> dict[str, Any] | None:
    if wait.kind == "approval":
        return {"tool_call_id": wait.tool_call_id, "decision": "reject", "reason": DECLINED}
    if wait.kind == "client_tool":
        return {"tool_call_id": wait.tool_call_id, "result": {"error": DECLINED}, "is_error": True}
    return None


def replies_of(view: RunView, responses: Mapping[str, InputResponse], where: str) -> Elicited:
    """The replies ``responses`` give to the run's open waits; a response to anything else
    (a wait answered already, an unknown key) is ignored, as the tasks extension asks.
    ``ReplyInvalid`` (naming ``where``.KEY...) for an answer the checks refuse."""
    waits = {w.tool_call_id: w for w in open_waits(view) if w.tool_call_id is not None}
    elicited = Elicited()
    for key, response in responses.items():
        wait = waits.get(key)
        if wait is None or not isinstance(response, ElicitResult):
            continue
        if response.action == "accept":
            data: dict[str, Any] | None = _accepted(wait, response.content or {})
        else:
            data = _declined(wait) if response.action == "decline" else None
        if data is None:
            elicited.dismissed = True
            continue
        elicited.replies.append(reply_of(data, f"{where}.{key}"))
    return elicited

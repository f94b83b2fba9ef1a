"""The checks of what a client hands in besides a run request (a delivery, a
prerequisite, a tool result, an approval or rejection): ``RequestInvalid`` naming the
field for what no store can hold, before anything is stored. ``worker.client`` exposes
them; the HTTP API calls them before the store."""

from __future__ import annotations

import json
from collections.abc import Mapping

from runtime.canonical import require_json, text_problem
from runtime.errors import RequestInvalid


def check_text(text: object, field: str, *, of: str | None = None) -> None:
    if not isinstance(text, str):
        raise RequestInvalid(field, "must be a string")
    problem = text_problem(text)
    if problem is not None:
        # Name the file by an escaped, bounded form of its path: never the raw path.
        raise RequestInvalid(field, problem if of is None else f"{problem}, in the file {json.dumps(of[:80])}")


def check_delivery(tool_call_id: object, files: object) -> None:
    """``RequestInvalid`` (field ``tool_call_id``, ``files``, ``files[0].path`` or
    ``files[0].content``, in the order given) for what no store can hold."""
    check_text(tool_call_id, "tool_call_id")
    if not isinstance(files, Mapping):
        raise RequestInvalid("files", "must be an object {path: text}")
    for i, (path, content) in enumerate(files.items()):
        check_text(path, f"files[{i}].path")
        check_text(content, f"files[{i}].content", of=path)


def check_prerequisite(key: object, value: object) -> None:
    """``RequestInvalid`` (field ``key``, or ``value`` and the path inside it) for a key
    or value that ``json_problem`` refuses."""
    check_text(key, "key")
    require_json(value, "value")


MAX_REASON_CHARS = 2000


def check_tool_call_id(tool_call_id: object) -> None:
    """``RequestInvalid`` (field ``tool_call_id``) for an id that is empty or no store can hold."""
    check_text(tool_call_id, "tool_call_id")
    if not tool_call_id:
        raise RequestInvalid("tool_call_id", "must not be empty")


def check_tool_result(tool_call_id: object, value: object, is_error: object = False) -> None:
    """``RequestInvalid`` (field ``tool_call_id``, ``result`` and the path inside it, or
    ``is_error``) for a tool result no store can hold."""
    check_tool_call_id(tool_call_id)
    require_json(value, "result")
    if not isinstance(is_error, bool):
        raise RequestInvalid("is_error", "must be a boolean")


def check_approval(tool_call_id: object, args: object = None) -> None:
    """``RequestInvalid`` (``tool_call_id``, or ``args`` and the path inside it) for an
    approval no store can hold; edited ``args`` must be a JSON object."""
    check_tool_call_id(tool_call_id)
    if args is not None:
        require_json(args, "args")
        if not isinstance(args, Mapping):
            raise RequestInvalid("args", "must be a JSON object (the call's args, edited)")


def check_rejection(tool_call_id: object, reason: object) -> None:
    """``RequestInvalid`` (``tool_call_id`` or ``reason``): a rejection says why, in at
    most MAX_REASON_CHARS characters (the model is shown it)."""
    check_tool_call_id(tool_call_id)
    check_text(reason, "reason")
    assert isinstance(reason, str)
    if not reason.strip():
        raise RequestInvalid("reason", "must not be empty: say why the call is rejected")
    if len(reason) > MAX_REASON_CHARS:
        raise RequestInvalid("reason", f"{len(reason)} characters is over the limit of {MAX_REASON_CHARS}")

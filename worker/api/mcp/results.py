"""Runs as what an MCP client reads (pure): a tool call's ``CallToolResult``, and a task
of the tasks extension (``io.modelcontextprotocol/tasks``) as its ``tasks/get`` answer.

A task's status is the run's, in the extension's words (``STATUS_OF``). A failed run is a
``completed`` task whose result has ``isError``: the extension keeps ``failed`` for
JSON-RPC errors, and a run that failed is a tool that ran and reported a problem. A run
parked for its owner's token budget is ``working``: nobody can answer that wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from mcp_types import CallToolResult, TextContent

from schema.wire import RunStatus, RunView, WaitingFor
from schema.wire.json import JsonObject
from worker.api.a2a.tasks import wait_of_view, wait_text

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
STATUS_OF: Mapping[RunStatus, TaskStatus] = {
    RunStatus.QUEUED: "working",
    RunStatus.RUNNING: "working",
    RunStatus.SUSPENDED: "input_required",
    RunStatus.COMPLETED: "completed",
    RunStatus.FAILED: "completed",
    RunStatus.CANCELLED: "cancelled",
}
POLL_INTERVAL_MS = 1000  # what a task suggests its poller waits between tasks/get


def open_waits(view: RunView) -> list[WaitingFor]:
    """The waits of a suspended run that someone can answer (not yet answered, not the
    owner's budget)."""
    if view.status is not RunStatus.SUSPENDED:
        return []
    return [w for w in view.waiting_for if not w.delivered and w.kind != "budget"]


def needs_input(view: RunView) -> bool:
    return bool(open_waits(view))


def settled(view: RunView) -> bool:
    """A caller waiting for the run can stop: it has ended, or it waits for an answer."""
    return view.status.terminal or needs_input(view)


def task_status(view: RunView) -> TaskStatus:
    if view.status is RunStatus.SUSPENDED and not needs_input(view):
        return "working"  # parked for the budget, or its answers are in and it resumes
    return STATUS_OF[view.status]


def status_message(view: RunView) -> str:
    """What the task is doing, for a person or a model."""
    match view.status:
        case RunStatus.QUEUED:
            return "queued"
        case RunStatus.RUNNING:
            return f"running (round {view.rounds + 1})"
        case RunStatus.SUSPENDED if needs_input(view):
            return "waiting for: " + "; ".join(wait_text(wait_of_view(w)) for w in open_waits(view))
        case RunStatus.SUSPENDED:
            return "resuming" if not any(w.kind == "budget" for w in view.waiting_for) else (
                "waiting for the owner's token budget: it goes on when the budget allows")
        case RunStatus.COMPLETED:
            return "completed"
        case RunStatus.FAILED:
            return f"failed: {view.error_code}: {view.error_message}"
    return f"cancelled: {view.error_message}" if view.error_message else "cancelled"


def _structured(view: RunView) -> JsonObject:
    """The run's identity and state; ``root_id`` continues the conversation in a next call."""
    data: JsonObject = {
        "run_id": str(view.run_id),
        "root_id": str(view.root_id),
        "status": task_status(view),
        "run_status": view.status.value,
        "agent": view.agent,
    }
    if view.status is RunStatus.COMPLETED:
        data["output"] = view.output or ""
    elif view.status is RunStatus.FAILED:
        data["error_code"], data["error_message"] = view.error_code, view.error_message
    elif needs_input(view):
        data["waiting_for"] = [wait_of_view(w) for w in open_waits(view)]
    return data


def call_result(view: RunView) -> CallToolResult:
    """The run as a tool's result: its output once completed; otherwise what it is doing,
    with what to call next (a run that has not ended is no error: it goes on)."""
    if view.status is RunStatus.COMPLETED:
        text = view.output or ""
    elif view.status.terminal:
        text = status_message(view)
    elif needs_input(view):
        text = (f"task {view.run_id} is {status_message(view)}. Answer with the tool task.answer "
                f'{{"run_id": "{view.run_id}", "answers": [...]}}.')
    else:
        text = f"task {view.run_id} is still {status_message(view)}: poll it with the tool task.status."
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=_structured(view),
        is_error=view.status in (RunStatus.FAILED, RunStatus.CANCELLED),
    )


def refusal(message: str) -> CallToolResult:
    """A call refused for its arguments: a tool error, which a model can read and correct."""
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _task_fields(view: RunView) -> dict[str, Any]:
    return {
        "taskId": str(view.run_id),
        "status": task_status(view),
        "statusMessage": status_message(view),
        "createdAt": view.created_at.isoformat(),
        # The view has no update time: a finished run's end, else its start.
        "lastUpdatedAt": (view.finished_at or view.created_at).isoformat(),
        # Unlimited: AIDAWORK_RETENTION_DAYS counts from a run's end, not its creation.
        "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }


def created_task(view: RunView) -> dict[str, Any]:
    """The ``CreateTaskResult`` a task-augmented ``tools/call`` answers with."""
    return {"resultType": "task", **_task_fields(view)}


def detailed_task(view: RunView, input_requests: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tasks/get`` answer: the task, with its result once completed, or what it
    asks of the client (``input_requests``: ``worker.api.mcp.elicit``) when it waits."""
    task = _task_fields(view)
    if task["status"] == "completed":
        task["result"] = call_result(view).model_dump(by_alias=True, mode="json", exclude_none=True)
    elif task["status"] == "input_required":
        task["inputRequests"] = dict(input_requests)
    return task

"""Runs as A2A tasks: pure functions from a run's view (``RunView``) and its durable
events (``RunEvent``) to the protocol's ``Task``, status and artifact updates.

A task is a run: its id is the run id and its context id is the run's Root id. The state
is the run's status (``STATE_OF``); a suspended run's status message says what it waits
for, one data part per wait (``wait_data``), so a client can answer each without parsing
text; the text part beside them says the same for a person.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from a2a.helpers import new_data_part
from a2a.server.events.event_queue import Event
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)

from schema.wire import EventKind, RunEvent, RunStatus, RunView, WaitingFor
from schema.wire.json import JsonObject
from schema.wire.vocab import ANSWERED_WAITS

STATE_OF: Mapping[RunStatus, TaskState] = {
    RunStatus.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    RunStatus.SUSPENDED: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunStatus.FAILED: TaskState.TASK_STATE_FAILED,
    RunStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
}
OUTPUT_ARTIFACT_ID = "output"  # the run's output: one artifact, replaced (never appended to)

# What each wait kind is answered with (one data part each), for the status text.
_ANSWER_HINT = {
    "client_tool": '{"tool_call_id": "%s", "result": <JSON>, "is_error"?: true}',
    "outcome_unknown": '{"tool_call_id": "%s", "result": <JSON>} or {"tool_call_id": "%s", "retry": true}',
    "approval": '{"tool_call_id": "%s", "decision": "approve", "args"?: {...}} or '
    '{"tool_call_id": "%s", "decision": "reject", "reason": "..."}',
    "local_read": '{"tool_call_id": "%s", "files": {"<path>": "<text>"}}',
}


def data_part(data: Any) -> Part:
    return new_data_part(data, media_type="application/json")


def wait_data(
    kind: str,
    tool_call_id: str | None = None,
    tool: str | None = None,
    *,
    args: Mapping[str, Any] | None = None,
    paths: Sequence[str] | None = None,
    key: str | None = None,
    reason: str | None = None,
    window_ends_at: str | None = None,
) -> JsonObject:
    """One wait as the status message's data part: ``kind`` and what an answer must name
    (``tool_call_id``, or a prerequisite's ``key``), plus what the asker needs to answer it."""
    data: JsonObject = {"kind": kind}
    if tool_call_id is not None:
        data["tool_call_id"] = tool_call_id
        data["tool"] = tool
    if kind in ANSWERED_WAITS:
        data["args"] = dict(args or {})
    if kind == "local_read":
        data["paths"] = list(paths or ())
    if kind == "prerequisite":
        data["key"] = key
    if reason is not None:
        data["reason"] = reason
    if window_ends_at is not None:  # budget: when the owner's window ends (then it goes on)
        data["window_ends_at"] = window_ends_at
    return data


def wait_of_view(wait: WaitingFor) -> JsonObject:
    ends_at = None if wait.window_ends_at is None else wait.window_ends_at.isoformat()
    return wait_data(wait.kind, wait.tool_call_id, wait.tool_name, args=wait.args, paths=wait.paths,
                     key=wait.key, reason=wait.reason, window_ends_at=ends_at)


def wait_of_event(data: Mapping[str, Any]) -> JsonObject:
    """A ``tool_suspended`` event's data as a wait."""
    paths = data.get("paths")
    return wait_data(str(data.get("kind")), data.get("tool_call_id"), data.get("name"), args=data.get("args"),
                     paths=paths if isinstance(paths, list) else None, key=data.get("key"),
                     reason=data.get("reason"))


def wait_text(wait: Mapping[str, Any]) -> str:
    kind, call, tool = wait["kind"], wait.get("tool_call_id"), wait.get("tool")
    if kind == "budget":
        return "the owner's token budget: nothing to answer, the task goes on when the budget allows"
    if kind == "prerequisite":
        return f'prerequisite {wait.get("key")!r}: answer {{"key": "{wait.get("key")}", "value": <JSON>}}'
    hint = _ANSWER_HINT.get(kind, "")
    return f"{call} ({tool}) waits for {kind}: answer {hint.replace('%s', str(call))}"


def agent_message(run_id: str, root_id: str, message_id: str, parts: Sequence[Part]) -> Message:
    return Message(message_id=message_id, role=Role.ROLE_AGENT, task_id=run_id, context_id=root_id, parts=parts)


def waiting_message(run_id: str, root_id: str, message_id: str, waits: Sequence[JsonObject]) -> Message:
    text = "waiting for: " + "; ".join(wait_text(w) for w in waits)
    return agent_message(run_id, root_id, message_id, [Part(text=text), *(data_part(w) for w in waits)])


def failure_parts(error_code: str | None, message: str | None) -> list[Part]:
    return [Part(text=f"{error_code}: {message}"), data_part({"error_code": error_code, "message": message})]


def output_artifact(output: str) -> Artifact:
    return Artifact(artifact_id=OUTPUT_ARTIFACT_ID, name="output", parts=[Part(text=output)])


def _status_parts(view: RunView) -> list[Part] | None:
    if view.status is RunStatus.COMPLETED:
        return [Part(text=view.output or "")]
    if view.status is RunStatus.FAILED:
        return failure_parts(view.error_code, view.error_message)
    if view.status is RunStatus.CANCELLED and view.error_message:
        return [Part(text=view.error_message)]
    return None


def task_of(view: RunView) -> Task:
    """The run as a task, now. ``metadata``: the agent version it runs and its counts."""
    run_id, root_id = str(view.run_id), str(view.root_id)
    status = TaskStatus(state=STATE_OF[view.status])
    message_id = f"{run_id}.{view.status.value}"
    if view.status is RunStatus.SUSPENDED:
        waits = [wait_of_view(w) for w in view.waiting_for if not w.delivered]
        status.message.CopyFrom(waiting_message(run_id, root_id, message_id, waits))
    elif (parts := _status_parts(view)) is not None:
        status.message.CopyFrom(agent_message(run_id, root_id, message_id, parts))
    if view.finished_at is not None:
        status.timestamp.FromDatetime(view.finished_at)
    task = Task(id=run_id, context_id=root_id, status=status)
    if view.status is RunStatus.COMPLETED:
        task.artifacts.append(output_artifact(view.output or ""))
    task.metadata.update({"agent": view.agent, "rounds": view.rounds, "model_calls": view.model_calls})
    return task


def submitted_task(view: RunView) -> Task:
    """The task as its submission left it: what a stream that then replays every event of
    the run starts with (a worker may have taken the run already; its events follow)."""
    task = Task(id=str(view.run_id), context_id=str(view.root_id),
                status=TaskStatus(state=STATE_OF[RunStatus.QUEUED]))
    task.metadata.update({"agent": view.agent, "rounds": 0, "model_calls": 0})
    return task


class EventMapper:
    """A run's events, in order, as the task's stream updates. It remembers the
    ``tool_suspended`` events it has seen, since the ``run_suspended`` after them names
    only their ids."""

    def __init__(self, run_id: str, root_id: str) -> None:
        self.run_id, self.root_id = run_id, root_id
        self._waits: dict[str, JsonObject] = {}

    def _status(self, event: RunEvent, state: TaskState, parts: Sequence[Part] = ()) -> TaskStatusUpdateEvent:
        status = TaskStatus(state=state)
        status.timestamp.FromDatetime(event.created_at)
        if parts:
            status.message.CopyFrom(agent_message(self.run_id, self.root_id, f"{self.run_id}.{event.seq}", parts))
        return TaskStatusUpdateEvent(task_id=self.run_id, context_id=self.root_id, status=status)

    def updates(self, event: RunEvent) -> list[Event]:
        """What the client is sent for ``event`` (nothing for the events that change
        nothing it can see: the run's queueing, a tool's end, a delivery, a rebuild)."""
        data = event.data
        match event.kind:
            case EventKind.MODEL_RESPONDED:
                parts = [Part(text=data["content"])] if data.get("content") else []
                parts += [data_part({"kind": "tool_call", "tool_call_id": call.get("id"), "tool": call.get("name"),
                                     "args": call.get("args") or {}}) for call in data.get("tool_calls") or ()]
                return [self._status(event, TaskState.TASK_STATE_WORKING, parts)]
            case EventKind.ROUND_RESUMED:
                return [self._status(event, TaskState.TASK_STATE_WORKING)]
            case EventKind.TOOL_SUSPENDED:
                self._waits[str(data.get("tool_call_id"))] = wait_of_event(data)
                return []
            case EventKind.RUN_SUSPENDED:
                message = waiting_message(self.run_id, self.root_id, f"{self.run_id}.{event.seq}",
                                          self.waits_of(event))
                status = self._status(event, TaskState.TASK_STATE_INPUT_REQUIRED)
                status.status.message.CopyFrom(message)
                return [status]
            case EventKind.RUN_COMPLETED:
                output = str(data.get("output") or "")
                artifact = TaskArtifactUpdateEvent(task_id=self.run_id, context_id=self.root_id,
                                                   artifact=output_artifact(output), last_chunk=True)
                return [artifact, self._status(event, TaskState.TASK_STATE_COMPLETED, [Part(text=output)])]
            case EventKind.RUN_FAILED:
                parts = failure_parts(data.get("error_code"), data.get("message"))
                return [self._status(event, TaskState.TASK_STATE_FAILED, parts)]
            case EventKind.RUN_CANCELLED:
                text = data.get("message")
                return [self._status(event, TaskState.TASK_STATE_CANCELED, [Part(text=text)] if text else [])]
        return []

    def waits_of(self, event: RunEvent) -> list[JsonObject]:
        """The waits a ``run_suspended`` event names: its tool calls, or its owner's budget."""
        budget = event.data.get("budget")
        if isinstance(budget, Mapping):
            return [wait_data("budget", window_ends_at=budget.get("window_ends_at"))]
        return [self._waits.get(str(i)) or wait_data("unknown", str(i)) for i in event.data.get("waiting_for") or ()]


def waiting_ids(event: RunEvent) -> frozenset[str]:
    """The tool calls a ``run_suspended`` event waits for (none: a budget wait)."""
    return frozenset(str(i) for i in event.data.get("waiting_for") or ())


def still_waiting(view: RunView, event: RunEvent) -> bool:
    """The run still waits for what ``event`` (a ``run_suspended``) says: the stream has
    caught up with an interruption and ends there. Call ids are unique within a run, so an
    earlier suspension of a run replayed from the start never matches."""
    pending = frozenset(w.tool_call_id for w in view.waiting_for if w.tool_call_id is not None)
    return view.status is RunStatus.SUSPENDED and pending == waiting_ids(event)

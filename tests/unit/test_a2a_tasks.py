"""Runs as A2A tasks, without services: every run status has its task state; a run's view
and its events become the task and its updates; a suspension names each wait as a data
part; the answers' shapes are checked field by field, and against what the task waits for."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from a2a.helpers import new_data_part
from a2a.types.a2a_pb2 import Message, Part, Role, TaskState
from google.protobuf.json_format import MessageToDict

from schema.wire import EventKind, RunEvent, RunStatus, RunView, WaitingFor
from schema.wire.agents import AgentView
from worker.api.a2a.answers import ReplyInvalid, check_waited_for, replies_of, reply_of
from worker.api.a2a.card import card_of
from worker.api.a2a.tasks import STATE_OF, EventMapper, still_waiting, task_of

RUN, ROOT = uuid.uuid4(), uuid.uuid4()
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
CLIENT_WAIT = WaitingFor(tool_call_id="call_0_0", tool_name="pick_color", kind="client_tool",
                         args={"hint": "warm"}, delivered=False)


def view(status: RunStatus, **fields: Any) -> RunView:
    ended = status.terminal
    base: dict[str, Any] = {
        "run_id": RUN, "root_id": ROOT, "owner": "team-a", "status": status, "rounds": 1, "model_calls": 1,
        "agent": "helper@2", "output": None, "error_code": None, "error_message": None, "created_at": NOW,
        "finished_at": NOW if ended else None,
    }
    return RunView.model_validate({**base, **fields})


def event(seq: int, event_kind: EventKind, **data: Any) -> RunEvent:
    return RunEvent(run_id=RUN, seq=seq, kind=event_kind, data=data, created_at=NOW)


def data_of(part: Part) -> Any:
    return MessageToDict(part.data)


def test_every_run_status_has_its_task_state() -> None:
    assert {status: TaskState.Name(STATE_OF[status]) for status in RunStatus} == {
        RunStatus.QUEUED: "TASK_STATE_SUBMITTED",
        RunStatus.RUNNING: "TASK_STATE_WORKING",
        RunStatus.SUSPENDED: "TASK_STATE_INPUT_REQUIRED",
        RunStatus.COMPLETED: "TASK_STATE_COMPLETED",
        RunStatus.FAILED: "TASK_STATE_FAILED",
        RunStatus.CANCELLED: "TASK_STATE_CANCELED",
    }


def test_a_task_is_its_run_the_output_an_artifact_and_the_error_its_status_message() -> None:
    done = task_of(view(RunStatus.COMPLETED, output="5"))
    assert (done.id, done.context_id) == (str(RUN), str(ROOT))
    assert [a.parts[0].text for a in done.artifacts] == ["5"] and done.status.message.parts[0].text == "5"
    assert dict(done.metadata) == {"agent": "helper@2", "rounds": 1.0, "model_calls": 1.0}
    failed = task_of(view(RunStatus.FAILED, error_code="MODEL_UNAVAILABLE", error_message="gone"))
    assert failed.status.message.parts[0].text == "MODEL_UNAVAILABLE: gone"
    assert data_of(failed.status.message.parts[1]) == {"error_code": "MODEL_UNAVAILABLE", "message": "gone"}
    assert not failed.artifacts
    working = task_of(view(RunStatus.RUNNING))
    assert not working.status.HasField("message") and not working.status.HasField("timestamp")


def test_a_suspended_task_names_each_wait_not_yet_answered_as_a_data_part() -> None:
    answered = WaitingFor(tool_call_id="call_0_1", tool_name="read_files", kind="local_read", paths=["a.md"],
                          delivered=True)
    reading = WaitingFor(tool_call_id="call_0_2", tool_name="read_files", kind="local_read", paths=["b.md"],
                         delivered=False)
    task = task_of(view(RunStatus.SUSPENDED, waiting_for=[CLIENT_WAIT, answered, reading]))
    text, *waits = task.status.message.parts
    assert [data_of(p) for p in waits] == [
        {"kind": "client_tool", "tool_call_id": "call_0_0", "tool": "pick_color", "args": {"hint": "warm"}},
        {"kind": "local_read", "tool_call_id": "call_0_2", "tool": "read_files", "paths": ["b.md"]},
    ]
    assert '"tool_call_id": "call_0_0", "result": <JSON>' in text.text and "call_0_1" not in text.text


def test_events_become_updates_and_a_suspension_names_its_calls() -> None:
    mapper = EventMapper(str(RUN), str(ROOT))
    script = [
        event(1, EventKind.RUN_QUEUED, root_id=str(ROOT), root_seq=0),
        event(2, EventKind.MODEL_RESPONDED, content="", tool_calls=[{"id": "call_0_0", "name": "pick_color",
                                                                     "args": {"hint": "warm"}}]),
        event(3, EventKind.TOOL_SUSPENDED, tool_call_id="call_0_0", name="pick_color", kind="client_tool",
              args={"hint": "warm"}),
        event(4, EventKind.RUN_SUSPENDED, waiting_for=["call_0_0"]),
        event(5, EventKind.INPUT_DELIVERED, tool_call_id="call_0_0"),
        event(6, EventKind.ROUND_RESUMED, boundary_seq=0, tool_calls=["call_0_0"]),
        event(7, EventKind.RUN_COMPLETED, output="picked"),
    ]
    updates = [(e.seq, u) for e in script for u in mapper.updates(e)]
    shown = [(seq, type(u).__name__, TaskState.Name(u.status.state) if hasattr(u, "status") else None)
             for seq, u in updates]
    assert shown == [
        (2, "TaskStatusUpdateEvent", "TASK_STATE_WORKING"),
        (4, "TaskStatusUpdateEvent", "TASK_STATE_INPUT_REQUIRED"),
        (6, "TaskStatusUpdateEvent", "TASK_STATE_WORKING"),
        (7, "TaskArtifactUpdateEvent", None),
        (7, "TaskStatusUpdateEvent", "TASK_STATE_COMPLETED"),
    ]
    waiting = updates[1][1].status.message  # type: ignore[union-attr]
    assert data_of(waiting.parts[1]) == {"kind": "client_tool", "tool_call_id": "call_0_0", "tool": "pick_color",
                                         "args": {"hint": "warm"}}
    budget = mapper.updates(event(8, EventKind.RUN_SUSPENDED, waiting_for=[], budget={"window_ends_at": "T"}))
    assert data_of(budget[0].status.message.parts[1]) == {"kind": "budget", "window_ends_at": "T"}  # type: ignore[union-attr]


def test_a_stream_ends_only_at_the_suspension_the_run_is_still_in() -> None:
    suspended = event(4, EventKind.RUN_SUSPENDED, waiting_for=["call_0_0"])
    now = view(RunStatus.SUSPENDED, waiting_for=[CLIENT_WAIT])
    assert still_waiting(now, suspended)
    later = WaitingFor(tool_call_id="call_2_0", tool_name="pick_color", kind="client_tool", args={}, delivered=False)
    assert not still_waiting(view(RunStatus.SUSPENDED, waiting_for=[later]), suspended)  # replayed, since answered
    assert not still_waiting(view(RunStatus.RUNNING), suspended)


def answer_message(*answers: Any) -> Message:
    return Message(message_id="m", role=Role.ROLE_USER, parts=[new_data_part(a) for a in answers])


@pytest.mark.parametrize(
    ("answer", "field", "message"),
    [
        ("red", "message.parts[0].data", "an answer is a JSON object"),
        ({"tool_call_id": "c"}, "message.parts[0].data", "one of result, decision"),
        ({"tool_call_id": "c", "result": 1, "retry": True}, "message.parts[0].data", "one of result, decision"),
        ({"result": 1}, "message.parts[0].data.tool_call_id", "is required"),
        ({"tool_call_id": "c", "result": 1, "color": "red"}, "message.parts[0].data.color", "is not a field"),
        ({"tool_call_id": "c", "result": 1, "is_error": "yes"}, "message.parts[0].data.is_error", "boolean"),
        ({"tool_call_id": "", "result": 1}, "message.parts[0].data.tool_call_id", "must not be empty"),
        ({"tool_call_id": "c", "decision": "maybe"}, "message.parts[0].data.decision", '"approve" or "reject"'),
        ({"tool_call_id": "c", "decision": "reject"}, "message.parts[0].data.reason", "must say why"),
        ({"tool_call_id": "c", "decision": "approve", "reason": "x"}, "message.parts[0].data.reason", "only a rejec"),
        ({"tool_call_id": "c", "decision": "approve", "args": [1]}, "message.parts[0].data.args", "JSON object"),
        ({"tool_call_id": "c", "retry": False}, "message.parts[0].data.retry", "must be true"),
        ({"tool_call_id": "c", "files": {"a.md": 3}}, "message.parts[0].data.files[0].content", "string"),
        ({"value": 1}, "message.parts[0].data.key", "is required"),
    ],
)
def test_an_answer_of_the_wrong_shape_is_refused_naming_its_field(answer: Any, field: str, message: str) -> None:
    with pytest.raises(ReplyInvalid, match=message) as refused:
        replies_of(answer_message(answer))
    assert refused.value.field == field


def test_whole_numbers_come_back_as_ints_and_text_parts_are_no_answers() -> None:
    (reply,) = replies_of(answer_message({"tool_call_id": "c", "result": {"n": 3, "x": 0.5, "l": [1, 2.0]}}))
    assert reply.body["result"] == {"n": 3, "x": 0.5, "l": [1, 2]}
    assert isinstance(reply.body["result"]["n"], int)
    with pytest.raises(ReplyInvalid, match="carries answers"):
        replies_of(Message(message_id="m", role=Role.ROLE_USER, parts=[Part(text="red")]))
    with pytest.raises(ReplyInvalid, match="send the answers"):
        replies_of(Message(message_id="m", role=Role.ROLE_USER))


def test_answers_must_name_what_the_task_waits_for_once_each() -> None:
    approval = WaitingFor(tool_call_id="call_0_1", tool_name="write", kind="approval", args={}, delivered=False)
    prerequisite = WaitingFor(tool_call_id="call_0_2", tool_name="deploy", kind="prerequisite", key="region",
                              delivered=False)
    waits = [CLIENT_WAIT, approval, prerequisite]
    good = [reply_of({"tool_call_id": "call_0_0", "result": "red"}, "a"),
            reply_of({"tool_call_id": "call_0_1", "decision": "reject", "reason": "no"}, "b"),
            reply_of({"key": "region", "value": "eu"}, "c")]
    check_waited_for(good, waits)
    refused = [
        ([reply_of({"tool_call_id": "call_9", "result": 1}, "a")], "a.tool_call_id", "does not wait for 'call_9'"),
        ([reply_of({"tool_call_id": "call_0_1", "result": 1}, "a")], "a.tool_call_id", "waits for approval"),
        ([reply_of({"key": "zone", "value": 1}, "a")], "a.key", "does not wait for 'zone'"),
        ([good[0], reply_of({"tool_call_id": "call_0_0", "result": 2}, "b")], "b.tool_call_id", "answered twice"),
    ]
    for replies, field, message in refused:
        with pytest.raises(ReplyInvalid, match=message) as caught:
            check_waited_for(replies, waits)
        assert caught.value.field == field


def test_the_card_lists_a_skill_per_tool_and_an_absolute_interface() -> None:
    agent = AgentView(owner="team-a", name="helper", version=3, description="helps", overridable=[], created_at=NOW,
                      config={"tools": ["add"], "client_tools": [{"name": "pick_color", "description": "Pick."}]})
    card = card_of(agent, "http://api.example/a2a/helper", lambda name: f"the {name} tool")
    assert (card.name, card.description, card.version) == ("helper", "helps", "3")
    assert [(i.url, i.protocol_version) for i in card.supported_interfaces] == [
        ("http://api.example/a2a/helper", "1.0"), ("http://api.example/a2a/helper", "0.3")]
    assert [(s.id, s.description, list(s.tags)) for s in card.skills] == [
        ("add", "the add tool", ["tool"]),
        ("pick_color", "Pick. (runs on the client: the task waits for its result as input-required)", ["client_tool"]),
    ]
    assert card.capabilities.streaming and card.capabilities.push_notifications
    bare = card_of(agent.model_copy(update={"config": {}}), "http://x/a2a/helper", lambda name: "")
    assert [s.id for s in bare.skills] == ["helper"]

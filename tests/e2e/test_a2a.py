"""The A2A server of a saved agent (``/a2a/{agent}``), driven by the official a2a-sdk
client (protocol 1.0, JSON-RPC) against a real API process and real workers: the card; a
task sent, streamed, cancelled; a client tool's wait answered with a data part on the same
task, resuming it with no extra model call; push notifications through the signed webhook
outbox; a task streamed across an API restart; tenants kept apart; and protocol errors
answered as JSON-RPC errors, storing nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from tests.support.api import BODY_LIMIT, A, ApiServer, B, counts
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import calls_per_boundary, wait_terminal
from tests.support.requests import PICK_COLOR
from tests.support.suspensions import assert_unchanged, snapshot
from tests.support.wait import wait_until
from tests.support.webhook_receiver import LoopbackReceiver, loopback_receiver
from worker import client

T = TypeVar("T")
ADD = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]
ASK = [{"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]}, {"content": "picked"}]
SLOW = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 1}}], "latency_ms": 1500},
        {"content": "slow and steady", "latency_ms": 1500}]
SECRET = "whsec-a2a-0123456789abcdef"
DELIVERER_ENV = {"AIDAWORK_WEBHOOK_SECRET": SECRET, "AIDAWORK_WEBHOOK_POLL_S": "0.2",
                 "AIDAWORK_WEBHOOK_BACKOFF_S": "0.2", "AIDAWORK_WEBHOOK_BACKOFF_MAX_S": "0.5"}
RPC_HEADERS = {**A, "A2A-Version": "1.0"}
STATE = TaskState.Name


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def agent_spec(turns: list[dict[str, Any]], *, description: str = "adds numbers", tools: tuple[str, ...] = ("add",),
               client_tools: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    config: dict[str, Any] = {"model": {"provider": "scripted", "turns": turns}, "system_prompt": "test",
                              "tools": list(tools), "policy": {"max_rounds": 20}}
    if client_tools:
        config["client_tools"] = list(client_tools)
    return {"description": description, "config": config}


@asynccontextmanager
async def a2a(api: ApiServer, agent: str, headers: dict[str, str] = A, *, streaming: bool = True
              ) -> AsyncIterator[Client]:
    """The official client for ``agent``: the card fetched from its URL, the token a
    default header (the client ignores the card's security schemes)."""
    async with httpx.AsyncClient(headers=headers, timeout=60.0) as http:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        yield await create_client(f"http://127.0.0.1:{api.port}/a2a/{agent}", client_config=config)


def text_message(text: str, *, context_id: str = "", task_id: str = "") -> Message:
    return Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[new_text_part(text)],
                   context_id=context_id, task_id=task_id)


def answer_message(task_id: str, *answers: dict[str, Any]) -> Message:
    return Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, task_id=task_id,
                   parts=[new_data_part(a) for a in answers])


def shown(event: StreamResponse) -> str:
    """One stream event as the client sees it, on one line."""
    kind = event.WhichOneof("payload")
    body = MessageToDict(getattr(event, kind))
    if kind == "task":
        return f"task {STATE(event.task.status.state)} {json.dumps(body.get('status', {}).get('message', {}))}"
    if kind == "status_update":
        status = body["status"]
        return f"status_update {status['state']} {json.dumps(status.get('message', {}).get('parts', []))}"
    return f"{kind} {json.dumps(body)}"


async def collect(stream: AsyncIterator[StreamResponse], log: list[str] | None = None) -> list[StreamResponse]:
    out = []
    async for event in stream:
        out.append(event)
        if log is not None:
            log.append(shown(event))
    return out


def states(events: list[StreamResponse]) -> list[str]:
    found = []
    for event in events:
        if event.HasField("task"):
            found.append(STATE(event.task.status.state))
        elif event.HasField("status_update"):
            found.append(STATE(event.status_update.status.state))
        elif event.HasField("artifact_update"):
            found.append("artifact")
    return found


def rpc(api: ApiServer, body: Any, *, headers: dict[str, str] = RPC_HEADERS, content: bytes | None = None
        ) -> dict[str, Any]:
    """A raw JSON-RPC call: its answer must be a JSON-RPC response (HTTP 200)."""
    sent = api.http.post("/a2a/helper", content=content if content is not None else json.dumps(body),
                         headers={**headers, "Content-Type": "application/json"})
    assert sent.status_code == 200, sent.text
    answer = sent.json()
    assert answer["jsonrpc"] == "2.0", answer
    return answer  # type: ignore[no-any-return]


def test_the_card_and_every_protocol_error_are_answered_and_nothing_is_stored(api: ApiServer, ctx: Any) -> None:
    client.create_agent("team-a", "helper", agent_spec(ADD, client_tools=(PICK_COLOR,)), ctx=ctx)
    client.create_agent("team-b", "theirs", agent_spec(ADD), ctx=ctx)

    card = api.http.get("/a2a/helper/.well-known/agent-card.json", headers=A)
    assert card.status_code == 200, card.text
    body = card.json()
    assert (body["name"], body["description"], body["version"]) == ("helper", "adds numbers", "1")
    assert body["capabilities"] == {"streaming": True, "pushNotifications": True}
    rpc_url = f"http://127.0.0.1:{api.port}/a2a/helper"
    assert body["supportedInterfaces"][0] == {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    assert [(s["id"], s["tags"]) for s in body["skills"]] == [("add", ["tool"]), ("pick_color", ["client_tool"])]
    assert body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    # Another owner's agent, an unknown one, a name no agent can have: 404 in the API's shape.
    for path, headers in [("/a2a/theirs", A), ("/a2a/helper", B), ("/a2a/nobody", A), ("/a2a/no%20such", A)]:
        missing = api.http.get(f"{path}/.well-known/agent-card.json", headers=headers)
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "AGENT_NOT_FOUND"), missing.text
    assert api.http.get("/a2a/helper/.well-known/agent-card.json").status_code == 401
    assert api.http.post("/a2a/helper", json={}).status_code == 401
    assert api.http.post("/a2a/helper/", json={}, headers=A).status_code == 404  # no redirect to build from Host

    before = counts(ctx.engine)
    task = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": str(uuid.uuid4())}}
    cases = {
        "malformed JSON": (rpc(api, None, content=b'{"jsonrpc": "2.0", "id": 1, "method": '), -32700),
        "not UTF-8": (rpc(api, None, content=b'{"jsonrpc": "2.0", "x": "\xff"}'), -32700),
        "nested past the parser": (rpc(api, None, content=b"[" * 30_000 + b"]" * 30_000), -32700),
        "not a request": (rpc(api, {"hello": "world"}), -32600),
        "unknown method": (rpc(api, {"jsonrpc": "2.0", "id": 2, "method": "tasks/explode", "params": {}}), -32601),
        "bad params": (rpc(api, {"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": [1]}}), -32602),
        "unknown task": (rpc(api, task), -32001),
        "not a task id": (rpc(api, {**task, "params": {"id": "../../etc"}}), -32001),
        "an empty message": (rpc(api, {"jsonrpc": "2.0", "id": 4, "method": "SendMessage", "params": {"message": {
            "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": " "}]}}}), -32602),
        "a data part with no task": (rpc(api, {"jsonrpc": "2.0", "id": 5, "method": "SendMessage", "params": {
            "message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"data": {"result": 1}}]}}}), -32602),
        "an unknown context": (rpc(api, {"jsonrpc": "2.0", "id": 6, "method": "SendMessage", "params": {"message": {
            "messageId": "m3", "role": "ROLE_USER", "contextId": str(uuid.uuid4()), "parts": [{"text": "hi"}]}}}),
            -32602),
        "a push URL not allowed": (rpc(api, {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {
            "message": {"messageId": "m4", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
            "configuration": {"taskPushNotificationConfig": {"url": "http://127.0.0.1:9/hook"}}}}), -32602),
        "over the body limit": (rpc(api, None, content=b'{"x": "' + b"a" * BODY_LIMIT + b'"}'), -32600),
        "0.3's tasks/get": (rpc(api, {**task, "method": "tasks/get"}, headers=A), -32001),
    }
    for what, (answer, code) in cases.items():
        assert answer["error"]["code"] == code, (what, answer)
        print(f"{what}: {answer['error']['code']} {answer['error']['message'][:100]}")
    # A chunked body over the limit is refused while it is read: a JSON-RPC error too.
    chunks = (b'{"x": "' + b"a" * 4096 for _ in range(BODY_LIMIT // 4096 + 2))
    chunked = api.http.post("/a2a/helper", content=chunks, headers=RPC_HEADERS)
    assert (chunked.status_code, chunked.json()["error"]["code"]) == (200, -32600), chunked.text
    assert counts(ctx.engine) == before


def test_tasks_are_sent_streamed_continued_cancelled_and_kept_per_tenant(
    cluster: Cluster, api: ApiServer, ctx: Any
) -> None:
    cluster.start_worker("w1", concurrency=4)
    wait_ready(cluster, "w1")
    client.create_agent("team-a", "helper", agent_spec(ADD), ctx=ctx)
    client.create_agent("team-b", "helper", agent_spec(ADD), ctx=ctx)
    client.create_agent("team-a", "asker", agent_spec(ASK, tools=(), client_tools=(PICK_COLOR,)), ctx=ctx)

    async def go() -> None:
        async with a2a(api, "helper", streaming=False) as blocking:
            (sent,) = await collect(blocking.send_message(SendMessageRequest(message=text_message("Add 2 and 3."))))
            task = sent.task
            assert STATE(task.status.state) == "TASK_STATE_COMPLETED", task
            assert task.artifacts[0].parts[0].text == "5" and task.metadata["agent"] == "helper@1"
            view = client.status(uuid.UUID(task.id), ctx=ctx)
            assert (str(view.root_id), view.agent, view.output) == (task.context_id, "helper@1", "5")
            # The same context, no task: a new task on the same Root.
            (again,) = await collect(blocking.send_message(SendMessageRequest(
                message=text_message("Again.", context_id=task.context_id))))
            assert again.task.context_id == task.context_id and again.task.id != task.id
            got = await blocking.get_task(GetTaskRequest(id=task.id))
            assert STATE(got.status.state) == "TASK_STATE_COMPLETED" and got.status.message.parts[0].text == "5"
            # A message over the API's body limit reaches the client as a JSON-RPC error.
            with pytest.raises(InvalidRequestError, match="Payload too large"):
                await collect(blocking.send_message(SendMessageRequest(message=text_message("x" * BODY_LIMIT))))

        async with a2a(api, "helper") as streaming:
            log: list[str] = []
            events = await collect(streaming.send_message(SendMessageRequest(message=text_message("Stream it."))), log)
            print("\n".join(["stream:", *log]))
            assert states(events) == ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_WORKING", "artifact",
                                      "TASK_STATE_COMPLETED"], log
            assert events[-2].artifact_update.artifact.parts[0].text == "5"

        # 0.3's method names and shapes, through the SDK's compatibility layer (no A2A-Version).
        legacy = api.http.post("/a2a/helper", headers=A, json={
            "jsonrpc": "2.0", "id": "old", "method": "message/send", "params": {"message": {
                "kind": "message", "messageId": uuid.uuid4().hex, "role": "user",
                "parts": [{"kind": "text", "text": "Add 2 and 3."}]}}}).json()
        assert (legacy["result"]["kind"], legacy["result"]["status"]["state"]) == ("task", "completed"), legacy
        assert legacy["result"]["artifacts"][0]["parts"] == [{"kind": "text", "text": "5"}]

        # Another tenant's agent of the same name sees none of team-a's tasks.
        async with a2a(api, "helper", B) as theirs:
            with pytest.raises(TaskNotFoundError):
                await theirs.get_task(GetTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await theirs.cancel_task(CancelTaskRequest(id=task.id))
        # Nor does another agent of the same owner.
        async with a2a(api, "asker", streaming=False) as asker:
            with pytest.raises(TaskNotFoundError):
                await asker.get_task(GetTaskRequest(id=task.id))
            (waiting,) = await collect(asker.send_message(SendMessageRequest(message=text_message("Pick."))))
            assert STATE(waiting.task.status.state) == "TASK_STATE_INPUT_REQUIRED"
            cancelled = await asker.cancel_task(CancelTaskRequest(id=waiting.task.id))
            assert STATE(cancelled.status.state) == "TASK_STATE_CANCELED"
            with pytest.raises(TaskNotCancelableError):
                await asker.cancel_task(CancelTaskRequest(id=waiting.task.id))
            with pytest.raises(UnsupportedOperationError, match="has ended"):
                await collect(asker.send_message(SendMessageRequest(message=answer_message(
                    waiting.task.id, {"tool_call_id": "call_0_0", "result": "red"}))))

    run(go())


def test_a_client_tool_wait_is_answered_on_the_same_task_without_a_model_call(
    cluster: Cluster, api: ApiServer, ctx: Any
) -> None:
    cluster.start_worker("w1", concurrency=4)
    wait_ready(cluster, "w1")
    client.create_agent("team-a", "asker", agent_spec(ASK, tools=(), client_tools=(PICK_COLOR,)), ctx=ctx)
    conversation: list[str] = []

    async def go() -> str:
        async with a2a(api, "asker") as asker:
            conversation.append("client -> SendStreamingMessage: text 'Pick a warm color.'")
            first = await collect(asker.send_message(SendMessageRequest(message=text_message("Pick a warm color."))),
                                  conversation)
            assert states(first) == ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED"]
            task_id = first[0].task.id
            status = first[-1].status_update.status
            (wait,) = [MessageToDict(p.data) for p in status.message.parts if p.HasField("data")]
            assert wait == {"kind": "client_tool", "tool_call_id": "call_0_0", "tool": "pick_color",
                            "args": {"hint": "warm"}}

            # Refused answers: each a JSON-RPC error, and nothing stored.
            before = snapshot(ctx)
            refusals = [
                ({"tool_call_id": "call_9_9", "result": "red"}, "does not wait for 'call_9_9'"),
                ({"tool_call_id": "call_0_0", "decision": "approve"}, "waits for client_tool"),
                ({"tool_call_id": "call_0_0", "result": "red", "extra": 1}, "is not a field"),
                ({"tool_call_id": "call_0_0"}, "one of result, decision"),
            ]
            for refused, why in refusals:
                with pytest.raises(InvalidParamsError, match=why):
                    await collect(asker.send_message(SendMessageRequest(message=answer_message(task_id, refused))))
            with pytest.raises(InvalidParamsError, match="carries answers"):
                await collect(asker.send_message(SendMessageRequest(message=text_message("red", task_id=task_id))))
            assert_unchanged(ctx, before, "refused answers")

            answer = {"tool_call_id": "call_0_0", "result": {"color": "red", "shade": 3}}
            conversation.append(f"client -> SendStreamingMessage: taskId {task_id}, data {json.dumps(answer)}")
            second = await collect(asker.send_message(SendMessageRequest(message=answer_message(task_id, answer))),
                                   conversation)
            assert states(second)[-2:] == ["artifact", "TASK_STATE_COMPLETED"], conversation
            assert second[-1].status_update.task_id == task_id
            return task_id

    task_id = run(go())
    print("\nthe conversation, as the client sees it:\n" + "\n".join(conversation))
    run_id = uuid.UUID(task_id)
    view = client.status(run_id, ctx=ctx)
    assert (view.status, view.output, view.model_calls) == ("completed", "picked", 2)
    # One model call per round: round 0 resumed with the answer, not asked of the model again.
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    (result,) = [e for e in client.events(run_id, follow=False, ctx=ctx) if e.kind == "tool_completed"]
    assert result.data["result"] == {"color": "red", "shade": 3}  # 3, not 3.0: a whole number stays an int


def test_push_notifications_are_the_runs_signed_webhook(cluster: Cluster, ctx: Any, db_url: str, tmp_path: Path
                                                       ) -> None:
    with loopback_receiver() as receiver:
        server = ApiServer(db_url, tmp_path / "api.log", {"AIDAWORK_WEBHOOK_URLS": receiver.url + "/hooks/",
                                                          "AIDAWORK_WEBHOOK_SECRET": SECRET})
        try:
            server.wait_ready()
            push_case(cluster, server, ctx, receiver)
        finally:
            server.stop()


def push_case(cluster: Cluster, api: ApiServer, ctx: Any, receiver: LoopbackReceiver) -> None:
    cluster.start_worker("w1", concurrency=4)
    cluster.start_webhooks(env=DELIVERER_ENV)
    wait_ready(cluster, "w1")
    client.create_agent("team-a", "asker", agent_spec(ASK, tools=(), client_tools=(PICK_COLOR,)), ctx=ctx)
    url = f"{receiver.url}/hooks/a2a?k=1"

    async def go() -> tuple[str, str]:
        async with a2a(api, "asker", streaming=False) as asker:
            (later,) = await collect(asker.send_message(SendMessageRequest(message=text_message("Pick."))))
            task_id = later.task.id
            with pytest.raises(InvalidParamsError, match="not under any of the allowed prefixes"):
                await asker.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/elsewhere"))
            with pytest.raises(InvalidParamsError, match="token and authentication"):
                await asker.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=task_id, url=url, token="t"))
            with pytest.raises(TaskNotFoundError):
                await asker.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id=task_id, id="webhook"))
            made = await asker.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url=url))
            assert (made.task_id, made.id, made.url) == (task_id, "webhook", url)
            got = await asker.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="webhook"))
            listed = await asker.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id))
            assert got.url == url and [c.url for c in listed.configs] == [url]
            (done,) = await collect(asker.send_message(SendMessageRequest(message=answer_message(
                task_id, {"tool_call_id": "call_0_0", "result": "red"}))))
            assert STATE(done.task.status.state) == "TASK_STATE_COMPLETED"

            # A push config given with the message: the new run's webhook from its submit.
            config = SendMessageConfiguration(task_push_notification_config=TaskPushNotificationConfig(url=url))
            (given,) = await collect(asker.send_message(SendMessageRequest(message=text_message("Pick."),
                                                                           configuration=config)))
            await asker.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=given.task.id, id="webhook"))
            emptied = await asker.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=given.task.id))
            assert list(emptied.configs) == []
            return task_id, given.task.id

    task_id, removed = run(go())

    def arrived() -> list[tuple[str, str]]:
        return [(b["kind"], b["owner"]) for b in receiver.bodies("/hooks/a2a") if b["run_id"] == task_id]

    wait_until(arrived, timeout_s=30, what="the task's completion to be pushed")
    assert arrived() == [("run_completed", "team-a")]  # set while it waited: only what came after
    receiver.assert_signed_by(cluster.db_url, "team-a", SECRET)
    # The config given with the message was the run's webhook from its submit: its
    # run_suspended was queued; removing the config left nothing pending.
    (hook,) = client.status(uuid.UUID(removed), ctx=ctx).webhooks
    assert (hook.event_kind, hook.status in ("delivered", "failed")) == ("run_suspended", True), hook
    print(f"deliveries: {[(b['run_id'][:8], b['kind']) for b in receiver.bodies('/hooks/a2a')]}")


def test_a_stream_cut_by_an_api_restart_is_resumed_by_subscribing(
    cluster: Cluster, ctx: Any, db_url: str, tmp_path: Path
) -> None:
    cluster.start_worker("w1", concurrency=4)
    wait_ready(cluster, "w1")
    client.create_agent("team-a", "slow", agent_spec(SLOW), ctx=ctx)
    first = ApiServer(db_url, tmp_path / "api1.log")
    first.wait_ready()

    async def cut() -> str:
        try:
            async with a2a(first, "slow") as slow:
                async for event in slow.send_message(SendMessageRequest(message=text_message("Take your time."))):
                    assert event.HasField("task")
                    return event.task.id
        finally:
            first.stop()  # SIGKILL, mid-stream: the run goes on in the worker
        raise AssertionError("the stream sent nothing")

    task_id = run(cut())
    second = ApiServer(db_url, tmp_path / "api2.log")
    try:
        second.wait_ready()

        async def resume() -> list[str]:
            log: list[str] = []
            async with a2a(second, "slow") as slow:
                await collect(slow.subscribe(SubscribeToTaskRequest(id=task_id)), log)
                again = await collect(slow.subscribe(SubscribeToTaskRequest(id=task_id)))
                assert states(again)[-2:] == ["artifact", "TASK_STATE_COMPLETED"]  # replayed once it ended too
            return log

        log = run(resume())
        print("\n".join(["subscribed after the restart:", *log]))
        assert log[-1].startswith("status_update TASK_STATE_COMPLETED"), log
        assert [line.split()[0] for line in log][-2:] == ["artifact_update", "status_update"]
        assert wait_terminal(ctx.engine, uuid.UUID(task_id))["output"] == "slow and steady"
    finally:
        second.stop()


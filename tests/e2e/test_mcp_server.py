"""The MCP server at ``/mcp``, driven by the official ``mcp`` client (streamable HTTP,
``httpx2`` with the bearer header) against a real API process, PostgreSQL and workers:
the owner's agents as tools; a call run to completion with its events as progress; a
client tool's wait answered by elicitation (protocol 2026-07-28, multi round-trip), by
``task.answer`` for a client that cannot elicit, and through the tasks extension
(``tasks/get``, ``tasks/update``), each resuming with no extra model call; a task polled to
completion across an API restart; another tenant's task refused as not found; and bad
requests answered in MCP's own error shapes, storing nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx2
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolResult,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    InputRequiredResult,
    Request,
    RequestParams,
    Result,
)
from pydantic import ConfigDict

from tests.support.api import BODY_LIMIT, A, ApiServer, B, counts
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_suspended
from tests.support.requests import PICK_COLOR, scripted_request

T = TypeVar("T")
TASKS = "io.modelcontextprotocol/tasks"
ADD = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]
ASK = [{"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]}, {"content": "picked"}]
ARGS = {"input": "pick one"}
# Slow enough (6 s of model time) that the API restart lands while the task is working.
SLOW = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 1}}], "latency_ms": 3000},
        {"content": "slow and steady", "latency_ms": 3000}]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# --- the tasks extension, client side: its requests and results as pydantic models -----


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any]


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"  # the extension's routing header (Mcp-Name)


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class TaskPayload(Request[TaskParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: TaskParams
    name_param = "taskId"


class Task(Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class CreatedTask(Task):
    result_type: Literal["task"]


class TaskResult(Task):
    result: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class Acknowledged(Result):
    model_config = ConfigDict(extra="allow")


Answer = Callable[[str, dict[str, Any]], dict[str, Any]]


async def get_task(session: ClientSession, task_id: str) -> TaskResult:
    return await session.send_request(GetTask(params=TaskParams(task_id=task_id)), TaskResult)


async def poll_task(session: ClientSession, task_id: str, answer: Answer | None = None) -> TaskResult:
    """``tasks/get`` until the task ends; its input requests answered with ``tasks/update``."""
    answered: set[str] = set()
    for _ in range(600):
        task = await get_task(session, task_id)
        if task.status in ("completed", "failed", "cancelled"):
            return task
        fresh = {k: v for k, v in (task.input_requests or {}).items() if k not in answered}
        if task.status == "input_required" and fresh and answer is not None:
            responses = {key: answer(key, request) for key, request in fresh.items()}
            params = UpdateParams(task_id=task_id, input_responses=responses)
            await session.send_request(UpdateTask(params=params), Acknowledged)
            answered |= set(fresh)
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} did not end")


class Tasks(ClientExtension):
    """The tasks extension: a call answered with a task is polled to its result."""

    identifier = TASKS

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer
        self.created: list[CreatedTask] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        self.created.append(created)
        task = await poll_task(ctx.session, created.task_id, self.answer)
        assert task.result is not None, task
        return CallToolResult.model_validate(task.result)


def red(key: str, request: dict[str, Any]) -> dict[str, Any]:
    """A person at the client answering a pick_color form."""
    assert request["method"] == "elicitation/create" and "pick_color" in request["params"]["message"], request
    return {"action": "accept", "content": {"result": json.dumps({"color": "red"})}}


# --- connecting ---------------------------------------------------------------------------


@asynccontextmanager
async def connected(api: ApiServer, headers: dict[str, str] = A, **options: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=120.0)) as http:
        transport = streamable_http_client(f"http://127.0.0.1:{api.port}/mcp", http_client=http)
        async with Client(transport, **options) as client:
            yield client


def save_agent(api: ApiServer, name: str, turns: list[dict[str, Any]], headers: dict[str, str] = A,
               **config: Any) -> None:
    body = {"name": name, "description": f"the {name} agent", "config": scripted_request(turns, **config)["config"]}
    answer = api.http.post("/v1/agents", json=body, headers=headers)
    assert answer.status_code == 201, answer.text


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def started_workers(cluster: Cluster) -> None:
    cluster.start_worker("w1", concurrency=4)
    wait_ready(cluster, "w1")


# --- the tests ---------------------------------------------------------------------------


def test_each_owner_lists_its_own_agents_and_a_call_runs_to_completion_with_progress(
    api: ApiServer, cluster: Cluster, ctx: Any
) -> None:
    save_agent(api, "adder", ADD, tools=["add"])
    save_agent(api, "theirs", ADD, headers=B, tools=["add"])
    started_workers(cluster)
    progress: list[tuple[float, str | None]] = []
    legacy_progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def on_legacy_progress(value: float, total: float | None, message: str | None) -> None:
        legacy_progress.append(message)

    async def go() -> tuple[list[str], list[str], CallToolResult, CallToolResult]:
        async with connected(api) as mine, connected(api, B) as theirs:
            listed = [t.name for t in (await mine.list_tools()).tools]
            their_list = [t.name for t in (await theirs.list_tools()).tools]
            done = await mine.call_tool("adder", {"input": "add 2 and 3"}, progress_callback=on_progress)
        async with connected(api, mode="legacy") as legacy:  # an initialize-era client
            again = await legacy.call_tool("adder", {"input": "again", "root_id": done.structured_content["root_id"]},
                                           progress_callback=on_legacy_progress)
        return listed, their_list, done, again

    listed, their_list, done, again = run(go())
    assert listed == ["adder", "task.status", "task.cancel", "task.answer"]
    assert their_list == ["theirs", "task.status", "task.cancel", "task.answer"]
    assert (done.is_error, text_of(done)) == (False, "5"), done
    structured = done.structured_content
    assert (structured["status"], structured["output"], structured["agent"]) == ("completed", "5", "adder@1")
    # The run's events went out as progress, in order: the model's tool call, the tool, the end.
    messages = [m for _, m in progress]
    assert "the model called add" in messages and "tool_completed: add" in messages, progress
    assert [v for v, _ in progress] == sorted(v for v, _ in progress)
    assert progress[0][0] == 1, progress  # from the run's first event, whatever a worker did before the wait
    assert (again.is_error, text_of(again), again.structured_content["root_id"]) == (False, "5", structured["root_id"])
    assert "tool_completed: add" in legacy_progress, legacy_progress
    assert calls_per_boundary(ctx.engine, uuid.UUID(structured["run_id"])) == {0: 1, 1: 1}


def test_a_client_tools_wait_is_answered_by_elicitation_or_task_answer_without_another_model_call(
    api: ApiServer, cluster: Cluster, ctx: Any
) -> None:
    save_agent(api, "colors", ASK, tools=[], client_tools=[PICK_COLOR])
    started_workers(cluster)
    asked: list[ElicitRequestParams] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        asked.append(params)
        return ElicitResult(action="accept", content={"result": '{"color": "green"}'})

    async def go() -> tuple[CallToolResult, CallToolResult, CallToolResult, CallToolResult]:
        async with connected(api, elicitation_callback=elicit) as eliciting:
            by_elicitation = await eliciting.call_tool("colors", {"input": "pick one"})
        async with connected(api) as plain:
            waiting = await plain.call_tool("colors", {"input": "pick one"})
            run_id = waiting.structured_content["run_id"]
            wrong = await plain.call_tool("task.answer", {"run_id": run_id, "answers": [
                {"tool_call_id": "call_9_9", "result": {"color": "blue"}}]})
            answered = await plain.call_tool("task.answer", {"run_id": run_id, "answers": [
                {"tool_call_id": "call_0_0", "result": {"color": "blue"}}]})
        return by_elicitation, waiting, wrong, answered

    by_elicitation, waiting, wrong, answered = run(go())
    (form,) = asked
    assert "pick_color" in form.message and form.requested_schema["required"] == ["result"], form
    assert (by_elicitation.is_error, text_of(by_elicitation)) == (False, "picked"), by_elicitation
    # Without elicitation the call says what the run waits for, and how to answer it.
    assert waiting.is_error is False and waiting.structured_content["status"] == "input_required", waiting
    (wait,) = waiting.structured_content["waiting_for"]
    assert (wait["kind"], wait["tool_call_id"], wait["args"]) == ("client_tool", "call_0_0", {"hint": "warm"})
    assert "task.answer" in text_of(waiting)
    assert wrong.is_error and "call_9_9" in text_of(wrong), wrong
    assert (answered.is_error, text_of(answered)) == (False, "picked"), answered
    for result, color in [(by_elicitation, "green"), (answered, "blue")]:
        run_id = uuid.UUID(result.structured_content["run_id"])
        (tool,) = rows(ctx.engine, "SELECT result FROM tool_invocations WHERE run_id = :id", id=run_id)
        assert tool["result"] == {"color": color}
        # One model call per boundary: the round was resumed, not asked of the model again.
        assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}


def test_a_task_of_the_tasks_extension_is_answered_with_tasks_update_and_can_be_cancelled(
    api: ApiServer, cluster: Cluster, ctx: Any
) -> None:
    save_agent(api, "colors", ASK, tools=[], client_tools=[PICK_COLOR])
    started_workers(cluster)
    tasks = Tasks(answer=red)

    async def go() -> tuple[CallToolResult, TaskResult, TaskResult, CallToolResult]:
        async with connected(api, extensions=[tasks]) as client:
            done = await client.call_tool("colors", {"input": "pick one"})
            task_id = tasks.created[0].task_id
            payload = await client.session.send_request(TaskPayload(params=TaskParams(task_id=task_id)),
                                                        CallToolResult)
            other = await client.session.call_tool("colors", {"input": "pick"}, allow_claimed=True)
            assert isinstance(other, CreatedTask), other
            wait_suspended(ctx.engine, uuid.UUID(other.task_id))
            waiting = await get_task(client.session, other.task_id)
            await client.session.send_request(CancelTask(params=TaskParams(task_id=other.task_id)), Acknowledged)
            cancelled = await get_task(client.session, other.task_id)
        return done, waiting, cancelled, payload

    done, waiting, cancelled, payload = run(go())
    assert text_of(payload) == "picked" and payload.structured_content == done.structured_content
    (created,) = tasks.created
    assert (created.status, created.poll_interval_ms) == ("working", 1000)
    assert (done.is_error, text_of(done), done.structured_content["run_id"]) == (False, "picked", created.task_id)
    (tool,) = rows(ctx.engine, "SELECT result FROM tool_invocations WHERE run_id = :id", id=uuid.UUID(created.task_id))
    assert tool["result"] == {"color": "red"}  # the answer given with tasks/update
    assert calls_per_boundary(ctx.engine, uuid.UUID(created.task_id)) == {0: 1, 1: 1}
    assert waiting.status == "input_required" and list(waiting.input_requests or {}) == ["call_0_0"], waiting
    assert cancelled.status == "cancelled", cancelled


def test_a_task_is_polled_to_completion_through_a_new_api_process_after_a_restart(
    api: ApiServer, cluster: Cluster, ctx: Any, db_url: str, tmp_path: Path
) -> None:
    save_agent(api, "slow", SLOW, tools=["add"])
    started_workers(cluster)

    async def create() -> CreatedTask:
        async with connected(api, extensions=[Tasks()]) as client:
            created = await client.session.call_tool("slow", {"input": "take your time"}, allow_claimed=True)
            assert isinstance(created, CreatedTask), created
            return created

    created = run(create())
    api.stop()  # nothing of the task lived in that process
    restarted = ApiServer(db_url, tmp_path / "api-restarted.log")
    try:
        restarted.wait_ready()

        async def finish() -> tuple[TaskResult, TaskResult]:
            async with connected(restarted, extensions=[Tasks()]) as client:
                first = await get_task(client.session, created.task_id)
                return first, await poll_task(client.session, created.task_id)

        first, done = run(finish())
    finally:
        restarted.stop()
    assert first.status == "working", first  # the restart came first
    assert done.status == "completed" and done.result is not None, done
    assert CallToolResult.model_validate(done.result).content[0].text == "slow and steady"  # type: ignore[union-attr]


def test_another_tenants_task_is_not_found_and_refusals_store_nothing(
    api: ApiServer, cluster: Cluster, ctx: Any
) -> None:
    save_agent(api, "colors", ASK, tools=[], client_tools=[PICK_COLOR])
    started_workers(cluster)

    async def never(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        raise AssertionError("the test drives the input rounds itself")

    async def mine() -> tuple[str, InputRequiredResult]:
        async with connected(api, elicitation_callback=never) as client:
            asked = await client.session.call_tool("colors", ARGS, allow_input_required=True)
            assert isinstance(asked, InputRequiredResult) and asked.request_state is not None, asked
            return next(iter(asked.input_requests or {})), asked

    key, asked = run(mine())
    run_id = str(rows(ctx.engine, "SELECT id FROM runs")[0]["id"])
    before = counts(ctx.engine)

    async def theirs() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with connected(api, B, extensions=[Tasks()]) as client:
            with pytest.raises(MCPError) as get:
                await get_task(client.session, run_id)
            out["get"] = get.value
            with pytest.raises(MCPError) as update:
                params = UpdateParams(task_id=run_id, input_responses={"call_0_0": {"action": "accept",
                                                                                    "content": {"result": "1"}}})
                await client.session.send_request(UpdateTask(params=params), Acknowledged)
            out["update"] = update.value
            with pytest.raises(MCPError) as cancel:
                await client.session.send_request(CancelTask(params=TaskParams(task_id=run_id)), Acknowledged)
            out["cancel"] = cancel.value
            out["status"] = await client.call_tool("task.status", {"run_id": run_id})
            out["answer"] = await client.call_tool("task.answer", {"run_id": run_id, "answers": [
                {"tool_call_id": "call_0_0", "result": 1}]})
            with pytest.raises(MCPError) as agent:
                await client.call_tool("colors", {"input": "not yours"})
            out["agent"] = agent.value
            with pytest.raises(MCPError) as replayed:  # a requestState sealed for team-a
                answer = ElicitResult(action="accept", content={"result": "1"})
                await client.session.call_tool("colors", ARGS, input_responses={key: answer},
                                               request_state=asked.request_state, allow_input_required=True)
            out["replayed"] = replayed.value
        return out

    out = run(theirs())
    for name in ("get", "update", "cancel"):
        assert (out[name].code, "Task not found" in out[name].message) == (INVALID_PARAMS, True), out[name]
    for name in ("status", "answer"):
        assert out[name].is_error and "not found" in text_of(out[name]), out[name]
    assert (out["agent"].code, out["agent"].message) == (INVALID_PARAMS, "Unknown tool: colors")
    assert (out["replayed"].code, out["replayed"].message) == (INVALID_PARAMS, "Invalid or expired requestState")
    assert counts(ctx.engine) == before
    assert client_status(ctx, run_id) == "suspended"


def leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for inner in group.exceptions for leaf in leaves(inner)]
    return [group]


def client_status(ctx: Any, run_id: str) -> str:
    return str(rows(ctx.engine, "SELECT status FROM runs WHERE id = :id", id=uuid.UUID(run_id))[0]["status"])


def test_malformed_requests_get_mcp_errors_and_store_nothing(api: ApiServer, ctx: Any) -> None:
    save_agent(api, "adder", ADD, tools=["add"])
    before = counts(ctx.engine)

    async def bad_token() -> None:
        async with connected(api, {"Authorization": "Bearer nope"}):
            pass

    with pytest.raises(BaseExceptionGroup) as refused:  # a 401 fails the connection itself
        run(bad_token())
    (error,) = leaves(refused.value)
    assert isinstance(error, MCPError) and error.message == "the bearer token is not valid", error

    async def checked() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with connected(api) as client:
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("nobody", {"input": "hi"})
            out["unknown"] = unknown.value
            out["missing"] = await client.call_tool("adder", {})
            out["extra"] = await client.call_tool("adder", {"input": "hi", "colour": "red"})
            out["root"] = await client.call_tool("adder", {"input": "hi", "root_id": str(uuid.uuid4())})
            out["run_id"] = await client.call_tool("task.status", {"run_id": "not-a-uuid"})
            out["shape"] = await client.call_tool("task.answer", {"run_id": str(uuid.uuid4()), "answers": [{"x": 1}]})
            with pytest.raises(MCPError) as no_extension:
                await get_task(client.session, str(uuid.uuid4()))
            out["no_extension"] = no_extension.value
        async with connected(api, extensions=[Tasks()]) as client:
            with pytest.raises(MCPError) as bogus:
                await get_task(client.session, "not-a-task")
            out["bogus"] = bogus.value
        async with httpx2.AsyncClient() as http:
            url = f"http://127.0.0.1:{api.port}/mcp"
            headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                       "MCP-Protocol-Version": "2026-07-28"}
            out["anonymous"] = await http.post(url, headers=headers, content=b"{}")
            out["not_json"] = await http.post(url, headers={**headers, **A}, content=b"{not json")
            out["no_method"] = await http.post(url, headers={**headers, **A},
                                               content=json.dumps({"jsonrpc": "2.0", "id": 1}).encode())
            out["too_large"] = await http.post(url, headers={**headers, **A},
                                               content=b'{"x": "' + b"a" * BODY_LIMIT + b'"}')
        return out

    out = run(checked())
    assert (out["unknown"].code, out["unknown"].message) == (INVALID_PARAMS, "Unknown tool: nobody")
    assert out["missing"].is_error and text_of(out["missing"]).startswith("arguments.input:"), out["missing"]
    assert out["extra"].is_error and text_of(out["extra"]).startswith("arguments.colour:"), out["extra"]
    assert out["root"].is_error and text_of(out["root"]).startswith("arguments.root_id:"), out["root"]
    assert out["run_id"].is_error and text_of(out["run_id"]).startswith("arguments.run_id:"), out["run_id"]
    assert out["shape"].is_error and text_of(out["shape"]).startswith("arguments.answers[0]"), out["shape"]
    assert out["no_extension"].code == MISSING_REQUIRED_CLIENT_CAPABILITY, out["no_extension"]
    assert out["bogus"].code == INVALID_PARAMS, out["bogus"]
    anonymous = out["anonymous"]
    assert (anonymous.status_code, anonymous.headers["www-authenticate"]) == (401, "Bearer")
    assert anonymous.json()["error"]["message"] == "send Authorization: Bearer <token>"
    for name in ("not_json", "no_method"):
        answer = out[name]
        assert answer.status_code < 500 and "error" in answer.json(), (name, answer.text)
    too_large = out["too_large"].json()["error"]
    assert (too_large["code"], too_large["message"].split(":")[0]) == (-32600, "Payload too large"), too_large
    assert counts(ctx.engine) == before

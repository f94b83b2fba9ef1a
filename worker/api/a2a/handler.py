"""The A2A request handler: each protocol method answered from the run store, through
``worker.client``. It holds nothing between requests (no task store, no queue): a task is
a run and its updates are the run's durable events, so any API process answers for any
task, and a task outlives the process that started it. Each call's caller (owner, agent,
the API's state) comes in the call context (``worker.api.a2a.routes``).

A task of another owner, or of another of the owner's agents, is ``TaskNotFound``, exactly
like one that does not exist.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

import anyio
import structlog
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    InternalError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from starlette.concurrency import run_in_threadpool

from schema.store.agents import split_ref
from schema.store.errors import RunNotFound
from schema.store.owners import TailKey
from schema.wire import TERMINAL_EVENTS, EventKind, RunEvent, RunView
from schema.wire.agents import AgentView
from worker import client
from worker.api.a2a import sends
from worker.api.a2a.tasks import EventMapper, still_waiting, submitted_task, task_of
from worker.api.deps import ApiState
from worker.client.context import ClientContext

log = structlog.get_logger("aidawork.api")
CALLER = "aidawork.caller"
# How long a blocking SendMessage waits for its task to end or to need input: below the
# idle timeout of common proxies (60 s). Past it the task is returned as it is (working),
# and the client follows it with GetTask or SubscribeToTask.
BLOCK_S = 55.0
T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    """Who calls, about which agent: put in each call's context by the route."""

    state: ApiState
    owner: str
    agent: AgentView
    token_digest: bytes  # the key its streams count under (AIDAWORK_API_MAX_STREAMS_PER_TOKEN)


def caller_of(context: ServerCallContext) -> Caller:
    caller = context.state.get(CALLER)
    if not isinstance(caller, Caller):
        raise InternalError(message="the call has no caller")  # a route that did not set it: a bug
    return caller


async def in_thread(caller: Caller, work: Callable[[ClientContext], T]) -> T:
    """``work`` on this process's client context, in a worker thread (it blocks on the database)."""
    return await run_in_threadpool(lambda: work(caller.state.context()))


async def view_of(caller: Caller, task_id: str) -> RunView:
    """The caller's run ``task_id``, made from the caller's agent; else ``TaskNotFound``."""
    try:
        run_id = UUID(task_id)
        view = await in_thread(caller, lambda ctx: client.status(run_id, owner=caller.owner, ctx=ctx))
    except (ValueError, RunNotFound):
        raise TaskNotFoundError from None
    if view.agent is None or split_ref(view.agent)[0] != caller.agent.name:
        raise TaskNotFoundError
    return view


async def status_of(caller: Caller, run_id: UUID) -> RunView:
    return await in_thread(caller, lambda ctx: client.status(run_id, owner=caller.owner, ctx=ctx))


@contextmanager
def stream_slot(caller: Caller) -> Iterator[None]:
    """One of the token's streams while a task's stream is open, as for the event streams."""
    slots = caller.state.slots
    if not slots.acquire(caller.token_digest):
        raise InvalidRequestError(
            message=f"this token has {slots.limit} streams open, the most allowed "
            "(AIDAWORK_API_MAX_STREAMS_PER_TOKEN); close one first"
        )
    try:
        yield
    finally:
        slots.release(caller.token_digest)


async def run_events(caller: Caller, run_id: UUID, after_seq: int) -> AsyncIterator[tuple[RunEvent, bool]]:
    """The run's events after ``after_seq`` as the API's event hub reads them (one poller
    per process for every stream), each with whether it was the last one read so far."""
    hub = caller.state.hub
    sub = hub.subscribe(TailKey(run_id, caller.owner, after_seq))
    try:
        while True:
            page = await hub.take(sub)
            if page is None:
                raise InternalError(message="reading the task's events failed: subscribe to the task again")
            for i, event in enumerate(page.events):
                yield event, i == len(page.events) - 1
            if page.ended and not page.events:
                return
    finally:
        hub.unsubscribe(sub)


async def updates(caller: Caller, view: RunView, after_seq: int) -> AsyncIterator[Event]:
    """The task's updates from the run's events after ``after_seq``, until it ends or
    waits for input it still waits for (an earlier wait, replayed, does not end it)."""
    mapper = EventMapper(str(view.run_id), str(view.root_id))
    async for event, last in run_events(caller, view.run_id, after_seq):
        for update in mapper.updates(event):
            yield update
        if event.kind in TERMINAL_EVENTS:
            return
        suspended = event.kind is EventKind.RUN_SUSPENDED and last
        if suspended and still_waiting(await status_of(caller, view.run_id), event):
            return


class RunTasks(RequestHandler):
    """Tasks are runs of the caller's saved agent (see the module's docstring)."""

    async def _start(self, caller: Caller, params: SendMessageRequest) -> sends.Started:
        message = params.message
        sends.check_role(message)
        if message.task_id:
            view = await view_of(caller, message.task_id)
            return await in_thread(caller, lambda ctx: sends.answer(ctx, caller.owner, view, params))
        return await in_thread(caller, lambda ctx: sends.submit(ctx, caller.owner, caller.agent.ref, params))

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        validate_proto_required_fields(params)
        caller = caller_of(context)
        started = await self._start(caller, params)
        view = await status_of(caller, started.run_id)
        if started.follow and not params.configuration.return_immediately and not view.status.terminal:
            with anyio.move_on_after(BLOCK_S):
                async for _ in updates(caller, view, started.after_seq):
                    pass
            view = await status_of(caller, started.run_id)
        return task_of(view)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        validate_proto_required_fields(params)
        caller = caller_of(context)
        with stream_slot(caller):  # taken before the run is stored: a refused stream stores nothing
            started = await self._start(caller, params)
            view = await status_of(caller, started.run_id)
            # A new task's stream tells its whole story: submitted, then every event from the first.
            yield submitted_task(view) if started.after_seq == 0 else task_of(view)
            if started.follow:
                async for update in updates(caller, view, started.after_seq):
                    yield update

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        """The task now, then every update from its first event (the durable events,
        replayed), then the new ones as they come, until it ends or waits for input."""
        validate_proto_required_fields(params)
        caller = caller_of(context)
        view = await view_of(caller, params.id)
        with stream_slot(caller):
            yield task_of(view)
            async for update in updates(caller, view, 0):
                yield update

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_proto_required_fields(params)
        return task_of(await view_of(caller_of(context), params.id))

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        validate_proto_required_fields(params)
        caller = caller_of(context)
        view = await view_of(caller, params.id)
        run_id = view.run_id
        if view.status.terminal or not await in_thread(caller, lambda ctx: client.cancel(run_id, ctx=ctx)):
            raise TaskNotCancelableError(message=f"task {run_id} has already ended")
        log.info("a2a_task_cancelled", run_id=str(run_id))
        return task_of(await status_of(caller, run_id))

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        raise UnsupportedOperationError(
            message="ListTasks is not supported; GET /v1/roots/{contextId}/runs lists the tasks of a context"
        )

    # --- push notifications: the run's webhook (one per task) ------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        validate_proto_required_fields(params)
        caller = caller_of(context)
        run_id = (await view_of(caller, params.task_id)).run_id
        url = sends.push_url(params, "params", caller.state.settings.webhook_prefixes)
        await in_thread(caller, lambda ctx: sends.set_push(ctx, caller.owner, run_id, url))
        return sends.push_config(run_id, url)

    async def _push_url(self, caller: Caller, task_id: str, config_id: str) -> tuple[UUID, str | None]:
        run_id = (await view_of(caller, task_id)).run_id
        if config_id not in ("", sends.PUSH_CONFIG_ID):
            raise TaskNotFoundError(message=f"a task's one push config is {sends.PUSH_CONFIG_ID!r}")
        return run_id, await in_thread(caller, lambda ctx: ctx.store.read_webhook_url(run_id, caller.owner))

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        validate_proto_required_fields(params)
        run_id, url = await self._push_url(caller_of(context), params.task_id, params.id)
        if url is None:
            raise TaskNotFoundError(message="the task has no push config")
        return sends.push_config(run_id, url)

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        validate_proto_required_fields(params)
        run_id, url = await self._push_url(caller_of(context), params.task_id, "")
        return ListTaskPushNotificationConfigsResponse(configs=[] if url is None else [sends.push_config(run_id, url)])

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        validate_proto_required_fields(params)
        caller = caller_of(context)
        run_id, _ = await self._push_url(caller, params.task_id, params.id)
        await in_thread(caller, lambda ctx: sends.set_push(ctx, caller.owner, run_id, None))

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise UnsupportedOperationError(message="this agent has no extended card (capabilities.extendedAgentCard)")

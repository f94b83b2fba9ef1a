"""What the MCP handlers do with runs, through the Python client (``worker.client``): start
one, read one, answer its waits, cancel it, and wait for it to settle while its durable
events go out as progress. The client's functions block, so each runs in a worker thread;
the waiting follows the run through the API's one event poller (``ApiState.hub``).

Nothing is kept here between requests: a task is its run, so any API process answers for
it, before or after a restart. Every check runs before the first write, so a refused
request stores nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

import anyio
import anyio.to_thread
import structlog

from runtime.errors import RequestInvalid
from schema.store import events as event_store
from schema.store.errors import AgentNotFound, RootNotFound, RunNotFound
from schema.store.owners import TailKey
from schema.store.suspensions import DeliveryRefused
from schema.wire import TERMINAL_EVENTS, EventKind, RunEvent, RunView
from worker import client
from worker.api.a2a.answers import Reply, ReplyInvalid, apply, check_waited_for, reply_of
from worker.api.deps import ApiState
from worker.api.mcp.results import settled
from worker.api.mcp.tools import AgentArgs, ArgumentsInvalid

log = structlog.get_logger("aidawork.api")
P = ParamSpec("P")
T = TypeVar("T")
Report = Callable[[RunEvent], Awaitable[None]]
_SETTLING = frozenset({*TERMINAL_EVENTS, EventKind.RUN_SUSPENDED})  # after these, look at the run again


class UnknownTool(Exception):
    """No agent of the caller's by that name (or it was deleted)."""


class TaskNotFound(Exception):
    """No run of the caller's by that id: another owner's run is reported alike."""


async def blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def _status(state: ApiState, owner: str, run_id: UUID) -> RunView:
    try:
        return client.status(run_id, owner=owner, ctx=state.context())
    except RunNotFound:
        raise TaskNotFound(str(run_id)) from None


async def status(state: ApiState, owner: str, run_id: UUID) -> RunView:
    return await blocking(_status, state, owner, run_id)


def _submit(state: ApiState, owner: str, agent: str, args: AgentArgs) -> RunView:
    request = {"owner": owner, "agent": agent, "input": args.input,
               "root_id": None if args.root_id is None else str(args.root_id)}
    ctx = state.context()
    try:
        submitted = client.submit(request, ctx=ctx)
    except AgentNotFound:
        raise UnknownTool(agent) from None
    except RootNotFound:
        raise ArgumentsInvalid("arguments.root_id", "no such conversation (Root) of yours") from None
    except RequestInvalid as exc:  # the input too long, ...
        raise ArgumentsInvalid(f"arguments.{exc.field}", exc.reason) from None
    log.info("mcp_task_submitted", run_id=str(submitted.run_id), agent=agent, owner=owner)
    return client.status(submitted.run_id, owner=owner, ctx=ctx)


async def submit(state: ApiState, owner: str, agent: str, args: AgentArgs) -> RunView:
    """A new run of ``owner``'s agent; the view just after it was stored."""
    return await blocking(_submit, state, owner, agent, args)


def _cancel(state: ApiState, owner: str, run_id: UUID) -> RunView:
    _status(state, owner, run_id)  # another owner's run is not found, and stays untouched
    cancelled = client.cancel(run_id, ctx=state.context())
    log.info("mcp_task_cancelled", run_id=str(run_id), cancelled=cancelled)
    return _status(state, owner, run_id)


async def cancel(state: ApiState, owner: str, run_id: UUID) -> RunView:
    return await blocking(_cancel, state, owner, run_id)


def replies_of(answers: Sequence[object], where: str) -> list[Reply]:
    """``task.answer``'s answers, their shapes and fields checked (``ReplyInvalid``)."""
    return [reply_of(answer, f"{where}[{i}]") for i, answer in enumerate(answers)]


def _answer(state: ApiState, owner: str, run_id: UUID, replies: Callable[[RunView], list[Reply]]) -> RunView:
    view = _status(state, owner, run_id)
    chosen = replies(view)
    if not chosen:
        return view
    check_waited_for(chosen, view.waiting_for)  # every answer, before the first is stored
    ctx = state.context()
    for reply in chosen:
        try:
            apply(ctx, run_id, reply)
        except RequestInvalid as exc:  # approved args, checked against the tool's schema
            raise ReplyInvalid(f"{reply.where}.{exc.field}", exc.reason) from None
        except DeliveryRefused as exc:  # answered by someone else since the check above
            raise ReplyInvalid(f"{reply.where}.{exc.field}", exc.message) from None
    log.info("mcp_task_answered", run_id=str(run_id), answers=len(chosen))
    return _status(state, owner, run_id)


async def answer(state: ApiState, owner: str, run_id: UUID, replies: Callable[[RunView], list[Reply]]) -> RunView:
    """Store the replies ``replies`` picks for the run's view (after checking them all),
    sending its resume when they were the last it waited for; its view after."""
    return await blocking(_answer, state, owner, run_id, replies)


def _last_seq(state: ApiState, run_id: UUID) -> int:
    seq, engine = 0, state.context().engine
    while batch := event_store.read_events(engine, run_id, after_seq=seq):
        seq = batch[-1].seq
    return seq


async def settle(state: ApiState, owner: str, view: RunView, wait_s: float, report: Report | None,
                 *, after_seq: int | None = None) -> RunView:
    """The run once it has ended or waits for an answer, or as it is after ``wait_s``.
    Each event it commits after ``after_seq`` goes to ``report`` (a progress notification):
    0 for a run this call started (a worker may have committed its first rounds already),
    by default the run's last event now."""
    if settled(view) or wait_s <= 0:
        return view
    run_id = view.run_id
    if after_seq is None:
        after_seq = await blocking(_last_seq, state, run_id)
    view = await status(state, owner, run_id)  # read after the cursor: nothing between is missed
    if settled(view):
        return view
    sub = state.hub.subscribe(TailKey(run_id, owner, after_seq))
    try:
        with anyio.move_on_after(wait_s):
            while (page := await state.hub.take(sub)) is not None:
                for event in page.events:
                    if report is not None:
                        await report(event)
                if page.ended or any(e.kind in _SETTLING for e in page.events):
                    view = await status(state, owner, run_id)
                    if settled(view):
                        return view
    finally:
        state.hub.unsubscribe(sub)
    return await status(state, owner, run_id)


def describe(event: RunEvent) -> str:
    """An event as a progress message."""
    data: dict[str, Any] = event.data
    match event.kind:
        case EventKind.MODEL_RESPONDED:
            calls = [str(c.get("name")) for c in data.get("tool_calls") or ()]
            return "the model called " + ", ".join(calls) if calls else "the model answered"
        case EventKind.TOOL_COMPLETED | EventKind.TOOL_SUSPENDED:
            return f"{event.kind.value}: {data.get('name')}"
    return event.kind.value

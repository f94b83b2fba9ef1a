"""The Python interface for upstream services: submit a run, read its status, follow its
events, cancel it, deliver what a suspended run waits for. ``submit`` validates through
``prepare_execution`` first, and ``deliver`` / ``resolve`` through ``check_delivery`` /
``check_prerequisite`` (the same ``json_problem`` rules), so bad input raises
``RequestInvalid`` naming the field and nothing is stored or queued.

Each function takes a ``ClientContext`` (``worker.client_context``: an engine, the
request checks, a dispatcher on its broker); without one, this process's, built from
the environment on first use. Importing this module builds nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any
from uuid import UUID

import structlog

from runtime.canonical import require_json, text_problem
from runtime.errors import RequestInvalid
from runtime.prepare import prepare_execution
from schema.store import events as event_store
from schema.store import runs as run_store
from schema.store import suspensions as suspension_store
from schema.store.runs import Submitted
from schema.store.suspensions import Receipt
from schema.wire import TERMINAL_EVENTS, RunEvent, RunRequest, RunView
from worker.app import send_or_defer
from worker.client_context import ClientContext, get_client_context

log = structlog.get_logger("aidawork.client")


def submit(request: Mapping[str, Any] | RunRequest, *, ctx: ClientContext | None = None) -> Submitted:
    """Validate, store (one transaction), then ring the doorbell. If the broker is down,
    the run is still stored and the reconciler sends it later."""
    ctx = ctx or get_client_context()
    parsed, prepared = prepare_execution(ctx.runtime, request)
    submitted = run_store.submit_run(ctx.engine, parsed, prepared.turn_config.model_dump(mode="json"))
    # The run is durable: if the broker is down, the reconciler sends it once it is back.
    send_or_defer(ctx.store, submitted.run_id, lambda: ctx.dispatch.round(submitted.run_id, 0))
    return submitted


def status(run_id: UUID, *, owner: str | None = None, ctx: ClientContext | None = None) -> RunView:
    """The run's view; with ``owner``, another owner's run is ``RunNotFound``."""
    return run_store.get_run_view((ctx or get_client_context()).engine, run_id, owner=owner)


def cancel(run_id: UUID, *, ctx: ClientContext | None = None) -> bool:
    ctx = ctx or get_client_context()
    cancelled, next_run_id = run_store.cancel_run(ctx.engine, run_id)
    if next_run_id is not None:
        ctx.dispatch.round(next_run_id, 0)
    return cancelled


def _check_text(text: object, field: str, *, of: str | None = None) -> None:
    if not isinstance(text, str):
        raise RequestInvalid(field, "must be a string")
    problem = text_problem(text)
    if problem is not None:
        # Name the file by an escaped, bounded form of its path: never the raw path.
        raise RequestInvalid(field, problem if of is None else f"{problem}, in the file {json.dumps(of[:80])}")


def check_delivery(tool_call_id: object, files: object) -> None:
    """``RequestInvalid`` (field ``tool_call_id``, ``files``, ``files[0].path`` or
    ``files[0].content``, in the order given) for what no store can hold."""
    _check_text(tool_call_id, "tool_call_id")
    if not isinstance(files, Mapping):
        raise RequestInvalid("files", "must be an object {path: text}")
    for i, (path, content) in enumerate(files.items()):
        _check_text(path, f"files[{i}].path")
        _check_text(content, f"files[{i}].content", of=path)


def check_prerequisite(key: object, value: object) -> None:
    """``RequestInvalid`` (field ``key``, or ``value`` and the path inside it) for a key
    or value that ``json_problem`` refuses."""
    _check_text(key, "key")
    require_json(value, "value")


def deliver(run_id: UUID, tool_call_id: str, files: Mapping[str, str], *, ctx: ClientContext | None = None) -> Receipt:
    """Deliver the files a suspended tool call asked for (path -> UTF-8 text). Delivering
    the same files again changes nothing; anything the run is not waiting for is refused
    with ``DeliveryRefused``. When the round has all its inputs, its resume is sent."""
    check_delivery(tool_call_id, files)
    ctx = ctx or get_client_context()
    receipt = suspension_store.deliver_local_read(
        ctx.engine, run_id, tool_call_id, dict(files), max_file_bytes=ctx.settings.max_local_read_bytes
    )
    if receipt.resumes:
        ctx.dispatch.resume(receipt.resumes)
    return receipt


def resolve(run_id: UUID, key: str, value: Any, *, ctx: ClientContext | None = None) -> Receipt:
    """Resolve a prerequisite the run waits for; idempotent like ``deliver``."""
    check_prerequisite(key, value)
    ctx = ctx or get_client_context()
    receipt = suspension_store.resolve_prerequisite(ctx.engine, run_id, key, value)
    if receipt.resumes:
        ctx.dispatch.resume(receipt.resumes)
    return receipt


def events(
    run_id: UUID,
    *,
    after_seq: int = 0,
    poll_s: float = 0.2,
    follow: bool = True,
    ctx: ClientContext | None = None,
) -> Iterator[RunEvent]:
    """The run's events in order from ``after_seq``; with ``follow``, until the run ends."""
    engine = (ctx or get_client_context()).engine
    run_store.get_run_view(engine, run_id)  # RunNotFound early
    while True:
        batch = event_store.read_events(engine, run_id, after_seq=after_seq)
        for event in batch:
            yield event
            after_seq = event.seq
            if event.kind in TERMINAL_EVENTS:
                return
        if not follow and not batch:
            return
        if not batch:
            time.sleep(poll_s)


def wait(run_id: UUID, *, timeout_s: float = 60.0, poll_s: float = 0.1, ctx: ClientContext | None = None) -> RunView:
    """Poll until the run is terminal; returns its view (raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = status(run_id, ctx=ctx)
        if view.status.terminal:
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} is still {view.status} after {timeout_s}s")
        time.sleep(poll_s)

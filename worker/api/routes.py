"""The endpoints of the HTTP API: the Python client (``worker.client``) over HTTP, plus
each run's events as a server-sent event stream (``worker.api.streams``). Each checks
what it was sent before it takes the context, so a refused request stores nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool

from runtime.prepare import parse_request
from schema.store import owners as owner_store
from schema.store.errors import AgentNotFound, RootNotFound
from schema.store.owners import TailKey
from schema.store.suspensions import DeliveryRefused, Receipt
from schema.wire import IDEMPOTENCY_KEY_PATTERN, MAX_IDEMPOTENCY_KEY_CHARS, RunView
from schema.wire.errors import ErrorCode
from schema.wire.owners import OwnerLimits
from worker import client
from worker.api.auth import Credentials, authenticate, token_digest
from worker.api.deps import ApiState, Owner, State
from worker.api.errors import ApiError, ErrorBody, catalogued
from worker.api.models import (
    Cancelled,
    Delivery,
    DeliveryReceipt,
    Prerequisite,
    RootRuns,
    RunSubmission,
    SubmittedRun,
    ToolApproval,
    ToolResult,
    ToolRetry,
)
from worker.api.streams import LAST_EVENT_ID_PATTERN, EventStreamResponse, parse_last_event_id

# The answers particular to an operation; those every operation can give (401, 413, 422,
# 500, 503, and 400 / 408 / 404 where it has a body / a path id) are added to the
# document by worker.api.openapi.
_ERROR: dict[str, object] = {"model": ErrorBody}
_STATE_REFUSES: dict[int | str, dict[str, object]] = {
    409: {**_ERROR, "description": "the run's state refuses this (the code says why)"}
}
router = APIRouter(prefix="/v1")


_SUBMIT_ANSWERS: dict[int | str, dict[str, object]] = {
    200: {"model": SubmittedRun, "description": "an earlier submit with this Idempotency-Key stored this run"},
    403: {**_ERROR, "description": "OWNER_MISMATCH: owner is not this token's owner (omit it, or send that one)"},
    409: {**_ERROR, "description": "IDEMPOTENCY_KEY_REUSED (the key was used for another request) or ROOT_BUSY "
          "(root_policy reject, and the Root has an active run)"},
}
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_IDEMPOTENCY_KEY_CHARS,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="the same as the body's idempotency_key",
    ),
]


@router.post(
    "/runs", status_code=201, response_model=SubmittedRun, summary="Submit a run", responses=_SUBMIT_ANSWERS
)
def submit_run(
    body: RunSubmission, owner: Owner, state: State, response: Response, idempotency_key: IdempotencyKey = None
) -> SubmittedRun:
    if body.owner is not None and body.owner != owner:
        # 403, not 422: the field is well formed, the token may not act for that owner.
        raise ApiError(
            403, ErrorCode.OWNER_MISMATCH, f"owner: this token submits for {owner!r}; omit owner or send it", "owner"
        )
    if idempotency_key is not None and body.idempotency_key not in (None, idempotency_key):
        raise ApiError(
            422,
            ErrorCode.REQUEST_INVALID,
            "idempotency_key: differs from the Idempotency-Key header; send one, or both equal",
            "idempotency_key",
        )
    for field in ("config", "agent", "overrides"):
        if field in body.model_fields_set and getattr(body, field) is None:  # the document allows no null
            raise ApiError(422, ErrorCode.REQUEST_INVALID, f"{field}: omit it rather than send null", field)
    # The fields as sent, not model_dump() (a config nested too deep fails to dump), and
    # checked before the store is touched; client.submit then validates the config.
    request = parse_request(
        {"owner": owner, "root_id": body.root_id, "input": body.input, "config": body.config,
         "agent": body.agent, "overrides": body.overrides,
         "webhook": None if body.webhook is None else body.webhook.model_dump(),
         "idempotency_key": idempotency_key or body.idempotency_key, "root_policy": body.root_policy.value,
         "priority": body.priority}
    )
    try:
        submitted = client.submit(request, ctx=state.context())
    except RootNotFound as exc:  # a field of this request, not the resource addressed
        raise ApiError(422, catalogued(exc.code), exc.message, "root_id") from None
    except AgentNotFound as exc:
        raise ApiError(422, catalogued(exc.code), exc.message, "agent") from None
    response.headers["Location"] = f"/v1/runs/{submitted.run_id}"
    if submitted.existing:
        response.status_code = 200
    return SubmittedRun(run_id=submitted.run_id, root_id=submitted.root_id, root_seq=submitted.root_seq)


@router.get("/runs/{run_id}", response_model=RunView, summary="A run's status")
def get_run(run_id: UUID, owner: Owner, state: State) -> RunView:
    return client.status(run_id, owner=owner, ctx=state.context())


@router.post(
    "/runs/{run_id}/cancel",
    response_model=Cancelled,
    summary="Cancel a run that has not ended",
    responses={409: {**_ERROR, "description": "the run has already ended (RUN_ENDED)"}},
)
def cancel_run(run_id: UUID, owner: Owner, state: State) -> Cancelled:
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    if not client.cancel(run_id, ctx=ctx):
        raise ApiError(409, ErrorCode.RUN_ENDED, f"run {run_id} has already ended", "run_id")
    return Cancelled(run_id=run_id, cancelled=True)


@router.post(
    "/runs/{run_id}/deliveries",
    response_model=DeliveryReceipt,
    summary="Deliver files for a local read",
    responses=_STATE_REFUSES,
)
def deliver(run_id: UUID, body: Delivery, owner: Owner, state: State) -> DeliveryReceipt:
    client.check_delivery(body.tool_call_id, body.files)  # before the store: NUL, surrogates
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    try:
        receipt = client.deliver(run_id, body.tool_call_id, body.files, ctx=ctx)
    except DeliveryRefused as exc:
        raise ApiError(409, catalogued(exc.code), exc.message, exc.field) from None
    return DeliveryReceipt(stored=receipt.stored, resuming=bool(receipt.resumes))


@router.post(
    "/runs/{run_id}/prerequisites",
    response_model=DeliveryReceipt,
    summary="Resolve a prerequisite",
    responses=_STATE_REFUSES,
)
def resolve(run_id: UUID, body: Prerequisite, owner: Owner, state: State) -> DeliveryReceipt:
    client.check_prerequisite(body.key, body.value)  # before the store: NaN, 1e400, depth, ...
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    try:
        receipt = client.resolve(run_id, body.key, body.value, ctx=ctx)
    except DeliveryRefused as exc:
        raise ApiError(409, catalogued(exc.code), exc.message, exc.field) from None
    return DeliveryReceipt(stored=receipt.stored, resuming=bool(receipt.resumes))


def _answered(answer: Callable[[], Receipt]) -> DeliveryReceipt:
    try:
        receipt = answer()
    except DeliveryRefused as exc:
        raise ApiError(409, catalogued(exc.code), exc.message, exc.field) from None
    return DeliveryReceipt(stored=receipt.stored, resuming=bool(receipt.resumes))


@router.post(
    "/runs/{run_id}/tool-results",
    response_model=DeliveryReceipt,
    summary="The result of a client tool, or of a call whose outcome is unknown",
    responses=_STATE_REFUSES,
)
def tool_result(run_id: UUID, body: ToolResult, owner: Owner, state: State) -> DeliveryReceipt:
    client.check_tool_result(body.tool_call_id, body.result, body.is_error)  # before the store
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    return _answered(lambda: client.tool_result(run_id, body.tool_call_id, body.result, is_error=body.is_error,
                                                ctx=ctx))


@router.post(
    "/runs/{run_id}/approvals",
    response_model=DeliveryReceipt,
    summary="Approve (maybe with edited args) or reject a call that waits for approval",
    responses=_STATE_REFUSES,
)
def approval(run_id: UUID, body: ToolApproval, owner: Owner, state: State) -> DeliveryReceipt:
    if body.decision == "approve":
        if body.reason is not None:
            raise ApiError(422, ErrorCode.REQUEST_INVALID, "reason: only a rejection takes a reason", "reason")
        client.check_approval(body.tool_call_id, body.args)
    else:
        if body.args is not None:
            raise ApiError(422, ErrorCode.REQUEST_INVALID, "args: only an approval takes args", "args")
        if body.reason is None:
            raise ApiError(422, ErrorCode.REQUEST_INVALID, "reason: a rejection must say why", "reason")
        client.check_rejection(body.tool_call_id, body.reason)
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    if body.decision == "approve":
        return _answered(lambda: client.approve(run_id, body.tool_call_id, args=body.args, ctx=ctx))
    reason = body.reason
    assert reason is not None
    return _answered(lambda: client.reject(run_id, body.tool_call_id, reason=reason, ctx=ctx))


@router.post(
    "/runs/{run_id}/tool-retries",
    response_model=DeliveryReceipt,
    summary="Run a call whose outcome is unknown once more",
    responses=_STATE_REFUSES,
)
def tool_retry(run_id: UUID, body: ToolRetry, owner: Owner, state: State) -> DeliveryReceipt:
    client.check_tool_call_id(body.tool_call_id)  # before the store
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    return _answered(lambda: client.retry_tool(run_id, body.tool_call_id, ctx=ctx))


@router.get("/roots/{root_id}/runs", response_model=RootRuns, summary="A Root's runs, in execution order")
def root_runs(
    root_id: UUID,
    owner: Owner,
    state: State,
    after_seq: Annotated[int, Query(ge=-1, le=2**31 - 1, description="only runs with root_seq above this")] = -1,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> RootRuns:
    found = owner_store.list_root_runs(state.context().engine, root_id, owner, after_seq=after_seq, limit=limit)
    return RootRuns(root_id=root_id, runs=found)


@router.get(
    "/owner",
    response_model=OwnerLimits,
    summary="The caller's own limits (cap, weight, budget) and the slots its runs hold now",
    description="Read only: an operator sets them (`aidawork owner set`, `client.set_owner_limits`). "
    "An owner never given limits shows the defaults (`stored: false`).",
)
def own_limits(owner: Owner, state: State) -> OwnerLimits:
    return client.owner_limits(owner, ctx=state.context())


@router.get(
    "/runs/{run_id}/events",
    summary="The run's events as server-sent events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "id: seq, event: kind, data: JSON; live model_delta / model_stream_restarted with no id",
        },
        400: {**_ERROR, "description": "Last-Event-ID is not an event seq (REQUEST_INVALID)"},
        429: {**_ERROR, "description": "this token has AIDAWORK_API_MAX_STREAMS_PER_TOKEN streams open"},
    },
)
async def run_events(
    run_id: UUID,
    request: Request,
    state: State,
    credentials: Credentials,
    last_event_id: Annotated[
        str | None,
        # Checked by parse_last_event_id (a 400 naming the header), so stated, not enforced, here.
        Header(
            alias="Last-Event-ID",
            description="resume after this seq (empty: from the start)",
            json_schema_extra={"pattern": LAST_EVENT_ID_PATTERN},
        ),
    ] = None,
    stream_token: Annotated[
        str | None,
        Query(max_length=1000, description="instead of the bearer header: a token from POST .../stream-token"),
    ] = None,
) -> StreamingResponse:
    after_seq = parse_last_event_id(last_event_id)
    owner, digest = _stream_caller(state, run_id, credentials, stream_token)
    if not state.slots.acquire(digest):
        limit = state.slots.limit
        raise ApiError(
            429,
            ErrorCode.TOO_MANY_STREAMS,
            f"this token has {limit} event streams open, the most allowed (AIDAWORK_API_MAX_STREAMS_PER_TOKEN); "
            "close one first",
        )
    deltas = None
    try:
        await run_in_threadpool(owner_store.check_run_owner, state.context().engine, run_id, owner)
        # Deltas first: a delta published while the first read is under way is kept.
        wake = asyncio.Event()
        deltas = await state.deltas.join(run_id, wake)
        sub = state.hub.subscribe(TailKey(run_id, owner, after_seq), wake=wake)
    except BaseException:
        state.slots.release(digest)
        state.deltas.leave(deltas)
        raise

    def release() -> None:
        state.slots.release(digest)
        state.deltas.leave(deltas)

    return EventStreamResponse(
        state.hub,
        sub,
        release=release,
        keepalive_s=state.settings.api_keepalive_s,
        disconnected=request.is_disconnected,
        deltas=deltas,
    )


def _stream_caller(
    state: ApiState, run_id: UUID, credentials: HTTPAuthorizationCredentials | None, stream_token: str | None
) -> tuple[str, bytes]:
    """The owner of an event stream and the key its stream slot counts under: the bearer
    token's, or (a browser's ``EventSource``, which cannot send headers) the stream
    token's, whose streams count together per owner so fresh tokens do not lift the cap."""
    if credentials is None and stream_token is not None:
        owner = state.stream_tokens.owner_of(stream_token, run_id, now=time.time())
        return owner, token_digest(f"stream-token:{owner}")
    owner = authenticate(state.tokens, credentials)
    assert credentials is not None  # authenticate refuses a request without a token
    return owner, token_digest(credentials.credentials)

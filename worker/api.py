"""The HTTP API for upstream services (``aidawork api``): the Python client
(``worker.client``) over HTTP, plus each run's events as a server-sent event stream.

- Authentication: ``Authorization: Bearer <token>``; AIDAWORK_API_TOKENS maps each token
  to an owner. The owner of a submitted run is the token's owner; a token sees only its
  owner's runs and Roots, and anything else is reported as not found (404, never 403),
  so a caller cannot learn that another owner's run exists.
- Bodies above AIDAWORK_API_MAX_BODY_BYTES are refused with 413 before they are parsed;
  a body that arrives too slowly (AIDAWORK_API_BODY_TIMEOUT_S, _MIN_BYTES_PER_S) gets 408
  and its connection is closed. Header deadlines and the connection cap are in
  ``worker.http_server``.
- Every refusal is ``{"error": {"code", "message", "field"}}``; a refused request
  stores nothing (validation runs before the store's single transaction). JSON values
  are checked by ``runtime.canonical.json_problem`` (NaN, Infinity, NUL, unpaired
  surrogates, nesting, digits): 422 naming the field. Anything unexpected is a JSON 500
  ``INTERNAL_ERROR`` and one ``request_crashed`` log line (``worker.api_errors``).
- ``GET /v1/runs/{id}/events`` follows the durable ``run_events`` table: ``id`` is the
  event's seq, so a client that reconnects with ``Last-Event-ID`` gets exactly the
  events after it, in order. The stream ends after the run's terminal event. Streams
  are fed by one poller per process (``worker.events``), at most
  AIDAWORK_API_MAX_STREAMS_PER_TOKEN open per token (429 past it).
- No redirects (a trailing slash is a 404, not a redirect built from ``Host``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Any
from uuid import UUID

import structlog
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from runtime.prepare import parse_request
from schema.store import owners as owner_store
from schema.store.errors import RootNotFound
from schema.store.owners import TailKey
from schema.store.suspensions import DeliveryRefused
from schema.wire import RootRunView, RunView
from worker import api_errors, client
from worker.api_errors import ApiError, ErrorBody, error_response
from worker.api_errors import validation_refusal as validation_refusal  # re-exported
from worker.bootstrap import WorkerContext, get_context
from worker.events import EventHub, EventStreamResponse, StreamSlots
from worker.events import format_sse as format_sse  # re-exported: part of the API's wire format
from worker.request_limits import BodyLimit
from worker.settings import Settings, get_settings

log = structlog.get_logger("aidawork.api")

# --- wire models of the API -----------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSubmission(_Body):
    """A run request (see ``schema.wire.RunRequest``). ``owner`` is the token's owner: omit
    it, or send the same value; another owner is refused (422, field ``owner``)."""

    owner: str | None = None
    root_id: UUID | None = None
    input: str
    config: dict[str, Any]


class Delivery(_Body):
    tool_call_id: str = Field(min_length=1)
    files: dict[str, str] = Field(description="path -> UTF-8 text, exactly the paths the tool call asked for")


class Prerequisite(_Body):
    key: str = Field(min_length=1)
    value: Any = Field(description="any JSON value")


class SubmittedRun(_Body):
    run_id: UUID
    root_id: UUID
    root_seq: int


class DeliveryReceipt(_Body):
    stored: bool = Field(description="false: this exact input was already there; nothing changed")
    resuming: bool = Field(description="the run had all its inputs and was sent to resume")


class Cancelled(_Body):
    run_id: UUID
    cancelled: bool


class RootRuns(_Body):
    root_id: UUID
    runs: list[RootRunView]


# --- authentication ---------------------------------------------------------------------------


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """Tokens are kept only as SHA-256 digests: looking one up compares digests, not the
    secret, so lookup time says nothing useful about a guessed token."""

    def __init__(self, owners: Mapping[str, str]) -> None:
        self._owners = {_digest(token): owner for token, owner in owners.items()}

    def owner_of(self, token: str) -> str | None:
        return self._owners.get(_digest(token))

    def __len__(self) -> int:
        return len(self._owners)


@dataclass
class ApiState:
    settings: Settings
    tokens: TokenTable
    context: Callable[[], WorkerContext]
    hub: EventHub = dataclass_field(init=False)
    slots: StreamSlots = dataclass_field(init=False)

    def __post_init__(self) -> None:
        # The hub's reads go through the owner-scoped store query, in a worker thread.
        self.hub = EventHub(
            lambda keys: owner_store.read_event_tails(self.context().engine, keys),
            poll_s=self.settings.api_events_poll_s,
        )
        self.slots = StreamSlots(self.settings.api_max_streams_per_token)


async def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.aidawork
    return state


_bearer = HTTPBearer(auto_error=False, description="a token from AIDAWORK_API_TOKENS")


async def _owner(
    state: Annotated[ApiState, Depends(_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None:
        raise ApiError(401, "UNAUTHENTICATED", "send Authorization: Bearer <token>", "Authorization")
    owner = state.tokens.owner_of(credentials.credentials)
    if owner is None:
        raise ApiError(401, "UNAUTHENTICATED", "the bearer token is not valid", "Authorization")
    return owner


Owner = Annotated[str, Depends(_owner)]
# Endpoints take the context from the state only after their own checks, so a refused
# request never touches the database.
State = Annotated[ApiState, Depends(_state)]

# --- server-sent events ---------------------------------------------------------------------


_SEQ = re.compile(r"[0-9]{1,9}")  # ASCII digits only; seq is a 32-bit column


def parse_last_event_id(raw: str | None) -> int:
    if raw is None or raw.strip() == "":
        return 0
    if _SEQ.fullmatch(raw.strip()) is None:
        raise ApiError(
            400, "REQUEST_INVALID", f"Last-Event-ID must be an event seq (got {raw[:40]!r})", "Last-Event-ID"
        )
    return int(raw.strip())


# --- endpoints ------------------------------------------------------------------------------

_REFUSALS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in {
        400: "malformed JSON or header",
        401: "missing or invalid bearer token",
        404: "no such run or Root for this token's owner",
        408: "the body arrived too slowly",
        409: "the run's state refuses this",
        413: "body too large",
        422: "invalid field (named in error.field)",
        500: "an internal error (code INTERNAL_ERROR, logged as request_crashed)",
    }.items()
}
router = APIRouter(prefix="/v1", responses=_REFUSALS)


@router.post("/runs", status_code=201, response_model=SubmittedRun, summary="Submit a run")
def submit_run(body: RunSubmission, owner: Owner, state: State, response: Response) -> SubmittedRun:
    if body.owner is not None and body.owner != owner:
        raise ApiError(
            422, "REQUEST_INVALID", f"owner: this token submits for {owner!r}; omit owner or send it", "owner"
        )
    # The fields as sent, not model_dump() (a config nested too deep fails to dump), and
    # checked before the store is touched; client.submit then validates the config.
    request = parse_request({"owner": owner, "root_id": body.root_id, "input": body.input, "config": body.config})
    try:
        submitted = client.submit(request, ctx=state.context())
    except RootNotFound as exc:  # a field of this request, not the resource addressed
        raise ApiError(422, exc.code, exc.message, "root_id") from None
    response.headers["Location"] = f"/v1/runs/{submitted.run_id}"
    return SubmittedRun(run_id=submitted.run_id, root_id=submitted.root_id, root_seq=submitted.root_seq)


@router.get("/runs/{run_id}", response_model=RunView, summary="A run's status")
def get_run(run_id: UUID, owner: Owner, state: State) -> RunView:
    return client.status(run_id, owner=owner, ctx=state.context())


@router.post("/runs/{run_id}/cancel", response_model=Cancelled, summary="Cancel a run that has not ended")
def cancel_run(run_id: UUID, owner: Owner, state: State) -> Cancelled:
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    if not client.cancel(run_id, ctx=ctx):
        raise ApiError(409, "RUN_ENDED", f"run {run_id} has already ended", "run_id")
    return Cancelled(run_id=run_id, cancelled=True)


@router.post("/runs/{run_id}/deliveries", response_model=DeliveryReceipt, summary="Deliver files for a local read")
def deliver(run_id: UUID, body: Delivery, owner: Owner, state: State) -> DeliveryReceipt:
    client.check_delivery(body.tool_call_id, body.files)  # before the store: NUL, surrogates
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    try:
        receipt = client.deliver(run_id, body.tool_call_id, body.files, ctx=ctx)
    except DeliveryRefused as exc:
        raise ApiError(409, exc.code, exc.message, exc.field) from None
    return DeliveryReceipt(stored=receipt.stored, resuming=bool(receipt.resumes))


@router.post("/runs/{run_id}/prerequisites", response_model=DeliveryReceipt, summary="Resolve a prerequisite")
def resolve(run_id: UUID, body: Prerequisite, owner: Owner, state: State) -> DeliveryReceipt:
    client.check_prerequisite(body.key, body.value)  # before the store: NaN, 1e400, depth, ...
    ctx = state.context()
    owner_store.check_run_owner(ctx.engine, run_id, owner)
    try:
        receipt = client.resolve(run_id, body.key, body.value, ctx=ctx)
    except DeliveryRefused as exc:
        raise ApiError(409, exc.code, exc.message, exc.field) from None
    return DeliveryReceipt(stored=receipt.stored, resuming=bool(receipt.resumes))


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
    "/runs/{run_id}/events",
    summary="The run's events as server-sent events",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "id: seq, event: kind, data: JSON"},
        429: {"model": ErrorBody, "description": "this token has AIDAWORK_API_MAX_STREAMS_PER_TOKEN streams open"},
    },
)
async def run_events(
    run_id: UUID,
    request: Request,
    owner: Owner,
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", description="resume after this seq")] = None,
) -> StreamingResponse:
    after_seq = parse_last_event_id(last_event_id)
    assert credentials is not None  # Owner has refused a request without a valid token
    token_digest = _digest(credentials.credentials)
    if not state.slots.acquire(token_digest):
        limit = state.slots.limit
        raise ApiError(
            429,
            "TOO_MANY_STREAMS",
            f"this token has {limit} event streams open, the most allowed (AIDAWORK_API_MAX_STREAMS_PER_TOKEN); "
            "close one first",
        )
    try:
        await run_in_threadpool(owner_store.check_run_owner, state.context().engine, run_id, owner)
        sub = state.hub.subscribe(TailKey(run_id, owner, after_seq))
    except BaseException:
        state.slots.release(token_digest)
        raise
    return EventStreamResponse(
        state.hub,
        sub,
        release=lambda: state.slots.release(token_digest),
        keepalive_s=state.settings.api_keepalive_s,
        disconnected=request.is_disconnected,
    )


# --- the app --------------------------------------------------------------------------------


def create_app(settings: Settings | None = None, context: Callable[[], WorkerContext] | None = None) -> FastAPI:
    """The ASGI app. ``context`` gives the engine and runtime (default: this process's,
    built from the environment on first use)."""
    settings = settings or get_settings()
    state = ApiState(settings, TokenTable(settings.api_token_owners), context or get_context)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await state.hub.close()

    docs = settings.api_docs
    app = FastAPI(
        title="AIDAWORK",
        version="1",
        summary="Durable LLM agent runs: submit, follow, deliver inputs, cancel.",
        # A redirect would be built from the client's Host header; a wrong path is a 404.
        redirect_slashes=False,
        openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        lifespan=lifespan,
    )
    app.state.aidawork = state
    app.include_router(router)
    api_errors.install(app)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.api_max_body_bytes,
        timeout_s=settings.api_body_timeout_s,
        min_bytes_per_s=settings.api_body_min_bytes_per_s,
        refuse=error_response,
    )

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app

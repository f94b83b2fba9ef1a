"""Every answer of the HTTP API that is not a success, decided here: the JSON error body
``{"error": {"code", "message", "field"}}``, the status of each expected error, and the
last word on an unexpected one (a JSON 500 and one ``request_crashed`` log line). Every
``code`` sent is a member of ``schema.wire.errors.ErrorCode``, so the OpenAPI document
lists them all.

No error text quotes what the client sent: a field path is ASCII-safe
(``runtime.canonical.join_path``), and a crash is logged by the exception's type and the
line that raised it, never its message (a database error's message can quote the data).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import NotRequired, TypedDict

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.canonical import TOO_DEEP, TOO_MANY_DIGITS
from runtime.errors import AidaworkError, RequestInvalid
from runtime.prepare import format_loc
from schema.store.errors import (
    AgentExists,
    AgentNotFound,
    ForkRefused,
    IdempotencyKeyReused,
    RootBusy,
    RootNotFound,
    RunNotFound,
)
from schema.store.suspensions import DeliveryRefused
from schema.wire.errors import ErrorCode
from worker.api.limits import BodyRefused

log = structlog.get_logger("aidawork.api")
INTERNAL_ERROR = ErrorCode.INTERNAL_ERROR


class ApiError(Exception):
    """A refusal with its HTTP status; rendered as ``{"error": {...}}``."""

    def __init__(self, status: int, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


class ErrorDetail(BaseModel):
    code: ErrorCode
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def _encodable(text: str) -> str:
    # An unpaired surrogate (say, from a pydantic message quoting a key) cannot be sent
    # as UTF-8: escape it rather than fail the error response itself.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def catalogued(code: str) -> ErrorCode:
    """An error's code as the catalogue's member; a code outside it (a plugin's own)
    is not one a client can look up, so it is sent as ``INTERNAL_ERROR``."""
    return ErrorCode.lookup(code) or INTERNAL_ERROR


def error_response(
    status: int, code: ErrorCode, message: str, field: str | None = None, **headers: str
) -> JSONResponse:
    detail = ErrorDetail(code=code, message=_encodable(message), field=None if field is None else _encodable(field))
    return JSONResponse(ErrorBody(error=detail).model_dump(), status_code=status, headers=headers or None)


class ValidationErrorItem(TypedDict):
    """What is read of one error of a pydantic ``ValidationError`` (or FastAPI's own)."""

    type: str
    loc: tuple[int | str, ...]
    msg: str
    ctx: NotRequired[dict[str, object]]


def validation_refusal(errors: list[ValidationErrorItem]) -> ApiError:
    """The first pydantic/FastAPI error as a refusal naming its field (``config.tools[1]``,
    ``run_id``); malformed JSON is a 400, anything else a 422."""
    err = errors[0]
    where, *loc = list(err["loc"]) or ["body"]
    if err["type"] == "json_invalid":
        detail = err.get("ctx", {}).get("error", "JSON decode error")
        message = f"the body is not valid JSON: {detail} (at character {loc[0]})"
        return ApiError(400, ErrorCode.BODY_INVALID, message, "body")
    field = format_loc(loc) if loc else str(where)
    if where == "body" and not loc:
        return ApiError(422, ErrorCode.REQUEST_INVALID, f"body: {err['msg']} (send a JSON object)", "body")
    return ApiError(422, ErrorCode.REQUEST_INVALID, f"{field}: {err['msg']}", field)


# The status of each expected error raised by the store or the client.
STATUS_OF: Mapping[type[AidaworkError], tuple[int, str | None]] = {
    RequestInvalid: (422, None),  # field from the error itself
    RunNotFound: (404, "run_id"),
    RootNotFound: (404, "root_id"),
    AgentNotFound: (404, "agent"),
    AgentExists: (409, "name"),
    DeliveryRefused: (409, None),
    IdempotencyKeyReused: (409, "idempotency_key"),
    RootBusy: (409, "root_policy"),
    ForkRefused: (422, None),  # field from the error itself
}


def refusal_of(exc: AidaworkError) -> ApiError:
    for cls, (status, named) in STATUS_OF.items():
        if isinstance(exc, cls):
            field = exc.field if isinstance(exc, RequestInvalid | ForkRefused) else named
            return ApiError(status, catalogued(exc.code), exc.message, field)
    # Not a refusal of the request: a dependency is unavailable (retryable) or a bug.
    log.error("request_failed", code=exc.code, error=exc.message)
    return ApiError(503 if exc.retryable else 500, catalogued(exc.code), exc.message)


def body_parse_refusal(exc: HTTPException) -> ApiError | None:
    """What FastAPI's "There was an error parsing the body" (a 400 raised from the
    exception ``json.loads`` gave, other than a syntax error) was about."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, RecursionError):  # json.loads recurses per level: far past the limit
        return ApiError(422, ErrorCode.REQUEST_INVALID, f"body: {TOO_DEEP}", "body")
    if isinstance(cause, UnicodeDecodeError):
        return ApiError(400, ErrorCode.BODY_INVALID, "the body is not UTF-8 JSON", "body")
    if isinstance(cause, ValueError) and "digits" in str(cause):  # CPython's 4300-digit int limit
        return ApiError(422, ErrorCode.REQUEST_INVALID, f"body: {TOO_MANY_DIGITS}", "body")
    return None


# What FastAPI and Starlette refuse with, by status: an unknown path or method, and a body
# its parser failed on for a reason ``body_parse_refusal`` does not name. They raise no
# other status for this app's routes; should one appear, it is sent as REQUEST_INVALID (or
# INTERNAL_ERROR), so every code the API sends is in the catalogue (and the document).
_FRAMEWORK_CODES = {400: ErrorCode.HTTP_400, 404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


# --- handlers -----------------------------------------------------------------------------


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    extra = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    return error_response(exc.status, exc.code, exc.message, exc.field, **extra)


async def _on_aidawork_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AidaworkError)
    return await _on_api_error(request, refusal_of(exc))


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return await _on_api_error(request, validation_refusal(list(exc.errors())))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if isinstance(exc, BodyRefused):  # too large, or too slow (worker.api.limits)
        return error_response(exc.status_code, exc.code, exc.detail, "body", **(exc.headers or {}))
    parse_refusal = body_parse_refusal(exc)
    if parse_refusal is not None:
        return await _on_api_error(request, parse_refusal)
    code = _FRAMEWORK_CODES.get(exc.status_code) or (
        ErrorCode.REQUEST_INVALID if exc.status_code < 500 else INTERNAL_ERROR
    )
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return error_response(exc.status_code, code, str(exc.detail), **headers)


def _allowed_methods(request: Request) -> str:
    """Every method of the path, not only those of the first route that matched it
    (``GET /v1/runs`` and ``POST /v1/runs`` are two routes, of two routers)."""
    methods: set[str] = set()
    pending = list(request.app.router.routes)
    while pending:
        route = pending.pop()
        # An included router (FastAPI keeps it whole) holds its own routes.
        nested = getattr(getattr(route, "original_router", route), "routes", None)
        if nested is not None:
            pending.extend(nested)
        elif route.matches(request.scope)[0] is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


async def _on_database_down(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OperationalError)
    log.error("database_unavailable", error=str(exc.orig))
    return error_response(503, ErrorCode.DATABASE_UNAVAILABLE, "the database cannot be reached; retry later")


_PROJECT = Path(__file__).resolve().parents[2]  # the repository: worker/api/errors.py


def raised_at(exc: BaseException) -> str:
    """``worker/client/__init__.py:71 in resolve``: the innermost frame of this project's code in
    the exception's traceback (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(_PROJECT)]
    frame = (ours or frames)[-1]
    where = Path(frame.filename).resolve()
    shown = where.relative_to(_PROJECT) if where.is_relative_to(_PROJECT) else where.name
    return f"{shown}:{frame.lineno} in {frame.name}"


class CatchAll:
    """The last word on an exception no handler took: one ``request_crashed`` log line
    (error type and where it was raised, never the message) and a JSON 500 ``INTERNAL_ERROR``
    (or, when the response had already started, the end of it). Nothing is re-raised, so
    no server prints a traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.error(
                "request_crashed",
                method=scope["method"],
                path=scope["path"],
                error=type(exc).__name__,
                raised_at=raised_at(exc),
                response_started=started,
            )
            if not started:
                message = "the server failed to answer this request; the failure was logged (request_crashed)"
                await error_response(500, INTERNAL_ERROR, message)(scope, receive, send)


def install(app: FastAPI) -> None:
    """Register the handlers and the catch-all (innermost middleware: anything outside it,
    such as the request log, sees the 500)."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(AidaworkError, _on_aidawork_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(OperationalError, _on_database_down)
    app.add_middleware(CatchAll)

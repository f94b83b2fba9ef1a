"""The errors of the HTTP providers, and how a provider's error reply is described.

Errors built from a provider's answer carry the HTTP status, a code from a fixed
vocabulary (``ERROR_CODES``, ``STATUS_CODES``) and at most a short, scrubbed message from
a JSON error body; a provider's raw ``type``/``code`` strings and non-JSON bodies (an
internal service's page) are never echoed.
"""

from __future__ import annotations

from collections.abc import Mapping

from runtime.errors import ModelError, ModelInputRejection
from runtime.models.replies import HttpReply
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonValue

MAX_PROVIDER_MESSAGE_CHARS = 200


class ModelRequestRefused(ModelError):
    """The provider refused the request (a 4xx other than 408/429 and other than a
    context overflow, or a redirect): a bad model name, a bad key, a malformed request.
    Retrying the same request cannot help."""

    code = ErrorCode.MODEL_REQUEST_REFUSED

    def __init__(self, message: str, *, provider: str, status: int) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status


class ModelResponseInvalid(ModelError):
    """The provider answered 2xx with something that is not a usable response (not
    JSON, no choice, tool call arguments that are not a JSON object)."""

    code = ErrorCode.MODEL_RESPONSE_INVALID


def error_fields(reply: HttpReply) -> tuple[str, str, str]:
    """(type, code, message) of a JSON error body, whichever of the common shapes it has:
    ``{"error": {"type", "code", "message"}}`` (OpenAI, Anthropic), ``{"message", "type",
    "code"}`` (vLLM), ``{"error": "text"}`` (Ollama). Empty strings when the body is not
    such an object: a non-JSON body is never read for a message."""
    body = reply.body
    inner: JsonValue = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, str):
        return "", "", inner
    if isinstance(inner, dict):
        kind, code, message = inner.get("type"), inner.get("code"), inner.get("message")
        return (
            kind if isinstance(kind, str) else "",
            str(code) if isinstance(code, (str, int)) else "",
            message if isinstance(message, str) else "",
        )
    return "", "", ""


# The fixed vocabulary of provider error codes in our errors: the providers' own type and
# code strings are mapped onto it, never copied (they are free text a server controls).
ERROR_CODES: Mapping[str, str] = {
    "invalid_request_error": "invalid_request",
    "invalid_request": "invalid_request",
    "authentication_error": "authentication_failed",
    "invalid_api_key": "authentication_failed",
    "permission_error": "permission_denied",
    "not_found_error": "not_found",
    "model_not_found": "model_not_found",
    "rate_limit_error": "rate_limited",
    "rate_limit_exceeded": "rate_limited",
    "insufficient_quota": "quota_exceeded",
    "overloaded_error": "overloaded",
    "api_error": "server_error",
    "server_error": "server_error",
    "context_length_exceeded": "context_overflow",
    "request_too_large": "request_too_large",
}
STATUS_CODES: Mapping[int, str] = {
    400: "invalid_request",
    401: "authentication_failed",
    403: "permission_denied",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limited",
    503: "overloaded",
    529: "overloaded",
}


def error_code(reply: HttpReply) -> str:
    """The reply's code in our vocabulary: from the body's code or type when we know it,
    else from the status."""
    kind, code, _ = error_fields(reply)
    for raw in (code, kind):
        if raw.lower() in ERROR_CODES:
            return ERROR_CODES[raw.lower()]
    if reply.status in STATUS_CODES:
        return STATUS_CODES[reply.status]
    if 300 <= reply.status <= 399:
        return "redirect_not_followed"
    return "server_error" if 500 <= reply.status <= 599 else "http_error"


def describe_error(reply: HttpReply) -> str:
    """``HTTP 400 (invalid_request): message``: the status, our code, and at most a short
    message from a JSON error body (already scrubbed), on one line."""
    _, _, message = error_fields(reply)
    message = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    if len(message) > MAX_PROVIDER_MESSAGE_CHARS:
        message = message[:MAX_PROVIDER_MESSAGE_CHARS] + "..."
    out = f"HTTP {reply.status} ({error_code(reply)})"
    return f"{out}: {message}" if message else out


def typed_error(reply: HttpReply, *, provider: str, label: str, key_ref: str | None, overflow: bool) -> ModelError:
    """The typed error for a provider's final non-2xx reply (``overflow``: the provider
    said the input is too long for its context window)."""
    if overflow:
        return ModelInputRejection(f"{label} rejected the input as too long for the context window: "
                                   f"{describe_error(reply)}")
    if reply.status == 401:
        # Not even the provider's message: some echo a masked key back.
        return ModelRequestRefused(
            f"{label} refused the API key (HTTP 401; api_key_ref {key_ref!r})", provider=provider, status=401
        )
    return ModelRequestRefused(
        f"{label} refused the request: {describe_error(reply)}", provider=provider, status=reply.status
    )

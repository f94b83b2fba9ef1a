"""The core's error families by audience, on the one base (``schema.wire.errors``).

Every error carries a stable ``code`` (what a client or operator matches on) and says
whether retrying the same thing can help (``retryable``).
"""

from __future__ import annotations

from schema.wire.errors import AidaworkError, ErrorCode

__all__ = [
    "AidaworkError",
    "ModelContentFiltered",
    "ModelError",
    "ModelInputRejection",
    "ModelOutputTruncated",
    "ModelRefused",
    "ModelScriptExhausted",
    "ModelToolCallUnsupported",
    "ModelUnavailable",
    "RequestInvalid",
    "ToolFailed",
]


# --- bad input from an upstream service: refused before anything is stored -------------


class RequestInvalid(AidaworkError):
    """Raised by ``prepare_execution`` when a run request cannot be executed as written.

    ``field`` is the dotted path of the offending value (``config.tools[0]``).
    """

    code = ErrorCode.REQUEST_INVALID

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


# --- model providers -------------------------------------------------------------------


class ModelError(AidaworkError):
    """Raised by a model client when a call did not produce a usable response."""

    code = ErrorCode.MODEL_ERROR


class ModelUnavailable(ModelError):
    """The provider could not be reached or answered with a transient failure."""

    code = ErrorCode.MODEL_UNAVAILABLE
    retryable = True


class ModelInputRejection(ModelError):
    """The provider refused the input because it exceeds the context window."""

    code = ErrorCode.MODEL_INPUT_REJECTED


class ModelOutputTruncated(ModelError):
    """The answer was cut off by the output token limit (``length`` / ``max_tokens``),
    or a tool call was cut off mid-arguments."""

    code = ErrorCode.MODEL_OUTPUT_TRUNCATED


class ModelRefused(ModelError):
    """The model refused to answer (OpenAI ``message.refusal``, Anthropic ``refusal``)."""

    code = ErrorCode.MODEL_REFUSED


class ModelContentFiltered(ModelError):
    """The provider's content filter stopped the answer (OpenAI ``content_filter``)."""

    code = ErrorCode.MODEL_CONTENT_FILTERED


class ModelToolCallUnsupported(ModelError):
    """The model made a kind of tool call we do not run (OpenAI ``type: custom``)."""

    code = ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED


class ModelScriptExhausted(ModelError):
    """The scripted model was asked for a turn beyond the end of its script."""

    code = ErrorCode.MODEL_SCRIPT_EXHAUSTED


# --- tools -----------------------------------------------------------------------------


class ToolFailed(AidaworkError):
    """Raised by a tool handler for an expected failure; the model sees the message."""

    code = ErrorCode.TOOL_FAILED

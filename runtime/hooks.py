"""RoundHooks: what a round tells its caller as it goes (the model call before and after,
an at-most-once tool call's start and end, every call's outcome, the stream of deltas), so
the worker can write its ledger and metrics and tests can inject faults; ``NoHooks`` for a
caller that records nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from runtime.errors import ModelError
from runtime.messages import ToolCall
from runtime.models.base import ModelRequest, ModelResponse
from runtime.outcomes import ToolInvocation
from runtime.tools import PriorExecution, ToolContext, ToolOutcome


class RoundHooks(Protocol):
    """Called around the model call, so the caller can record the call in its ledger
    before and after (and inject faults in tests); or, instead of both, once when the
    round goes on from a response an earlier holder was given (nothing to record)."""

    def model_call_started(self, request: ModelRequest, request_digest: str) -> None: ...

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None: ...

    def tool_call_starting(self, call: ToolCall, ctx: ToolContext, *, retry_of: str | None) -> PriorExecution | None:
        """Record that an ``at_most_once`` call's handler is about to start (fenced), or
        return what an earlier start recorded. ``retry_of``: an operator asked to run it
        again, answering the wait with this id; one answer restarts the call once."""
        ...

    def tool_call_finished(self, call: ToolCall, outcome: ToolOutcome) -> None:
        """Record how an ``at_most_once`` call ended (a suspension clears its start)."""
        ...

    def model_response_reused(self, request_digest: str) -> None: ...

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        """Any tool call has its outcome (``started_ns``: ``time.time_ns()`` when it
        began): for metrics and spans only, it records nothing durable."""
        ...

    def model_delta_sink(self) -> Callable[[str], None] | None:
        """Where the text of the model call about to start goes as it streams (asked once
        per call), or None: the round wants the response only."""
        ...


class NoHooks:
    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        return None

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None:
        return None

    def tool_call_starting(self, call: ToolCall, ctx: ToolContext, *, retry_of: str | None) -> PriorExecution | None:
        return None

    def tool_call_finished(self, call: ToolCall, outcome: ToolOutcome) -> None:
        return None

    def model_response_reused(self, request_digest: str) -> None:
        return None

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        return None

    def model_delta_sink(self) -> Callable[[str], None] | None:
        return None

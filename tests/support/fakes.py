"""Builders and in-memory fakes shared by the unit tests (no services, no I/O)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from runtime.canonical import chain_digest
from runtime.deps import OrchestratorDeps, build_runtime
from runtime.errors import ModelError
from runtime.messages import Message, ToolCall
from runtime.models.base import ModelRequest, ModelResponse
from runtime.outcomes import ToolInvocation
from runtime.prepare import prepare_execution


def deps_for(raw: dict[str, Any], *, model: Any = None) -> OrchestratorDeps:
    """The run's deps from a fresh runtime; ``model`` replaces the scripted client."""
    _, prepared = prepare_execution(build_runtime(), raw)
    deps = prepared.deps
    return dataclasses.replace(deps, model=model) if model is not None else deps


def replay_chain(messages: Sequence[Message], start: str = "") -> list[str]:
    """The chain digest after each message, computed independently of the loop."""
    out, current = [], start
    for m in messages:
        current = chain_digest(current, m.to_json())
        out.append(current)
    return out


class CountingModel:
    """Wraps a client and records every request it serves (and the shared log, if any)."""

    def __init__(self, inner: Any, log: list[str] | None = None) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []
        self.log = log if log is not None else []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        self.log.append("complete")
        return self.inner.complete(request)


class FixedModel:
    """Answers round ``i`` with ``responses[i]``."""

    def __init__(self, responses: Sequence[ModelResponse]) -> None:
        self.responses = list(responses)
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return self.responses[request.round_index]


def calls(*specs: tuple[str, dict[str, Any]], round_index: int = 0) -> ModelResponse:
    return ModelResponse(
        content=None,
        tool_calls=tuple(ToolCall(f"call_{round_index}_{i}", n, a) for i, (n, a) in enumerate(specs)),
    )


class RaisingModel:
    def __init__(self, error: ModelError, log: list[str] | None = None) -> None:
        self.error = error
        self.calls = 0
        self.log = log if log is not None else []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        self.log.append("complete")
        raise self.error


@dataclasses.dataclass
class RecordingHooks:
    """A RoundHooks that records what it was told, in order, into ``log``."""

    log: list[str] = dataclasses.field(default_factory=list)
    started: list[tuple[ModelRequest, str]] = dataclasses.field(default_factory=list)
    finished: list[tuple[ModelResponse | None, ModelError | None]] = dataclasses.field(default_factory=list)
    reused: list[str] = dataclasses.field(default_factory=list)
    tools_done: list[str] = dataclasses.field(default_factory=list)  # kept apart from ``log``
    deltas: list[str] | None = None  # a list: the model call streams into it

    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        self.log.append("started")
        self.started.append((request, request_digest))

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None:
        self.log.append("finished")
        self.finished.append((response, error))

    def model_response_reused(self, request_digest: str) -> None:
        self.log.append("reused")
        self.reused.append(request_digest)

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        self.tools_done.append(invocation.call.name)

    def model_delta_sink(self) -> Callable[[str], None] | None:
        if self.deltas is None:
            return None
        deltas = self.deltas

        def sink(text: str) -> None:
            self.log.append("delta")
            deltas.append(text)

        return sink


class RecordingFactory:
    """A model provider factory that records client construction and every model call."""

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make = make
        self.configs: list[Any] = []
        self.requests: list[ModelRequest] = []

    def __call__(self, config: Any, owner: str) -> Any:
        self.configs.append(config)
        inner = self.make(config)
        factory = self

        class _Client:
            def complete(self, request: ModelRequest) -> ModelResponse:
                factory.requests.append(request)
                return inner.complete(request)

        return _Client()


@dataclasses.dataclass(frozen=True)
class SentTask:
    name: str
    args: list[Any]
    queue: str | None


class RecordingBroker:
    """Stands in for ``app.send_task`` where no Redis runs (the db tier): records each task
    sent and delivers none."""

    def __init__(self) -> None:
        self.sent: list[SentTask] = []

    def send_task(self, name: str, args: Sequence[Any] = (), kwargs: Any = None, **options: Any) -> None:
        self.sent.append(SentTask(name, list(args), options.get("queue")))

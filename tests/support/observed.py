"""A worker shell observed as a worker process is (``Observability.for_process``), whose
``openai`` runs answer from a canned Chat Completions body through the real parser: runs
that name any model, without a network."""

from __future__ import annotations

import dataclasses
from typing import Any

from runtime.models.base import ModelClient, ModelRequest, ModelResponse
from runtime.models.openai_compat import parse_chat_response
from runtime.prepare import prepare_execution
from schema.wire import RoundTask
from tests.support.requests import scripted_request
from tests.support.shell import Shell, shell
from worker.engine.round import execute_round
from worker.ops.observability import Observability
from worker.ops.observability.tracing import Tracing


class CannedChat(ModelClient):
    """An OpenAI-compatible answer parsed by the real parser, without a network."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        body = {"id": "chatcmpl-1", "model": "served-model",
                "choices": [{"message": {"content": "done"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
        return parse_chat_response(body, request.round_index)


def observed_shell(tracing: Tracing | None = None, **settings: Any) -> Shell:
    """A shell whose ``openai`` runs answer from ``CannedChat``, observed as a worker
    process is (``Observability.for_process``: labels from its settings and runtime)."""
    s = shell(**settings)
    base = s.ctx.runtime.base
    providers = {**base.model_providers, "openai": lambda config, owner: CannedChat()}
    runtime = dataclasses.replace(s.ctx.runtime, base=dataclasses.replace(base, model_providers=providers))
    observe = Observability.for_process(s.ctx.settings, runtime, tracing or Tracing(None))
    return dataclasses.replace(s, ctx=dataclasses.replace(s.ctx, runtime=runtime, observe=observe))


def submit_openai(s: Shell, model: dict[str, Any]) -> None:
    request = scripted_request([{"content": "unused"}], tools=[])
    request["config"]["model"] = {"provider": "openai", "api_key_ref": None, **model}
    run, prepared = prepare_execution(s.ctx.runtime, request)
    run_id = s.store.submit_run(run, prepared.turn_config.model_dump(mode="json"), None).run_id
    execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))

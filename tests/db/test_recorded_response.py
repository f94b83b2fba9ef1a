"""The accepted model response is durable before any tool runs, against a real PostgreSQL:
the ledger keeps the response of a call that succeeded."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import worker.round as round_module
from runtime.models.base import ModelRequest, ModelResponse
from schema.wire import RoundTask
from tests.support.db import model_calls, run_row
from tests.support.requests import scripted_request
from worker import client
from worker.round import RoundDisposition


def test_a_response_no_jsonb_can_hold_fails_the_round_and_is_not_kept(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = client.submit(scripted_request([{"content": "unused"}]), ctx=ctx).run_id

    class NulModel:
        def complete(self, request: ModelRequest) -> ModelResponse:
            return ModelResponse(content="a\x00b")

    real = round_module.drive_react_loop
    monkeypatch.setattr(
        round_module,
        "drive_react_loop",
        lambda deps, state, hooks: real(dataclasses.replace(deps, model=NulModel()), state, hooks),
    )
    assert round_module.execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    row = run_row(ctx.engine, run_id)
    assert (row["status"], row["error_code"]) == ("failed", "MODEL_RESPONSE_INVALID")
    (paid,) = model_calls(ctx.engine, run_id)
    assert (paid["status"], paid["response"]) == ("succeeded", None)

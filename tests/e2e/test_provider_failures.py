"""What a real worker does with a provider that fails, against a loopback server:
one that answers 500 to every call, and one that echoes pieces of the key it was sent.

- Always 500: the run ends ``failed`` with ``MODEL_UNAVAILABLE`` (a retryable code: a new
  run may succeed) within its documented bound, ``model_timeout_s`` from the start of the
  model call, the SDK's retries included; no further round is tried.
- Key pieces (its first 13 characters, the key reversed), in an answer streamed across
  chunks: no 8-character piece of the key is stored (ledger rows, events, output) or
  logged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.errors import ModelUnavailable
from runtime.models.transport import DEFAULT_RETRY
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import all_rows_as_text, model_calls
from tests.support.env import BROKER_URL, WAIT_S
from tests.support.providers import FakeProvider, Recorded, Reply, openai_error, openai_reply
from worker import client
from worker.engine.bootstrap import WorkerContext, build_context
from worker.ops.settings import Settings

KEY = "sk-canary-fragments-0123456789"
MODEL_TIMEOUT_S = 4.0
# Generous slack for what is not the model call: the task's way through the broker, the
# claim, the commit and the client's polling, on a loaded 2-core machine.
SLACK_S = 20.0


def windows(key: str) -> set[str]:
    """Every 8-character piece of ``key`` and of ``key`` reversed."""
    return {k[i : i + 8] for k in (key, key[::-1]) for i in range(len(k) - 7)}


def play(recorded: Recorded) -> Reply:
    """``down-gpt`` answers 500 to every call; ``echo-gpt`` answers with pieces of the key
    it was sent (streamed in halves by the server, so a piece spans chunks)."""
    model = recorded.body.get("model") if isinstance(recorded.body, dict) else None
    if model == "down-gpt":
        return openai_error(500, "The server had an error while processing your request.", kind="server_error")
    sent = str(recorded.headers.get("authorization", "")).removeprefix("Bearer ")
    return openai_reply(f"Your key starts {sent[:13]} and backwards it is {sent[::-1]}; bye.")


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider(play)
    yield server
    server.close()


@pytest.fixture
def provider_ctx(db_url: str, redis_clean: None, fake: FakeProvider) -> Iterator[WorkerContext]:
    settings = Settings(
        database_url=db_url, broker_url=BROKER_URL, lease_s=2, dispatch_grace_s=1,
        openai_api_key=KEY, model_base_urls=[f"{fake.url}/v1"],
    )
    context = build_context(settings)
    yield context
    context.engine.dispose()


def start_worker(cluster: Cluster, fake: FakeProvider) -> None:
    env = {"AIDAWORK_OPENAI_API_KEY": KEY, "AIDAWORK_MODEL_BASE_URLS": json.dumps([f"{fake.url}/v1"])}
    cluster.start_worker("w1", env=env)
    wait_ready(cluster, "w1")


def run_request(fake: FakeProvider, name: str) -> dict[str, Any]:
    return {
        "owner": "team-test",
        "root_id": None,
        "input": "Hello.",
        "config": {
            "model": {"provider": "openai", "name": name, "base_url": f"{fake.url}/v1"},
            "system_prompt": "You answer.",
            "policy": {"model_timeout_s": MODEL_TIMEOUT_S},
        },
    }


def test_a_provider_that_always_answers_500_fails_the_run_within_its_model_timeout(
    cluster: Cluster, provider_ctx: WorkerContext, fake: FakeProvider
) -> None:
    ctx = provider_ctx
    start_worker(cluster, fake)
    started = time.monotonic()
    run_id = client.submit(run_request(fake, "down-gpt"), ctx=ctx).run_id
    view = client.wait(run_id, ctx=ctx, timeout_s=MODEL_TIMEOUT_S + SLACK_S)
    elapsed_s = time.monotonic() - started
    print(f"run {view.status} ({view.error_code}) {elapsed_s:.2f}s after submission; "
          f"bound {MODEL_TIMEOUT_S:g}s model_timeout_s + {SLACK_S:g}s slack")

    assert (view.status, view.error_code) == ("failed", ModelUnavailable.code) and ModelUnavailable.retryable
    assert "HTTP 500" in (view.error_message or "")
    assert elapsed_s <= MODEL_TIMEOUT_S + SLACK_S
    # One model call on the ledger, failed; the SDK's attempts within it, and no more: the
    # round was not tried again.
    calls = model_calls(ctx.engine, run_id)
    assert [(c["status"], c["error_code"]) for c in calls] == [("failed", ModelUnavailable.code)]
    assert 1 <= len(fake.requests) <= DEFAULT_RETRY.max_attempts


def test_pieces_of_the_key_echoed_by_a_provider_are_neither_stored_nor_logged(
    cluster: Cluster, provider_ctx: WorkerContext, fake: FakeProvider
) -> None:
    ctx = provider_ctx
    start_worker(cluster, fake)
    run_id = client.submit(run_request(fake, "echo-gpt"), ctx=ctx).run_id
    view = client.wait(run_id, ctx=ctx, timeout_s=WAIT_S)

    assert view.status == "completed"
    assert view.output == "Your key starts [redacted] and backwards it is [redacted]; bye."
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in fake.requests)  # the key was sent
    assert all(r.body.get("stream") is True for r in fake.requests)
    pieces = windows(KEY)
    tables = all_rows_as_text(ctx)
    assert "[redacted]" in tables["run_events"] and "[redacted]" in tables["runs"]
    leaked = {name: sorted(p for p in pieces if p in dump) for name, dump in tables.items()}
    assert {name: found for name, found in leaked.items() if found} == {}
    log_text = (cluster.log_dir / "w1.log").read_text(errors="replace")
    assert '"round_committed"' in log_text and [p for p in pieces if p in log_text] == []

"""Real model providers through real worker processes, against a loopback server that
plays the model in each provider's wire format (first a call to ``add``, then the answer).

The worker gets canary keys from its environment, as in production. Afterwards the
worker's log file and every row of every table of the test database are searched for
the canaries: absent. One run's provider echoes the key back in an error body, so a
stored error message is exercised too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import Cluster, wait_ready
from tests.support.db import all_rows_as_text, model_calls, rows
from tests.support.env import BROKER_URL, WAIT_S
from tests.support.providers import (
    FakeProvider,
    Recorded,
    Reply,
    add_then_answer,
    anthropic_reply,
    openai_error,
    openai_reply,
)
from worker import client
from worker.engine.bootstrap import WorkerContext, build_context
from worker.ops.settings import Settings

OPENAI_KEY = "sk-canary-openai-XYZ"
ANTHROPIC_KEY = "sk-canary-anthropic-XYZ"
NAMED_KEY = "sk-canary-named-XYZ"
CANARIES = (OPENAI_KEY, ANTHROPIC_KEY, NAMED_KEY, "canary-XYZ")


def play(recorded: Recorded) -> Reply:
    """The model: add then answer; the model named ``echo-key`` instead refuses the request
    quoting the key it was sent, like a careless proxy; ``pause-claude`` pauses its turn
    once, then answers; ``cut-gpt`` and ``cut-claude`` run out of output tokens;
    ``refuse-gpt`` refuses; ``filter-gpt`` is stopped by a content filter."""
    model = recorded.body.get("model") if isinstance(recorded.body, dict) else None
    if model == "echo-key":
        return openai_error(400, f"unsupported header value {recorded.headers.get('authorization')}")
    if model == "pause-claude":
        last = recorded.body["messages"][-1]
        if last["role"] == "assistant":  # the paused turn, sent back to be continued
            return anthropic_reply(" and done.")
        return anthropic_reply("Working", stop_reason="pause_turn")
    if model == "cut-gpt":
        return openai_reply("The answer is", finish_reason="length")
    if model == "cut-claude":
        return anthropic_reply("The answer is", stop_reason="max_tokens")
    if model == "refuse-gpt":
        return openai_reply(None, refusal="I can't help with that.")
    if model == "filter-gpt":
        return openai_reply("", finish_reason="content_filter")
    return add_then_answer(recorded)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider(play)
    yield server
    server.close()


def key_env(fake: FakeProvider) -> dict[str, str]:
    return {
        "AIDAWORK_OPENAI_API_KEY": OPENAI_KEY,
        "AIDAWORK_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "AIDAWORK_MODEL_KEYS": json.dumps({"team-b": {"key": NAMED_KEY, "owners": ["team-test"]}}),
        "AIDAWORK_MODEL_BASE_URLS": json.dumps([f"{fake.url}/v1", fake.url]),
    }


@pytest.fixture
def provider_ctx(db_url: str, redis_clean: None, fake: FakeProvider) -> Iterator[WorkerContext]:
    """The submitting side, configured like the workers: it validates api_key_ref and
    base_url against the same settings."""
    settings = Settings(
        database_url=db_url,
        broker_url=BROKER_URL,
        lease_s=2,
        dispatch_grace_s=1,
        openai_api_key=OPENAI_KEY,
        anthropic_api_key=ANTHROPIC_KEY,
        model_keys={"team-b": {"key": NAMED_KEY, "owners": ["team-test"]}},
        model_base_urls=[f"{fake.url}/v1", fake.url],
    )
    context = build_context(settings)
    yield context
    context.engine.dispose()


def run_request(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "owner": "team-test",
        "root_id": None,
        "input": "Add 2 and 3.",
        "config": {"model": model, "system_prompt": "You add numbers.", "tools": ["add"]},
    }


def test_tool_using_runs_complete_for_each_provider_and_no_key_is_logged_or_stored(
    cluster: Cluster, provider_ctx: WorkerContext, fake: FakeProvider
) -> None:
    ctx = provider_ctx
    cluster.start_worker("w1", env={**key_env(fake), "AIDAWORK_LOG_LEVEL": "DEBUG"})
    wait_ready(cluster, "w1")
    models = {
        "openai": {"provider": "openai", "name": "fake-gpt", "base_url": f"{fake.url}/v1"},
        "anthropic": {"provider": "anthropic", "name": "fake-claude", "base_url": fake.url, "max_tokens": 512},
        "named": {"provider": "openai", "name": "fake-gpt-b", "base_url": f"{fake.url}/v1", "api_key_ref": "team-b"},
        "echo": {"provider": "openai", "name": "echo-key", "base_url": f"{fake.url}/v1"},
        "pause": {"provider": "anthropic", "name": "pause-claude", "base_url": fake.url},
        "cut": {"provider": "openai", "name": "cut-gpt", "base_url": f"{fake.url}/v1"},
        "cut-claude": {"provider": "anthropic", "name": "cut-claude", "base_url": fake.url},
        "refused": {"provider": "openai", "name": "refuse-gpt", "base_url": f"{fake.url}/v1"},
        "filtered": {"provider": "openai", "name": "filter-gpt", "base_url": f"{fake.url}/v1"},
    }
    runs = {label: client.submit(run_request(model), ctx=ctx).run_id for label, model in models.items()}
    views = {label: client.wait(run_id, ctx=ctx, timeout_s=WAIT_S) for label, run_id in runs.items()}

    # Each provider's run: a tool round, then the answer built from the tool's result.
    for label in ("openai", "anthropic", "named"):
        view = views[label]
        assert (view.status, view.output, view.rounds) == ("completed", "The sum is 5.", 2), label
        calls = model_calls(ctx.engine, runs[label])
        assert [c["status"] for c in calls] == ["succeeded", "succeeded"]
        expected_usage = (13, 5) if label == "anthropic" else (11, 7)
        assert [(c["input_tokens"], c["output_tokens"]) for c in calls] == [expected_usage] * 2
        invocations = rows(ctx.engine, "SELECT tool_name, args, result FROM tool_invocations WHERE run_id = :id",
                           id=runs[label])
        assert invocations == [{"tool_name": "add", "args": {"a": 2, "b": 3}, "result": {"sum": 5}}]
        # How each answer ended, stored with its round and shown in its model_responded event.
        endings = ["tool_use", "end_turn"] if label == "anthropic" else ["tool_calls", "stop"]
        stored = rows(ctx.engine, "SELECT finish_reason FROM rounds WHERE run_id = :id ORDER BY boundary_seq",
                      id=runs[label])
        assert [r["finish_reason"] for r in stored] == endings, label
        events = rows(ctx.engine, "SELECT data FROM run_events WHERE run_id = :id AND kind = 'model_responded' "
                      "ORDER BY seq", id=runs[label])
        assert [e["data"]["finish_reason"] for e in events] == endings, label

    # pause_turn: the turn went on in the same round, two model calls on the ledger.
    paused = views["pause"]
    assert (paused.status, paused.output, paused.rounds) == ("completed", "Working and done.", 1)
    assert [c["status"] for c in model_calls(ctx.engine, runs["pause"])] == ["succeeded", "succeeded"]
    assert len(rows(ctx.engine, "SELECT 1 AS x FROM rounds WHERE run_id = :id", id=runs["pause"])) == 1

    # A truncated answer fails the run with its code, not completes with the partial text.
    # Each ending that carries no usable answer fails the run with its code, not completes
    # with the partial or empty text.
    endings_by_run = {label: (views[label].status, views[label].error_code, views[label].output)
                      for label in ("cut", "cut-claude", "refused", "filtered")}
    assert endings_by_run == {
        "cut": ("failed", "MODEL_OUTPUT_TRUNCATED", None),
        "cut-claude": ("failed", "MODEL_OUTPUT_TRUNCATED", None),
        "refused": ("failed", "MODEL_REFUSED", None),
        "filtered": ("failed", "MODEL_CONTENT_FILTERED", None),
    }
    assert "I can't help with that." in (views["refused"].error_message or "")

    # The keys were sent, each in its provider's header, to the loopback server.
    by_model: dict[str, set[str]] = {}
    for r in fake.requests:
        by_model.setdefault(r.body["model"], set()).add(r.headers.get("authorization") or r.headers["x-api-key"])
    assert by_model == {
        "fake-gpt": {f"Bearer {OPENAI_KEY}"},
        "fake-claude": {ANTHROPIC_KEY},
        "fake-gpt-b": {f"Bearer {NAMED_KEY}"},
        "echo-key": {f"Bearer {OPENAI_KEY}"},
        "pause-claude": {ANTHROPIC_KEY},
        "cut-gpt": {f"Bearer {OPENAI_KEY}"},
        "cut-claude": {ANTHROPIC_KEY},
        "refuse-gpt": {f"Bearer {OPENAI_KEY}"},
        "filter-gpt": {f"Bearer {OPENAI_KEY}"},
    }
    assert all(r.headers["anthropic-version"] for r in fake.requests if r.path == "/v1/messages")
    # Every call streamed (the worker's delta sink is Redis): the SDKs' streaming APIs,
    # answered by the loopback server in each provider's streaming wire format.
    assert all(r.body.get("stream") is True for r in fake.requests)

    # The provider that echoed the key failed the run with a typed error, key redacted.
    echoed = views["echo"]
    assert (echoed.status, echoed.error_code) == ("failed", "MODEL_REQUEST_REFUSED")
    assert "HTTP 400" in (echoed.error_message or "") and "[redacted]" in (echoed.error_message or "")

    # Nowhere in the worker's log, nowhere in the database.
    log_text = (cluster.log_dir / "w1.log").read_text(errors="replace")
    assert log_text.count('"round_committed"') >= 7  # the scan reads the log the rounds were logged to
    tables = all_rows_as_text(ctx)
    assert fake.url.split(":")[-1] in tables["runs"]  # the scan reads the run rows (their config)
    assert "[redacted]" in tables["runs"] and "The sum is 5." in tables["run_events"]
    for canary in CANARIES:
        assert canary not in log_text, f"{canary} is in the worker log"
        leaked = [name for name, dump in tables.items() if canary in dump]
        assert leaked == [], f"{canary} is stored in {leaked}"

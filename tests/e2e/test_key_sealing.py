"""Provider keys never leave their owner: real workers, real Flower, the real HTTP API, and a loopback
provider that echoes the key it was sent, and another tenant's key, into every field of
its error bodies (``type``, ``code``, ``message``, ``param``, nested objects) and of its
2xx answers (content, tool-call ids, tool names, arguments), for both the
OpenAI-compatible and the Anthropic adapters.

Afterwards the canaries are searched for in every log line of every process, every row
of every table (events included), Flower's task list (retried tasks included) and
``aidawork status --json`` of every run: absent. Each search first checks that it reads
what it should (a redacted echo, a retried task), so a broken search cannot pass.

Also here, end to end: keys bound to owners, the allowlist applied without a key, and a
provider that reuses a tool call id across rounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runtime.errors import RequestInvalid
from runtime.models.scrub import REDACTED
from tests.support.api import A, ApiServer, sse
from tests.support.cluster import Cluster, wait_events, wait_ready
from tests.support.db import all_rows_as_text, rows
from tests.support.env import BROKER_URL, REPO, WAIT_S
from tests.support.providers import (
    FakeProvider,
    Recorded,
    Reply,
    anthropic_reply,
    echoing_error,
    echoing_reply,
    openai_reply,
)
from tests.support.wait import wait_until
from worker import client
from worker.engine.bootstrap import WorkerContext, build_context
from worker.ops.settings import Settings

OPENAI_KEY = "sk-seal-openai-canary-1"
ANTHROPIC_KEY = "sk-seal-anthropic-canary-2"
TEAM_B_KEY = "sk-seal-team-b-canary-3"
SHARED_KEY = "sk-seal-shared-canary-4"
CANARIES = (OPENAI_KEY, ANTHROPIC_KEY, TEAM_B_KEY, SHARED_KEY)
# One fewer than the SDK's attempts: the call retries (model_call_retried) and still answers. A
# provider failing a whole call fails the run (tests/e2e/test_provider_failures.py).
FLAKY_FAILURES = 3


class Hostile:
    """The provider. Every text it sends holds the key of the request and team-b's key."""

    def __init__(self) -> None:
        self.flaky_calls = 0
        self.lock = threading.Lock()

    def __call__(self, recorded: Recorded) -> Reply:
        anthropic = recorded.path.endswith("/v1/messages")
        sent = recorded.headers.get("x-api-key") or recorded.headers.get("authorization", "").removeprefix("Bearer ")
        echo = f"{sent}|{TEAM_B_KEY}"
        model = recorded.body["model"]
        first_round = not any(
            m.get("role") == "tool" or (isinstance(m.get("content"), list) and m["content"][-1].get("type") ==
                                        "tool_result")
            for m in recorded.body["messages"]
        )
        if model == "err-400":
            return echoing_error(400, echo, anthropic=anthropic)
        if model == "flaky":
            with self.lock:
                self.flaky_calls += 1
                if self.flaky_calls <= FLAKY_FAILURES:
                    return echoing_error(500, echo, anthropic=anthropic, headers={"retry-after": "0"})
        if model == "reuse-ids":
            rounds = sum(1 for m in recorded.body["messages"] if m.get("role") == "tool")
            if rounds < 2:  # the same id, round after round
                return openai_reply(None, [("call_0", "add", '{"a": 2, "b": 3}')])
            return openai_reply("done")
        if first_round:
            return echoing_reply(echo, anthropic=anthropic)
        final = f"The key is {echo}."
        return anthropic_reply(final) if anthropic else openai_reply(final)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider(Hostile())
    yield server
    server.close()


def key_settings(fake: FakeProvider) -> dict[str, Any]:
    return {
        "openai_api_key": OPENAI_KEY,
        "anthropic_api_key": ANTHROPIC_KEY,
        "model_keys": json.dumps(
            {"team-b": {"key": TEAM_B_KEY, "owners": ["team-b"]}, "shared": {"key": SHARED_KEY, "owners": ["*"]}}
        ),
        "model_base_urls": json.dumps([f"{fake.url}/v1", fake.url]),
    }


@pytest.fixture
def sealed_ctx(db_url: str, redis_clean: None, fake: FakeProvider) -> Iterator[WorkerContext]:
    settings = Settings(database_url=db_url, broker_url=BROKER_URL, lease_s=2, dispatch_grace_s=1, **key_settings(fake))
    context = build_context(settings)
    yield context
    context.engine.dispose()


def request(owner: str, model: dict[str, Any], tools: tuple[str, ...] = ("add", "echo")) -> dict[str, Any]:
    return {
        "owner": owner,
        "root_id": None,
        "input": "Add 2 and 3.",
        "config": {"model": model, "system_prompt": "You add.", "tools": list(tools)},
    }


def openai(fake: FakeProvider, name: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "openai", "name": name, "base_url": f"{fake.url}/v1", **extra}


def anthropic(fake: FakeProvider, name: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "anthropic", "name": name, "base_url": fake.url, "max_tokens": 256, **extra}


def test_no_key_reaches_any_log_row_event_flower_task_or_status(
    cluster: Cluster,
    sealed_ctx: WorkerContext,
    fake: FakeProvider,
    flower: httpx.Client,
    api: ApiServer,
) -> None:
    ctx = sealed_ctx
    env = {f"AIDAWORK_{k.upper()}": v for k, v in key_settings(fake).items()}
    cluster.start_worker("w1", env={**env, "AIDAWORK_LOG_LEVEL": "DEBUG"})
    cluster.start_beat()
    wait_ready(cluster, "w1")
    # Task events are off until Flower's enable_events broadcast (every 5 s) turns them on.
    wait_events(cluster, "w1", "Events of group {task} enabled by remote.", count=1)
    models = {
        "openai_error": openai(fake, "err-400"),
        "anthropic_error": anthropic(fake, "err-400"),
        "openai_flaky": openai(fake, "flaky"),
        "openai_answer": openai(fake, "ok"),
        "anthropic_answer": anthropic(fake, "ok"),
        "shared_key": openai(fake, "ok", api_key_ref="shared"),
    }
    runs = {label: client.submit(request("team-a", m), ctx=ctx).run_id for label, m in models.items()}
    views = {label: client.wait(run_id, ctx=ctx, timeout_s=WAIT_S) for label, run_id in runs.items()}

    # What the runs did: refusals with our vocabulary, answers with the echoes redacted.
    for label in ("openai_error", "anthropic_error"):
        view = views[label]
        assert (view.status, view.error_code) == ("failed", "MODEL_REQUEST_REFUSED"), label
        assert "HTTP 400 (invalid_request)" in (view.error_message or "") and REDACTED in (view.error_message or "")
        assert "echo Bearer" not in (view.error_message or "")
    for label in ("openai_flaky", "openai_answer", "anthropic_answer", "shared_key"):
        assert (views[label].status, views[label].rounds) == ("completed", 2), (label, views[label])
    assert views["openai_answer"].output == f"The key is {REDACTED}|{REDACTED}."
    assert {r.headers.get("authorization") for r in fake.requests if r.body["model"] == "ok"} >= {
        f"Bearer {OPENAI_KEY}",
        f"Bearer {SHARED_KEY}",
    }

    # Flower saw the rounds (their arguments and results are what it could leak).
    def rounds_seen() -> bool:
        tasks = flower.get("/api/tasks").json()
        return sum(1 for t in tasks.values() if t.get("state") == "SUCCESS") >= len(runs)

    wait_until(rounds_seen, timeout_s=WAIT_S, what="Flower to show the round tasks")
    flower_text = json.dumps(flower.get("/api/tasks").json())
    assert str(runs["openai_flaky"]) in flower_text

    statuses = []
    for run_id in runs.values():
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", "status", str(run_id), "--json"],
            cwd=REPO, env=cluster.env(), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        statuses.append(done.stdout + done.stderr)
    status_text = "\n".join(statuses)
    assert REDACTED in status_text

    # What the HTTP API answers: the run views and their event streams.
    api_answers = []
    for run_id in runs.values():
        got = api.http.get(f"/v1/runs/{run_id}", headers=A)
        assert got.status_code == 200, got.text
        api_answers.append(got.text)
        api_answers.append(json.dumps(sse(api, str(run_id), A)))
    api_text = "\n".join(api_answers)
    assert REDACTED in api_text and '"tool_completed"' in api_text

    logs = "\n".join(p.read_text(errors="replace") for p in cluster.log_dir.glob("*.log"))
    assert '"request_served"' in logs  # the API's log is among them
    assert '"model_call_retried"' in logs and '"round_committed"' in logs
    tables = all_rows_as_text(ctx)
    assert REDACTED in tables["messages"] and REDACTED in tables["run_events"] and REDACTED in tables["runs"]
    assert REDACTED in tables["tool_invocations"]
    haystacks = {"logs": logs, "flower": flower_text, "status --json": status_text, "api": api_text, **tables}
    for canary in CANARIES:
        leaked = [where for where, text in haystacks.items() if canary in text]
        assert leaked == [], f"{canary} leaked into {leaked}"


def test_keys_are_bound_to_owners_and_every_base_url_is_allow_listed(
    sealed_ctx: WorkerContext, fake: FakeProvider
) -> None:
    ctx = sealed_ctx
    answers = {}
    for ref in ("team-b", "no-such-key", TEAM_B_KEY.replace("sk-", "k-")):
        with pytest.raises(RequestInvalid) as info:
            client.submit(request("team-a", openai(fake, "ok", api_key_ref=ref)), ctx=ctx)
        answers[ref] = (info.value.field, info.value.reason)
    assert len(set(answers.values())) == 1  # the same refusal whether the name exists or not
    assert next(iter(answers.values()))[0] == "config.model.api_key_ref"

    # team-b may use its own key; anyone may use the shared one.
    client.submit(request("team-b", openai(fake, "ok", api_key_ref="team-b")), ctx=ctx)
    client.submit(request("team-a", openai(fake, "ok", api_key_ref="shared")), ctx=ctx)

    # Without a key a call still only goes where the deployment allows.
    with pytest.raises(RequestInvalid) as info:
        client.submit(
            request("team-a", openai(fake, "ok", api_key_ref=None, base_url="http://127.0.0.1:9/internal")), ctx=ctx
        )
    assert info.value.field == "config.model.base_url"


def test_a_provider_reusing_a_tool_call_id_across_rounds_gets_unique_ids(
    cluster: Cluster, sealed_ctx: WorkerContext, fake: FakeProvider
) -> None:
    ctx = sealed_ctx
    env = {f"AIDAWORK_{k.upper()}": v for k, v in key_settings(fake).items()}
    cluster.start_worker("w1", env=env)
    wait_ready(cluster, "w1")
    run_id = client.submit(request("team-a", openai(fake, "reuse-ids"), tools=("add",)), ctx=ctx).run_id
    view = client.wait(run_id, ctx=ctx, timeout_s=WAIT_S)

    assert (view.status, view.output, view.rounds) == ("completed", "done", 3)
    invocations = rows(ctx.engine, "SELECT tool_call_id FROM tool_invocations WHERE run_id = :id ORDER BY boundary_seq",
                       id=run_id)
    ids = [r["tool_call_id"] for r in invocations]
    assert ids == ["call_0", "call_0_1_0"]
    # The provider saw the renamed id paired with its result.
    last = fake.requests[-1].body["messages"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["call_0", "call_0_1_0"]

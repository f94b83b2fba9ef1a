"""Webhooks with real processes: a worker runs the rounds, ``aidawork webhooks`` delivers
the outbox to a loopback receiver run by the test. Each event arrives once per success,
signed; a receiver that fails is retried with the same delivery id; a receiver that hangs
holds up no round; ``aidawork status --json`` shows every delivery."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
from pydantic import SecretStr

from schema.store.events import read_events
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import wait_suspended, wait_terminal
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from tests.support.webhook_receiver import LoopbackReceiver, Received, loopback_receiver
from worker import client

SECRET = "whsec-e2e-0123456789abcdef"
WAIT_S = 30.0
# Small backoff and timeout, so the retries of a test take a second, not an hour.
DELIVERER_ENV = {
    "AIDAWORK_WEBHOOK_SECRET": SECRET,
    "AIDAWORK_WEBHOOK_BACKOFF_S": "0.2",
    "AIDAWORK_WEBHOOK_BACKOFF_MAX_S": "0.5",
    "AIDAWORK_WEBHOOK_TIMEOUT_S": "1",
    "AIDAWORK_WEBHOOK_POLL_S": "0.2",
}
READ = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["a.md"]}}]}, {"content": "read it"}]


@pytest.fixture
def release() -> threading.Event:
    """Set to let go of the requests ``/hang`` holds."""
    return threading.Event()


@pytest.fixture
def receiver(release: threading.Event) -> Iterator[LoopbackReceiver]:
    """``/flaky`` answers each delivery (by its ``AIDAWORK-Delivery`` id) 500 twice, then
    200; ``/hang`` holds each request until ``release`` is set (past the deliverer's
    timeout); anything else answers 200."""
    failures: dict[str, int] = {}

    def answer(got: Received) -> int:
        delivery = got.headers["AIDAWORK-Delivery"]
        if got.path.startswith("/flaky") and failures.get(delivery, 0) < 2:
            failures[delivery] = failures.get(delivery, 0) + 1
            return 500
        if got.path.startswith("/hang"):
            release.wait(WAIT_S)
        return 200

    with loopback_receiver(answer) as receiver:
        yield receiver
        release.set()


def hooked_ctx(ctx: Any, receiver: LoopbackReceiver) -> Any:
    """The test's client context, allowing webhooks to the receiver (as the env would)."""
    settings = ctx.settings.model_copy(update={"webhook_urls": receiver.url + "/", "webhook_secret": SecretStr(SECRET)})
    return replace(ctx, settings=settings)


def submit(ctx: Any, receiver: LoopbackReceiver, path: str) -> UUID:
    request = scripted_request(READ, tools=["read_files"], webhook_url=f"{receiver.url}{path}?token=t0ken")
    return client.submit(request, ctx=ctx).run_id


def test_each_event_arrives_once_signed_and_failures_are_retried(cluster: Cluster, ctx: Any,
                                                                   receiver: LoopbackReceiver) -> None:
    ctx = hooked_ctx(ctx, receiver)
    cluster.start_worker("w1", concurrency=4)
    cluster.start_webhooks(env=DELIVERER_ENV)
    wait_ready(cluster, "w1")
    done, cancelled, flaky = submit(ctx, receiver, "/done"), submit(ctx, receiver, "/cancel"), submit(
        ctx, receiver, "/flaky")
    for run_id in (done, cancelled, flaky):
        wait_suspended(ctx.engine, run_id)
    client.deliver(done, "call_0_0", {"a.md": "text"}, ctx=ctx)
    client.deliver(flaky, "call_0_0", {"a.md": "text"}, ctx=ctx)
    assert client.cancel(cancelled, ctx=ctx)
    for run_id in (done, cancelled, flaky):
        wait_terminal(ctx.engine, run_id)

    def all_sent() -> bool:
        views = [client.status(r, ctx=ctx).webhooks for r in (done, cancelled, flaky)]
        return all(len(v) == 2 and {w.status for w in v} == {"delivered"} for v in views)

    wait_until(all_sent, timeout_s=WAIT_S, interval_s=0.1, what="every webhook delivered")
    assert [(b["kind"], b["run_id"]) for b in receiver.bodies("/done")] == [
        ("run_suspended", str(done)), ("run_completed", str(done))]
    assert [b["kind"] for b in receiver.bodies("/cancel")] == ["run_suspended", "run_cancelled"]
    # The failing receiver got each event until it answered 200 (500, 500, 200), with one
    # delivery id across the retries of an event. (Deliveries are not ordered: use seq.)
    flaky_got = sorted((json.loads(g.body)["kind"], g.headers["AIDAWORK-Delivery"]) for g in receiver.got
                       if g.path.startswith("/flaky"))
    assert [k for k, _ in flaky_got] == ["run_completed"] * 3 + ["run_suspended"] * 3
    assert len({d for _, d in flaky_got}) == 2
    # Signed with the owner's secret, as `aidawork owner webhook-secret` prints it (not the master).
    receiver.assert_signed_by(cluster.db_url, "team-test", SECRET)
    for got in receiver.got:
        assert not client.verify_webhook(got.body, got.headers["AIDAWORK-Signature"], SECRET)
    # The body is the event as the event stream serves it, and the run's owner.
    stream = {e.seq: e for e in read_events(ctx.engine, done)}
    for body in receiver.bodies("/done"):
        assert {**json.loads(stream[body["seq"]].model_dump_json()), "owner": "team-test"} == body

    shown = cli(cluster.db_url, "status", str(flaky), "--json")
    assert shown.returncode == 0, shown.stderr
    hooks = json.loads(shown.stdout)["webhooks"]
    assert [(h["event_kind"], h["status"], h["attempts"], h["last_status_code"], h["next_attempt_at"])
            for h in hooks] == [("run_suspended", "delivered", 3, 200, None), ("run_completed", "delivered", 3, 200,
                                                                              None)]
    log_text = (cluster.log_dir / "webhooks.log").read_text()
    assert "t0ken" not in log_text and SECRET not in log_text and "/flaky" not in log_text
    assert '"webhook_attempt_failed"' in log_text and '"webhook_delivered"' in log_text


def test_a_hanging_receiver_holds_up_no_round(
    cluster: Cluster, ctx: Any, receiver: LoopbackReceiver, release: threading.Event
) -> None:
    ctx = hooked_ctx(ctx, receiver)
    cluster.start_worker("w1", concurrency=2)
    cluster.start_webhooks(env=DELIVERER_ENV)
    wait_ready(cluster, "w1")
    run_id = submit(ctx, receiver, "/hang")
    wait_suspended(ctx.engine, run_id)
    # The run_suspended delivery is stuck in the receiver (held past the attempt's timeout) ...
    wait_until(lambda: receiver.bodies("/hang"), timeout_s=WAIT_S, interval_s=0.05, what="the webhook to arrive")
    client.deliver(run_id, "call_0_0", {"a.md": "text"}, ctx=ctx)
    # ... and the run's remaining rounds commit all the same.
    run = wait_terminal(ctx.engine, run_id)
    assert run["status"] == "completed"
    assert not release.is_set()

    def timed_out() -> bool:
        first = client.status(run_id, ctx=ctx).webhooks[0]
        return first.event_kind == "run_suspended" and (first.last_error or "").startswith("timeout")

    wait_until(timed_out, timeout_s=WAIT_S, interval_s=0.1, what="an attempt to time out on the stuck receiver")
    assert not release.is_set()
    release.set()
    wait_until(lambda: {w.status for w in client.status(run_id, ctx=ctx).webhooks} == {"delivered"},
               timeout_s=WAIT_S, interval_s=0.1, what="the deliveries once the receiver answers")
    view = client.status(run_id, ctx=ctx).webhooks
    assert [w.event_kind for w in view] == ["run_suspended", "run_completed"]
    assert view[0].attempts >= 2  # the first attempt timed out and was retried

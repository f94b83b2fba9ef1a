"""Token deltas end to end: a scripted model streaming through a real worker, Redis
pub/sub and the real API (SSE), ``client.events(..., deltas=True)`` and ``aidawork
watch``; a reconnect with Last-Event-ID gets the durable tail only; a worker killed
mid-stream leaves a ``model_stream_restarted`` before the redone call's deltas; no delta
reaches PostgreSQL.

Each run first waits for an approval (round 0), so a test knows its reader is
subscribed (it has seen the durable ``tool_suspended``) before the streaming round
starts: no timing decides what a reader can see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.api import A, ApiServer, event_seqs, sse
from tests.support.cluster import Cluster, events, wait_exit, wait_ready
from tests.support.db import rows
from tests.support.env import BROKER_URL, REPO, WAIT_S
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until
from worker import client
from worker.ops.deltas import RunDelta

CONTENT = "Streaming works: these words arrive one by one, then the durable answer."


def script(latency_ms: int = 600) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "echo", "args": {"text": "ok?"}}]},  # waits for an approval
        {"content": CONTENT, "latency_ms": latency_ms},
    ]


def request(latency_ms: int = 600, owner: str = "team-a") -> dict[str, Any]:
    return scripted_request(script(latency_ms), tools=["echo"], owner=owner, require_approval=["echo"])


class SseReader(threading.Thread):
    """Reads a run's SSE stream in the background into ``events`` ({id, event, data};
    id None for a live delta) until the server ends it."""

    def __init__(self, api: ApiServer, run_id: str) -> None:
        super().__init__(daemon=True)
        self.api, self.run_id = api, run_id
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.api.http.stream("GET", f"/v1/runs/{self.run_id}/events", headers=A) as response:
                assert response.status_code == 200
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line == "":
                        if fields:
                            seq = int(fields["id"]) if "id" in fields else None
                            self.events.append({"id": seq, "event": fields["event"],
                                                "data": json.loads(fields["data"])})
                            fields = {}
                        continue
                    name, _, value = line.partition(": ")
                    assert name not in fields
                    fields[name] = value
        except BaseException as exc:
            self.error = exc

    def wait_for(self, kind: str) -> dict[str, Any]:
        return wait_until(lambda: next((e for e in self.events if e["event"] == kind), None),
                          timeout_s=WAIT_S, what=f"a {kind} event on the stream")

    def finish(self) -> list[dict[str, Any]]:
        self.join(timeout=WAIT_S)
        assert not self.is_alive(), "the stream did not end"
        assert self.error is None, self.error
        return self.events


def responded_index(events: list[dict[str, Any]], boundary_seq: int) -> int:
    (index,) = [i for i, e in enumerate(events)
                if e["event"] == "model_responded" and e["data"]["data"]["boundary_seq"] == boundary_seq]
    return index


def assert_no_delta_stored(engine: Any, run_id: Any) -> None:
    kinds = {r["kind"] for r in rows(engine, "SELECT DISTINCT kind FROM run_events WHERE run_id = :id", id=run_id)}
    assert not kinds & {"model_delta", "model_stream_restarted"}, kinds
    stored = rows(engine, "SELECT count(*) AS n FROM run_events WHERE data::text LIKE '%model_delta%'")
    assert stored[0]["n"] == 0


def approve(api: ApiServer, run_id: str) -> None:
    answered = api.http.post(f"/v1/runs/{run_id}/approvals", headers=A,
                             json={"tool_call_id": "call_0_0", "decision": "approve"})
    assert answered.status_code == 200, answered.text


def test_sse_streams_deltas_with_no_id_before_the_rounds_model_responded(
    api: ApiServer, cluster: Cluster, ctx
) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    created = api.http.post("/v1/runs", json=without_owner(request()), headers=A)
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    reader = SseReader(api, run_id)
    reader.start()
    reader.wait_for("tool_suspended")
    approve(api, run_id)
    events = reader.finish()

    deltas = [e for e in events if e["event"] == "model_delta"]
    durable = [e for e in events if e["id"] is not None]
    assert deltas and all(e["id"] is None and set(e["data"]) == {"round", "delta"} for e in deltas)
    assert {e["data"]["round"] for e in deltas} == {1}
    assert "".join(e["data"]["delta"] for e in deltas) == CONTENT
    assert max(i for i, e in enumerate(events) if e["id"] is None) < responded_index(events, 1)
    assert not [e for e in events if e["event"] == "model_stream_restarted"]  # a first attempt
    # The durable events are exactly as without deltas: gapless, the stored sequence.
    assert [e["id"] for e in durable] == event_seqs(ctx.engine, run_id)
    assert durable[-1]["event"] == "run_completed" and durable[-1]["data"]["data"]["output"] == CONTENT

    # A reconnect resumes the durable sequence only: deltas are live, never replayed.
    after = durable[1]["id"]
    tail = sse(api, run_id, A, last_event_id=after, deltas=True)
    assert [e["id"] for e in tail] == [s for s in event_seqs(ctx.engine, run_id) if s > after]
    assert_no_delta_stored(ctx.engine, run_id)


def test_client_events_and_aidawork_watch_show_the_streamed_text(
    cluster: Cluster, ctx, db_url: str, tmp_path: Path
) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    run_id = client.submit(request(owner="team-test"), ctx=ctx).run_id

    seen: list[Any] = []
    follower = threading.Thread(target=lambda: seen.extend(client.events(run_id, deltas=True, ctx=ctx)),
                                daemon=True)
    follower.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    env.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL})
    out_path = tmp_path / "watch.out"
    with out_path.open("wb") as out:
        watch = subprocess.Popen([sys.executable, "-m", "worker.cli", "watch", str(run_id)], cwd=REPO, env=env,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: any(getattr(e, "kind", None) == "tool_suspended" for e in seen),
                   timeout_s=WAIT_S, what="client.events to yield tool_suspended")
        wait_until(lambda: "tool_suspended" in out_path.read_text(), timeout_s=WAIT_S,
                   what="aidawork watch to print tool_suspended")
        client.approve(run_id, "call_0_0", ctx=ctx)
        follower.join(timeout=WAIT_S)
        assert watch.wait(timeout=WAIT_S) == 0
    finally:
        if watch.poll() is None:
            watch.kill()

    deltas = [e for e in seen if isinstance(e, RunDelta)]
    assert "".join(d.delta for d in deltas) == CONTENT and {d.round for d in deltas} == {1}
    responded = next(i for i, e in enumerate(seen)
                     if not isinstance(e, RunDelta) and e.kind == "model_responded" and e.data["boundary_seq"] == 1)
    assert max(i for i, e in enumerate(seen) if isinstance(e, RunDelta)) < responded
    assert [e.seq for e in seen if not isinstance(e, RunDelta)] == event_seqs(ctx.engine, str(run_id))

    printed = out_path.read_text()
    assert f"  round 1 streams: {CONTENT}\n" in printed, printed
    assert printed.index("streams:") < printed.index("model_responded  round 1")
    assert_no_delta_stored(ctx.engine, run_id)


def test_a_worker_killed_mid_stream_restarts_the_rounds_stream(api: ApiServer, cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    cluster.start_beat()  # its reconciler gives the dead worker's round to w2
    wait_ready(cluster, "w1")
    created = api.http.post("/v1/runs", json=without_owner(request(latency_ms=6000)), headers=A)
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    reader = SseReader(api, run_id)
    reader.start()
    reader.wait_for("tool_suspended")
    approve(api, run_id)
    reader.wait_for("model_delta")  # w1 is inside the model call, sleeping before its next word
    cluster.kill("w1")
    cluster.start_worker("w2")
    events = reader.finish()

    kinds = [e["event"] for e in events]
    restart = kinds.index("model_stream_restarted")
    before, after = events[:restart], events[restart + 1:responded_index(events, 1)]
    assert events[restart]["id"] is None and events[restart]["data"] == {"round": 1}
    killed = [e["data"]["delta"] for e in before if e["event"] == "model_delta"]
    assert killed and CONTENT.startswith("".join(killed)) and "".join(killed) != CONTENT
    # The redone round called the model again (its call never returned, so there was no
    # recorded response to go on from) and streamed the whole content once more.
    assert all(e["event"] == "model_delta" for e in after)
    assert "".join(e["data"]["delta"] for e in after) == CONTENT
    assert kinds.count("model_stream_restarted") == 1
    assert [e["id"] for e in events if e["id"] is not None] == event_seqs(ctx.engine, run_id)
    assert events[-1]["event"] == "run_completed" and events[-1]["data"]["data"]["output"] == CONTENT
    calls = rows(ctx.engine, "SELECT status FROM model_calls WHERE run_id = :id AND boundary_seq = 1 "
                 "ORDER BY id", id=run_id)
    assert [c["status"] for c in calls][-1] == "succeeded" and len(calls) == 2, calls
    assert_no_delta_stored(ctx.engine, run_id)


def test_a_round_redone_from_its_recorded_response_streams_nothing_again(cluster: Cluster, ctx) -> None:
    """The holder dies right after its model call returned (failpoint after_model_call):
    the round's next holder goes on from the recorded response without calling the
    model, so the redone attempt publishes no delta and no restart notice; the durable
    model_responded has the text."""
    run_id = client.submit(scripted_request([{"content": CONTENT, "latency_ms": 300}]), ctx=ctx).run_id
    seen: list[Any] = []
    follower = threading.Thread(target=lambda: seen.extend(client.events(run_id, deltas=True, ctx=ctx)),
                                daemon=True)
    follower.start()
    wait_until(lambda: seen, timeout_s=WAIT_S, what="client.events to yield run_queued")  # subscribed
    cluster.start_worker("w1", env={"AIDAWORK_FAILPOINTS": "after_model_call"})
    cluster.start_beat()
    assert wait_exit(cluster, "w1") == 86  # died with the response recorded, before the commit
    cluster.start_worker("w2")
    follower.join(timeout=WAIT_S)
    assert not follower.is_alive()

    deltas = [e for e in seen if isinstance(e, RunDelta)]
    assert "".join(d.delta for d in deltas) == CONTENT and {d.attempt for d in deltas} == {1}  # w1's only
    assert not [d for d in deltas if d.restarted]
    assert events(cluster, "w2", "model_response_reused", run_id=str(run_id))
    assert seen[-1].kind == "run_completed" and seen[-1].data["output"] == CONTENT
    assert_no_delta_stored(ctx.engine, run_id)

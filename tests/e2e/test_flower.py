"""Flower (``aidawork flower``) on the same broker sees the real workers (by their stable
node names) and every round task, and a round task's arguments are ids only: no prompt or
input text reaches the broker or Flower. The reconciler's ticks (``aidawork beat``) are no
tasks, so they are absent from Flower's task list. The worker sends task events only once
Flower has turned them on (its ``enable_events`` broadcast). With AIDAWORK_FLOWER_BASIC_AUTH,
Flower refuses requests without the credentials (and never logs them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.cluster import Cluster, node_name, wait_events, wait_ready
from tests.support.db import wait_terminal
from tests.support.env import WAIT_S
from tests.support.flower import running_flower
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

SECRET_INPUT = "input-text-that-must-stay-out-of-task-args-7f3a"
SECRET_PROMPT = "system-prompt-that-must-stay-out-of-task-args-91c2"


ROUND_TASKS = {"aidawork.run_round", "aidawork.resume_round"}


def test_flower_lists_the_worker_and_round_tasks_whose_args_are_ids_only_and_no_reconcile_ticks(
    flower: httpx.Client, cluster: Cluster, ctx
) -> None:
    cluster.start_worker("w1", concurrency=2)
    cluster.start_beat()  # reconciles every 0.5 s (FAST_ENV) while Flower listens
    wait_ready(cluster, "w1")
    node = node_name("w1")
    # Its first pass ran (a flushed broker counts as reset): the ticks are under way.
    wait_events(cluster, "beat", "broker_reset_detected", count=1)

    def worker_listed() -> dict[str, Any] | None:
        workers = flower.get("/api/workers", params={"refresh": "1"})
        assert workers.status_code == 200, workers.text  # FLOWER_UNAUTHENTICATED_API is honoured
        return workers.json().get(node)  # type: ignore[no-any-return]

    info = wait_until(worker_listed, timeout_s=WAIT_S, interval_s=0.5, what=f"Flower to list {node}")
    assert info["stats"]["pool"]["max-concurrency"] == 2

    def worker_alive_in_events() -> bool:  # Flower's event consumer hears this worker
        return flower.get("/api/workers", params={"status": "1"}).json().get(node) is True

    wait_until(worker_alive_in_events, timeout_s=WAIT_S, interval_s=0.2, what="Flower to receive the worker's events")
    # Task events are off in a worker until a monitor asks (worker.ops.celery_app): Flower's
    # enable_events broadcast (every 5 s) turns them on, as Celery's log line says.
    wait_events(cluster, "w1", "Events of group {task} enabled by remote.", count=1)

    request = scripted_request(
        [{"tool_calls": [{"name": "echo", "args": {"said": SECRET_INPUT}}]}, {"content": "ok"}],
        text_input=SECRET_INPUT,
    )
    request["config"]["system_prompt"] = SECRET_PROMPT
    run_id = client.submit(request, ctx=ctx).run_id
    assert wait_terminal(ctx.engine, run_id)["status"] == "completed"

    def round_tasks() -> list[dict[str, Any]] | None:
        tasks = flower.get("/api/tasks", params={"taskname": "aidawork.run_round"}).json()
        ours = [t for t in tasks.values() if str(run_id) in str(t.get("args"))]
        done = [t for t in ours if t.get("state") == "SUCCESS"]
        return ours if len(done) == 2 else None  # one task per round: boundaries 0 and 1

    tasks = wait_until(round_tasks, timeout_s=WAIT_S, interval_s=0.25, what="Flower to show both round tasks")
    assert {t["name"] for t in tasks} == {"aidawork.run_round"}
    assert sorted(t["args"] for t in tasks) == [f"['{run_id}', 0]", f"['{run_id}', 1]"]
    # Round 1 was sent by round 0's task (worker.ops.celery_app.Dispatcher._send): Flower links them.
    first, second = sorted(tasks, key=lambda t: str(t["args"]))
    assert (second["parent_id"], second["root_id"]) == (first["uuid"], first["uuid"]), tasks
    for task in tasks:
        assert task["kwargs"] in ("{}", {}, None), task
        assert task["worker"] == node
        shown = f"{task['args']} {task['kwargs']}"
        assert SECRET_INPUT not in shown and SECRET_PROMPT not in shown and "echo" not in shown

    # Seconds of reconcile ticks later, Flower's whole task list is rounds only.
    listed = flower.get("/api/tasks").json()
    assert {t["name"] for t in listed.values()} <= ROUND_TASKS, listed
    assert len(listed) == 2


def test_flower_with_basic_auth_refuses_requests_without_the_credentials(db_url: str, redis_clean: None,
                                                                         tmp_path: Path) -> None:
    password = "flower-password-" + "5e1d" * 4
    log_path = tmp_path / "flower.log"
    with running_flower(db_url, log_path, {"AIDAWORK_FLOWER_BASIC_AUTH": f"ops:{password}"}) as http:
        assert http.get("/api/workers").status_code == 401
        assert http.get("/", auth=("ops", "wrong")).status_code == 401
        assert http.get("/api/workers", auth=("ops", password)).status_code == 200
        assert http.get("/healthcheck").status_code == 200  # compose's probe needs no credentials
    logged = log_path.read_text()
    assert '"basic_auth": true' in logged and password not in logged

"""Every line every process writes is one JSON object, from its first line on: a worker
(Celery's own lines, a Python warning, the shutdown notice), beat, the API (uvicorn's
lines), the Flower launcher (Tornado's and Flower's lines) and migrate (Alembic's lines).
The fixtures check the same for every e2e test at teardown; this test also proves the
startup lines are there, so the check is not passing on empty logs. The worker answers
docker-compose.yml's healthcheck command under its default node name."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.api import ADD, A, ApiServer, sse
from tests.support.cluster import Cluster, cli, non_json_lines, wait_events, wait_exit
from tests.support.env import BROKER_URL, REPO, WAIT_S
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until
from worker.engine.processes import GC_THRESHOLDS

PLUGINS = REPO / "tests" / "support" / "plugins"
VENV_BIN = Path(sys.executable).parent
WORKER_CONCURRENCY = 6


def lines_of(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(errors="replace")
    assert text.strip(), f"{path.name} is empty"
    assert non_json_lines(text) == [], f"{path.name}: {non_json_lines(text)[:3]}"
    return [json.loads(line) for line in text.splitlines()]


def has(lines: list[dict[str, Any]], logger: str, text: str) -> bool:
    return any(str(e.get("logger", "")).startswith(logger) and text in str(e.get("event")) for e in lines)


def compose_worker_healthcheck() -> str:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    kind, command = services["worker"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    return str(command).replace("$$", "$")  # compose's escape: the shell expands ${HOSTNAME}


def test_every_process_writes_only_json_lines_including_its_startup_lines(
    cluster: Cluster, api: ApiServer, flower: httpx.Client, db_url: str, tmp_path: Path
) -> None:
    # The default node name (aidawork@%h), and a plugin that warns when imported.
    env = {"AIDAWORK_WORKER_NAME": "aidawork@%h", "AIDAWORK_PLUGINS": "warning_plugin", "PYTHONPATH": str(PLUGINS)}
    cluster.start_worker("w1", env=env, concurrency=WORKER_CONCURRENCY)
    cluster.start_beat()
    probe_env = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "HOSTNAME": socket.gethostname(),
                 "AIDAWORK_BROKER_URL": BROKER_URL}
    probe = compose_worker_healthcheck()

    def healthy() -> bool:
        done = subprocess.run(["sh", "-c", probe], cwd=REPO, env=probe_env, capture_output=True, timeout=60)
        return done.returncode == 0

    wait_until(healthy, timeout_s=WAIT_S, interval_s=0.5, what="the worker to pass the compose healthcheck")

    created = api.http.post("/v1/runs", json=without_owner(scripted_request(ADD)), headers=A)
    assert created.status_code == 201, created.text
    assert sse(api, created.json()["run_id"], A)[-1]["event"] == "run_completed"
    migrated = cli(db_url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    wait_events(cluster, "beat", "broker_reset_detected", count=1)  # its first pass
    cluster.signal("w1", signal.SIGTERM)
    assert wait_exit(cluster, "w1") == 0

    worker = lines_of(tmp_path / "w1.log")
    node = f"aidawork@{socket.gethostname()}"
    assert any(e["event"] == "worker_started" and e["node"] == node for e in worker)
    assert has(worker, "celery.apps.worker", f"{node} ready.")
    # Its garbage collector set for many rounds at once once it was ready (worker.engine.processes).
    tuned = [e for e in worker if e["event"] == "gc_tuned"]
    assert len(tuned) == 1 and tuned[0]["thresholds"] == list(GC_THRESHOLDS), tuned
    assert tuned[0]["frozen_objects"] > 10_000, tuned
    # Every thread of its pool started before its first round, not one per task found none idle.
    pool = [e for e in worker if e["event"] == "pool_threads_started"]
    assert len(pool) == 1 and pool[0]["threads"] == WORKER_CONCURRENCY, pool
    assert has(worker, "py.warnings", "warning_plugin: this backend is deprecated")
    assert has(worker, "celery.apps.worker", "Warm shutdown")
    assert any(e["event"] == "round_committed" for e in worker)

    beat = [e["event"] for e in lines_of(tmp_path / "beat.log")]
    assert beat.index("beat_started") < beat.index("broker_reset_detected")

    served = lines_of(api.log_path)
    assert has(served, "uvicorn.error", "Uvicorn running on")
    assert any(e["event"] == "request_served" and e.get("status") == 201 for e in served)

    shown = lines_of(tmp_path / "flower.log")
    assert any(e["event"] == "flower_started" for e in shown)
    assert has(shown, "flower", "Visit me at")

    out = migrated.stdout + migrated.stderr
    assert non_json_lines(out) == [], out
    migrate = [json.loads(line) for line in out.splitlines()]
    assert any(e["event"] == "database_migrated" for e in migrate)
    assert has(migrate, "alembic", "Context impl")

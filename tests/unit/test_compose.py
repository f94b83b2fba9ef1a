"""docker-compose.yml runs the same `aidawork` commands the tests and the demo run, with
restart policies and healthchecks, Flower behind basic auth on loopback, and migrate
needing only the database."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.cli.main import parse
from worker.ops.settings import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
LONG_RUNNING = ("postgres", "redis", "worker", "beat", "flower", "api")
ENV = {"AIDAWORK_SECRET_KEY": "compose-check", "AIDAWORK_FLOWER_BASIC_AUTH": "ops:compose-check"}


def services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]  # type: ignore[no-any-return]


def healthcheck(service: dict[str, Any]) -> str:
    return " ".join(service["healthcheck"]["test"])


def test_every_compose_service_runs_a_valid_aidawork_command() -> None:
    ours = {name: s for name, s in services().items() if "command" in s and s.get("image") == "aidawork:latest"}
    assert set(ours) == {"migrate", "worker", "beat", "flower", "api", "webhooks"}
    for name, service in ours.items():
        assert parse(service["command"]).name == name


def test_services_restart_and_report_their_health() -> None:
    found = services()
    for name in LONG_RUNNING:
        assert found[name]["restart"] == "unless-stopped", name
    assert found["migrate"]["restart"] == "on-failure"  # one-shot: retried, never restarted once done
    assert healthcheck(found["postgres"]).startswith("CMD pg_isready")
    assert healthcheck(found["redis"]) == "CMD redis-cli ping"
    assert "http://127.0.0.1:8080/healthz" in healthcheck(found["api"])
    assert "http://127.0.0.1:5555/healthcheck" in healthcheck(found["flower"])
    # The worker's probe pings its own node: the default AIDAWORK_WORKER_NAME on the
    # container's hostname (tests/e2e/test_logs.py runs this command against a worker).
    assert "AIDAWORK_WORKER_NAME" not in found["worker"]["environment"]
    assert Settings().worker_name == "aidawork@%h"
    assert "inspect ping --destination aidawork@$${HOSTNAME}" in healthcheck(found["worker"])


def test_flower_needs_credentials_and_is_published_on_loopback_only() -> None:
    flower = services()["flower"]
    assert flower["environment"]["AIDAWORK_FLOWER_BASIC_AUTH"].startswith("${AIDAWORK_FLOWER_BASIC_AUTH:?")
    assert flower["ports"] == ["127.0.0.1:5555:5555"]


def test_migrate_needs_only_the_database() -> None:
    migrate = services()["migrate"]
    assert set(migrate["depends_on"]) == {"postgres"}
    assert set(migrate["environment"]) == {"AIDAWORK_DATABASE_URL", "AIDAWORK_LOG_LEVEL"}


def _compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        message = "docker-compose is not installed (Debian package docker-compose; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def test_compose_file_is_valid_for_docker_compose() -> None:
    result = _compose_config(ENV)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    assert resolved["flower"]["environment"]["AIDAWORK_FLOWER_BASIC_AUTH"] == "ops:compose-check"
    assert "redis" not in resolved["migrate"]["depends_on"]
    assert resolved["worker"]["healthcheck"]["test"][-1].endswith("--destination aidawork@$${HOSTNAME} --timeout 5")


def test_compose_refuses_to_start_flower_without_credentials() -> None:
    result = _compose_config({"AIDAWORK_SECRET_KEY": "compose-check"})
    assert result.returncode != 0
    assert "AIDAWORK_FLOWER_BASIC_AUTH" in result.stderr

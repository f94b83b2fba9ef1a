"""docker-compose.yml runs the same `aidawork` commands the tests and the demo run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from worker.cli import build_parser

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_every_compose_service_runs_a_valid_aidawork_command() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    ours = {name: s for name, s in services.items() if "command" in s and s.get("image") == "aidawork:latest"}
    assert set(ours) == {"migrate", "worker", "beat", "flower", "api", "webhooks"}
    for name, service in ours.items():
        args = build_parser().parse_args(service["command"])
        assert args.command == name


def test_compose_file_is_valid_for_docker_compose() -> None:
    if shutil.which("docker-compose") is None:
        message = "docker-compose is not installed (Debian package docker-compose; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        env={"AIDAWORK_SECRET_KEY": "compose-check", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr

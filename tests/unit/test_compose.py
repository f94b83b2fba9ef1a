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
HA_DATA = (
    "redis-master",
    "redis-replica",
    "redis-sentinel-1",
    "redis-sentinel-2",
    "redis-sentinel-3",
    "pg-primary",
    "pg-replica",
)
HA_APP = ("ha-worker", "ha-beat", "ha-flower", "ha-api", "ha-webhooks")
SENTINEL_URL = "sentinel://redis-sentinel-1:26379;sentinel://redis-sentinel-2:26379;sentinel://redis-sentinel-3:26379"
MULTI_HOST = "@/aidawork?host=pg-primary:5432&host=pg-replica:5432&target_session_attrs=read-write"
ENV = {"AIDAWORK_SECRET_KEY": "compose-check", "AIDAWORK_FLOWER_BASIC_AUTH": "ops:compose-check"}


def services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]  # type: ignore[no-any-return]


def healthcheck(service: dict[str, Any]) -> str:
    return " ".join(service["healthcheck"]["test"])


def test_every_compose_service_runs_a_valid_aidawork_command() -> None:
    ours = {
        name: s
        for name, s in services().items()
        if "command" in s and s.get("image") == "aidawork:latest" and "ha" not in s.get("profiles", [])
    }
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


def test_ha_profile_adds_a_second_stack_and_leaves_the_default_one_alone() -> None:
    found = services()
    ha = {name for name, s in found.items() if "ha" in s.get("profiles", [])}
    assert ha == {*HA_DATA, *HA_APP, "ha-migrate"}
    for name in LONG_RUNNING:
        assert "profiles" not in found[name], name


def test_ha_services_restart_and_report_their_health() -> None:
    found = services()
    for name in (*HA_DATA, *HA_APP):
        assert found[name]["restart"] == "unless-stopped", name
    assert found["ha-migrate"]["restart"] == "on-failure"
    for name in HA_DATA:
        assert "test" in found[name]["healthcheck"], name
    assert healthcheck(found["pg-primary"]).startswith("CMD pg_isready")
    assert healthcheck(found["pg-replica"]).startswith("CMD pg_isready")
    assert "sentinel get-master-addr-by-name aidawork" in healthcheck(found["redis-sentinel-1"])
    assert "http://127.0.0.1:8080/healthz" in healthcheck(found["ha-api"])
    assert "inspect ping --destination aidawork@$${HOSTNAME}" in healthcheck(found["ha-worker"])


def test_ha_replicas_follow_their_primaries() -> None:
    found = services()
    assert found["redis-replica"]["command"][1:4] == ["--replicaof", "redis-master", "6379"]
    sentinel = found["redis-sentinel-1"]["command"][-1]
    assert "sentinel monitor aidawork redis-master 6379 2" in sentinel
    replica = found["pg-replica"]["command"][-1]
    assert "pg_basebackup -h pg-primary" in replica and " -S replica_1 -R " in replica
    assert "pg_create_physical_replication_slot('replica_1')" in found["pg-primary"]["command"][-1]


def test_ha_processes_reach_redis_through_sentinel_and_postgres_through_every_host() -> None:
    found = services()
    for name in (*HA_APP, "ha-migrate"):
        assert parse(found[name]["command"]).name == name.removeprefix("ha-")
    for name in HA_APP:
        env = found[name]["environment"]
        assert env["AIDAWORK_BROKER_URL"] == SENTINEL_URL, name
        assert env["AIDAWORK_SENTINEL_MASTER"] == "aidawork", name
        assert env["AIDAWORK_DATABASE_URL"].endswith(MULTI_HOST), name
        needs = {"redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3", "ha-migrate"}
        assert needs <= set(found[name]["depends_on"]), name
    assert found["ha-migrate"]["environment"]["AIDAWORK_DATABASE_URL"].endswith(MULTI_HOST)
    # The worker's warm shutdown has time to finish the rounds it holds.
    assert found["ha-worker"]["stop_grace_period"] == "300s"


def _compose_config(env: dict[str, str], *profiles: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        message = "docker-compose is not installed (Debian package docker-compose; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), *(f"--profile={p}" for p in profiles), "config"],
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


def test_compose_file_with_the_ha_profile_is_valid_for_docker_compose() -> None:
    result = _compose_config(ENV, "ha")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    assert {*HA_DATA, *HA_APP, "ha-migrate"} <= set(resolved)
    for name in HA_DATA:
        assert resolved[name]["restart"] == "unless-stopped", name
        assert resolved[name]["healthcheck"]["test"], name
    # The shells' variables ($PGDATA, $POSTGRES_USER) are escaped ($$): compose leaves them
    # to the shell instead of warning that they are unset and blanking them.
    assert "variable is not set" not in result.stderr
    assert '"$$PGDATA/PG_VERSION"' in resolved["pg-replica"]["command"][-1]
    assert resolved["ha-flower"]["environment"]["AIDAWORK_FLOWER_BASIC_AUTH"] == "ops:compose-check"

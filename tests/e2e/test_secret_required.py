"""``aidawork worker``, ``beat`` and ``api`` refuse to start without AIDAWORK_SECRET_KEY
(every deployment would otherwise sign round proofs with the same public development
secret), unless AIDAWORK_DEV=1; with the secret or in development they start and work."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support.cluster import Cluster, wait_ready
from tests.support.env import BROKER_URL, REPO, process_environ
from tests.support.requests import scripted_request
from worker import client


def _bare_env(db_url: str) -> dict[str, str]:
    env = process_environ()
    env.update(
        {
            "AIDAWORK_DATABASE_URL": db_url,
            "AIDAWORK_BROKER_URL": BROKER_URL,
            "AIDAWORK_API_TOKENS": json.dumps({"t" * 24: "team-a"}),
        }
    )
    return env


@pytest.mark.parametrize("command", [["worker"], ["beat"], ["api", "--port", "1"]])
def test_a_signing_process_refuses_to_start_without_the_secret(db_url: str, command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *command],
        cwd=REPO,
        env=_bare_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2
    assert "AIDAWORK_SECRET_KEY is not set" in done.stderr and "AIDAWORK_DEV=1" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_worker_with_a_secret_and_one_in_development_both_run_rounds(cluster: Cluster, ctx: Any) -> None:
    cluster.start_worker("with_secret", env={"AIDAWORK_DEV": "0", "AIDAWORK_SECRET_KEY": "k" * 32})
    wait_ready(cluster, "with_secret")
    signed = client.submit(scripted_request([{"content": "signed"}]), ctx=ctx)
    assert client.wait(signed.run_id, ctx=ctx, timeout_s=60).status == "completed"
    assert not any(line.get("event") == "secret_key_missing" for line in cluster.logs("with_secret"))
    cluster.kill("with_secret")

    cluster.start_worker("dev")  # the cluster's environment has AIDAWORK_DEV=1 and no secret
    wait_ready(cluster, "dev")
    dev = client.submit(scripted_request([{"content": "dev"}]), ctx=ctx)
    assert client.wait(dev.run_id, ctx=ctx, timeout_s=60).status == "completed"
    assert any(line.get("event") == "secret_key_missing" for line in cluster.logs("dev"))

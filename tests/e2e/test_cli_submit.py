from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from uuid import UUID

from tests.support.db import rows
from tests.support.env import BROKER_URL, REPO
from tests.support.requests import scripted_request

ADD = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "3"}]


def _with(request: dict, path: list, value: object) -> dict:
    """A copy of the request with the value at ``path`` replaced (or deleted, for ``...``)."""
    out = json.loads(json.dumps(request))
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


VALID = scripted_request(ADD, tools=["add", "echo"])
# name -> (file body, text stderr must contain)
BAD_REQUESTS = {
    "unknown_tool": (
        json.dumps(_with(VALID, ["config", "tools"], ["add", "teleport"])),
        "config.tools[1]: unknown tool 'teleport'",
    ),
    "wrong_arg_type": (
        json.dumps(_with(VALID, ["config", "model", "turns", 0, "tool_calls", 0, "args", "a"], "two")),
        "config.model.turns[0].tool_calls[0].args.a",
    ),
    "malformed_json": (json.dumps(VALID)[:-2] + ",", "the request is not valid JSON"),
    "unknown_provider": (
        json.dumps(_with(VALID, ["config", "model", "provider"], "oracle")),
        "config.model.provider",
    ),
    "missing_input": (json.dumps(_with(VALID, ["input"], ...)), "invalid request: input: Field required"),
}


def _submit(path: Path, db_url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    env.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL})
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "submit", str(path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_submit_refuses_bad_requests_naming_the_field_and_stores_nothing(
    engine, db_url: str, redis_clean: None, tmp_path: Path
) -> None:
    # All at once: each is a fresh interpreter, and they do not depend on each other.
    procs = {}
    for name, (body, _) in BAD_REQUESTS.items():
        path = tmp_path / f"{name}.json"
        path.write_text(body)
        procs[name] = _submit(path, db_url)
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        results[name] = (proc.returncode, out, err)

    for name, (code, out, err) in results.items():
        expected = BAD_REQUESTS[name][1]
        assert code == 2, f"{name}: exit {code}, stderr {err!r}"
        assert expected in err, f"{name}: {err!r} does not name {expected!r}"
        assert err.startswith("aidawork: error: "), f"{name}: {err!r}"
        assert out == "", f"{name}: printed {out!r}"
    assert rows(engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0
    assert rows(engine, "SELECT count(*) AS n FROM roots")[0]["n"] == 0

    # The valid request is stored and its run id printed.
    path = tmp_path / "valid.json"
    path.write_text(json.dumps(VALID))
    proc = _submit(path, db_url)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    run_id = UUID(out.strip())
    stored = rows(engine, "SELECT id, status, input FROM runs")
    assert stored == [{"id": run_id, "status": "queued", "input": "go"}]
    assert rows(engine, "SELECT count(*) AS n FROM roots")[0]["n"] == 1

"""make demo: migrate, start two workers and beat, submit scripted runs, and show them
finishing round by round; then stop the workers. Exits non-zero if a run ends
differently than expected."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
os.environ.setdefault("AIDAWORK_LOG_LEVEL", "WARNING")
# Workers, beat and the API refuse to start without a secret; the demo makes its own.
os.environ.setdefault("AIDAWORK_SECRET_KEY", secrets.token_urlsafe(32))
# A provider key that belongs to team-b only (never called: the demo's runs are scripted).
# An MCP server nobody here wrote (mcp-server-time, over stdio): its tools appear as mcp__time__*.
os.environ.setdefault("AIDAWORK_MCP_SERVERS", json.dumps({"time": {"command": sys.executable,
                                                                   "args": ["-m", "mcp_server_time"]}}))
os.environ.setdefault("AIDAWORK_MODEL_KEYS", json.dumps({"team-b": {"key": "sk-demo-" + secrets.token_hex(8),
                                                                    "owners": ["team-b"]}}))
sys.path.insert(0, str(REPO))

from runtime.errors import RequestInvalid  # noqa: E402
from schema.store.audit import audit  # noqa: E402
from schema.wire import TERMINAL_EVENTS, RunEvent  # noqa: E402
from worker import client  # noqa: E402
from worker.cli.audit import describe  # noqa: E402
from worker.cli.run_view import format_event  # noqa: E402
from worker.client.context import get_client_context  # noqa: E402


def say(line: str) -> None:
    print(line, flush=True)


def aidawork(*args: str, log: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = log.open("ab") if log else None
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
        stdout=out,
        stderr=subprocess.STDOUT if out else None,
        start_new_session=True,
    )


def follow_all(
    runs: dict[str, Any],
    timeout_s: float = 120,
    *,
    stop_at_suspension: bool = False,
    after: dict[str, int] | None = None,
) -> None:
    """Print the events of all runs as they are committed, merged by time."""
    seen = {label: (after or {}).get(label, 0) for label in runs}
    open_runs = set(runs)
    deadline = time.monotonic() + timeout_s
    while open_runs and time.monotonic() < deadline:
        batch: list[tuple[str, RunEvent]] = []
        for label in list(open_runs):
            for event in client.events(runs[label], after_seq=seen[label], follow=False):
                batch.append((label, event))
                seen[label] = event.seq
                if event.kind in TERMINAL_EVENTS or (stop_at_suspension and event.kind == "run_suspended"):
                    open_runs.discard(label)
        for label, event in sorted(batch, key=lambda item: item[1].created_at):
            say(f"  [{label:<10}] {format_event(event)}")
        time.sleep(0.05)


# A second turn in the same conversation: it starts only after the first run ended,
# and its model sees the first run's messages.
FOLLOW_UP: dict[str, Any] = {
    "owner": "team-a",
    "input": "And now 4 + 5?",
    "config": {
        "model": {
            "provider": "scripted",
            "turns": [{"tool_calls": [{"name": "add", "args": {"a": 4, "b": 5}}]}, {"content": "9"}],
        },
        "tools": ["add"],
    },
}


# The files on "the user's machine" that the local-read run asks for.
USER_FILES = {
    "notes.txt": "Ship it on Friday.\nRemember the migration.\n",
    "diary.txt": "Dear diary, today the workers crashed twice and nothing was lost.\n",
}


def load(name: str, **changes: Any) -> dict[str, Any]:
    request: dict[str, Any] = json.loads((HERE / name).read_text())
    request.update(changes)
    return request


def main() -> int:
    say("== migrate")
    if subprocess.run([sys.executable, "-m", "worker.cli", "migrate"], cwd=REPO).returncode != 0:
        return 1
    logs = Path(tempfile.mkdtemp(prefix="aidawork-demo-"))
    say(f"== start two workers and beat (logs in {logs})")
    # Distinct node names (Flower) and, for the first, a /metrics endpoint (see the end).
    envs = [{"AIDAWORK_WORKER_NAME": "demo1@%h", "AIDAWORK_METRICS_PORT": str(METRICS_PORT)},
            {"AIDAWORK_WORKER_NAME": "demo2@%h"}]
    procs = [aidawork("worker", "--concurrency", "8", log=logs / f"worker{i}.log", env=envs[i - 1]) for i in (1, 2)]
    procs.append(aidawork("beat", log=logs / "beat.log"))
    try:
        return run_demo()
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        say("== workers stopped")


API_PORT = int(os.environ.get("AIDAWORK_DEMO_API_PORT", "8089"))
METRICS_PORT = int(os.environ.get("AIDAWORK_DEMO_METRICS_PORT", "9189"))
API_TOKEN = "demo-token-team-a-0123456789"


def stream_over_http(runs: dict[str, Any]) -> None:
    """Start the HTTP API, submit a run over it and print its server-sent events."""
    import httpx

    say(f"== the HTTP API: submit over HTTP and stream the run's events (http://127.0.0.1:{API_PORT})")
    env = dict(os.environ, AIDAWORK_API_TOKENS=json.dumps({API_TOKEN: "team-a"}))
    api = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "api", "--port", str(API_PORT)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    base = f"http://127.0.0.1:{API_PORT}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                say("   !! the API did not start")
                return
            time.sleep(0.1)
        body = load("research.json")
        del body["owner"]  # the token says who we are
        created = httpx.post(f"{base}/v1/runs", json=body, headers=headers, timeout=10).json()
        run_id = created["run_id"]
        runs["http"] = (UUID(run_id), "completed")
        say(f"   POST /v1/runs -> {run_id}; GET /v1/runs/{run_id}/events:")
        with httpx.stream("GET", f"{base}/v1/runs/{run_id}/events", headers=headers, timeout=60) as stream:
            event_id = ""
            for line in stream.iter_lines():
                if line.startswith("id:"):
                    event_id = line
                elif line.startswith("event:"):
                    say(f"     {event_id}  {line}")
        show_metrics(base)
        say(f"   the run inspector: {base}/ui (sign in with the token {API_TOKEN!r})")
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=15)


def show_metrics(api: str) -> None:
    """A few of the Prometheus figures: the first worker's rounds, the API's runs."""
    import httpx

    wanted = ("aidawork_rounds_total{", "aidawork_model_calls_total{", "aidawork_runs{")
    for where, url in (("worker 1", f"http://127.0.0.1:{METRICS_PORT}/metrics"), ("API", f"{api}/metrics")):
        try:
            text = httpx.get(url, timeout=5).text
        except httpx.TransportError as exc:
            say(f"   !! {where} /metrics: {type(exc).__name__}")
            continue
        lines = [line for line in text.splitlines() if line.startswith(wanted) and not line.endswith(" 0.0")]
        say(f"   {where} {url}: " + "; ".join(lines))


def wait_for(run_id: UUID, status: str, timeout_s: float = 60) -> Any:
    view = client.status(run_id)
    deadline = time.monotonic() + timeout_s
    while view.status != status and time.monotonic() < deadline:
        time.sleep(0.05)
        view = client.status(run_id)
    return view


def own_agent(runs: dict[str, Any]) -> None:
    """Plugin tools, an MCP server's tool, a client-side tool and an approval, in one run."""
    say("== bring your own agent: a plugin tool and an MCP tool, then a client tool and an approval")
    refunds = Path(tempfile.mkdtemp(prefix="aidawork-demo-")) / "refunds.txt"
    request = json.loads((HERE / "own_agent.json").read_text().replace("REFUNDS_FILE", str(refunds)))
    run_id = client.submit(request).run_id
    runs["own-agent"] = (run_id, "completed")
    seen = 0
    for _ in range(2):
        view = wait_for(run_id, "suspended")
        events = list(client.events(run_id, after_seq=seen, follow=False))
        for event in events:
            say(f"  [own-agent ] {format_event(event)}")
        seen = events[-1].seq if events else seen
        for wait in view.waiting_for:
            if wait.kind == "client_tool":
                say(f"   the customer is asked {wait.args}; the upstream service sends the answer back")
                client.tool_result(run_id, wait.tool_call_id, {"answer": "yes please"})
            elif wait.kind == "approval":
                say(f"   a person approves {wait.tool_name} {wait.args}")
                client.approve(run_id, wait.tool_call_id)
        wait_for(run_id, "running", timeout_s=5)
    follow_all({"own-agent": run_id}, after={"own-agent": seen})
    say(f"   {refunds.name} now holds {len(refunds.read_text().splitlines())} line(s)")


def run_demo() -> int:
    say("== a request with a wrong argument type is refused before anything is stored")
    try:
        client.submit(load("invalid.json"))
        say("   !! it was accepted")
        return 1
    except RequestInvalid as exc:
        say(f"   refused: {exc.message}")

    say("== keys belong to owners, and model calls go only where the deployment allows")
    model = {"provider": "openai", "name": "gpt-4o-mini"}
    for label, config in (
        ("team-a naming team-b's key", {**model, "api_key_ref": "team-b"}),
        ("team-a naming a key that does not exist", {**model, "api_key_ref": "team-z"}),
        ("a keyless call to an unlisted server",
         {**model, "base_url": "http://169.254.169.254/v1", "api_key_ref": None}),
    ):
        try:
            client.submit({"owner": "team-a", "input": "hi", "config": {"model": config}})
            say(f"   !! {label}: accepted")
            return 1
        except RequestInvalid as exc:
            say(f"   {label}: refused ({exc.field}: {exc.reason})")

    say("== submit four runs; two of them share one conversation Root and run in order")
    first = client.submit(load("add.json"))
    runs = {
        "add": (first.run_id, "completed"),
        "follow-up": (client.submit(FOLLOW_UP | {"root_id": str(first.root_id)}).run_id, "completed"),
        "research": (client.submit(load("research.json")).run_id, "completed"),
        "runaway": (client.submit(load("runaway.json")).run_id, "failed"),
        "repeating": (client.submit(load("repeat.json")).run_id, "failed"),
        "long": (client.submit(load("long_context.json")).run_id, "completed"),
    }
    follow_all({label: run_id for label, (run_id, _) in runs.items()})

    say("== a run that needs files from the user's machine suspends; delivering them resumes it")
    say("   (the original tool calls re-run; the model is not called again for that round)")
    local = client.submit(load("local_read.json")).run_id
    runs["local-read"] = (local, "completed")
    view = client.status(local)
    deadline = time.monotonic() + 60
    while view.status != "suspended" and time.monotonic() < deadline:
        time.sleep(0.05)
        view = client.status(local)
    for wait in view.waiting_for:
        say(f"   waiting: {wait.tool_call_id} ({wait.tool_name}) needs {wait.kind} {wait.paths or wait.key}")
    follow_all({"local-read": local}, stop_at_suspension=True)
    for wait in view.waiting_for:
        files = {path: USER_FILES[path] for path in wait.paths or []}
        receipt = client.deliver(local, wait.tool_call_id, files)
        say(f"   delivered {sorted(files)} for {wait.tool_call_id}" + (": resuming" if receipt.resumes else ""))
    follow_all({"local-read": local}, after={"local-read": 6})

    own_agent(runs)

    stream_over_http(runs)

    say("== final status")
    ok = True
    for label, (run_id, expected) in runs.items():
        view = client.status(run_id)
        say(
            f"   {label:<10} {view.status:<10} rounds={view.rounds} model_calls={view.model_calls} "
            f"rebuilds={view.rebuilds} output={view.output!r} error={view.error_code}"
        )
        ok &= view.status == expected
    say("== nothing lost: each run's boundaries, fences, events and model-call ledger checked (aidawork audit)")
    for label, (run_id, _) in runs.items():
        report = audit(get_client_context().engine, run_id=run_id)
        say(f"   {label:<10} {describe(report)[-1]}")
        ok &= report.clean
    say(f"== try it yourself: aidawork status {runs['research'][0]} --json")
    return 0 if ok else 1


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    say(f"== demo {'finished' if code == 0 else 'FAILED'} in {time.monotonic() - started:.1f}s")
    sys.exit(code)

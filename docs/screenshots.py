"""make docs-screenshots: the documentation's pictures of the run inspector and of Flower,
taken from the real UI by headless Chromium (Debian's /usr/bin/chromium, driven by Playwright).

1. creates a throwaway database (``aidawork_docs_shots_<random>``) and migrates it
   (``aidawork migrate``);
2. starts ``aidawork flower``, ``aidawork worker`` and ``aidawork api`` on free loopback
   ports (AIDAWORK_DEV=1, two API tokens), and waits until Flower hears the worker;
3. submits scripted runs over the HTTP API: one that completes after a tool round, one that
   waits for a client tool's result after a tool round, one that waits for an approval;
4. signs in to the inspector (``/ui``), opens the run waiting for the client tool with its
   first round expanded -> docs/assets/inspector.png; Flower's task list -> docs/assets/flower.png;
5. stops every process and drops the database, also on failure.

Where: SHOTS_PG (a PostgreSQL server URL, default postgresql+psycopg://postgres@127.0.0.1:5432),
SHOTS_BROKER_URL (default redis://127.0.0.1:6379/7; refused while another client uses that
Redis database: its workers would take this stack's tasks). Every address is loopback; the browser
may fetch nothing else. Not a page of the site (mkdocs.yml ``exclude_docs``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "docs" / "assets"
PG = os.environ.get("SHOTS_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
BROKER_URL = os.environ.get("SHOTS_BROKER_URL", "redis://127.0.0.1:6379/7")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}
WORKER_NODE = "worker-1@docs"  # the node name Flower shows (no real host name in the docs)
TOKEN = "docs-token-" + secrets.token_hex(16)  # owner team-a
OTHER_TOKEN = "docs-token-" + secrets.token_hex(16)  # owner team-b
WAIT_S = 90.0
MAX_PNG_BYTES = 300_000

PICK_COLOR = {
    "name": "pick_color",
    "description": "Ask the user to pick a color.",
    "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"],
                   "additionalProperties": False},
}

T = TypeVar("T")


def log(message: str) -> None:
    print(f"[docs-screenshots] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], T | None], what: str, interval_s: float = 0.2) -> T:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval_s)
    raise RuntimeError(f"timed out after {WAIT_S:.0f}s waiting for {what}")


def request(turns: list[dict[str, Any]], text_input: str, tools: list[str], **config: Any) -> dict[str, Any]:
    """A run request for the scripted model (the HTTP API takes the owner from the token)."""
    policy = {"max_rounds": 10, **config.pop("policy", {})}
    return {"input": text_input, "config": {"model": {"provider": "scripted", "turns": turns},
                                            "system_prompt": "You are a careful assistant.", "tools": tools,
                                            "policy": policy, **config}}


# What the pictures show: the run the inspector opens is WAITING_FOR_CLIENT_TOOL.
COMPLETED = request(
    [{"tool_calls": [{"name": "add", "args": {"a": 19, "b": 23}}]}, {"content": "19 + 23 = 42"}],
    "What is 19 + 23?", ["add", "echo"])
WAITING_FOR_CLIENT_TOOL = request(
    [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
     {"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]},
     {"content": "picked red"}],
    "Add 2 and 3, then ask me to pick a warm color for the result.", ["add"], client_tools=[PICK_COLOR])
WAITING_FOR_APPROVAL = request(
    [{"tool_calls": [{"name": "echo", "args": {"announce": "release 1.4 is out"}}]}, {"content": "announced"}],
    "Announce the release.", ["echo"], policy={"require_approval": ["echo"]})


class Stack:
    """The processes of the picture, each in its own session, logging to ``log_dir``."""

    def __init__(self, db_url: str, log_dir: Path) -> None:
        self.db_url = db_url
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api_port = free_port()
        self.flower_port = free_port()

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIDAWORK_", "FLOWER_"))}
        env.update({"AIDAWORK_DATABASE_URL": self.db_url, "AIDAWORK_BROKER_URL": BROKER_URL,
                    "AIDAWORK_DEV": "1", "AIDAWORK_LOG_LEVEL": "INFO", **extra})
        return env

    def run(self, *args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "worker.cli", *args], cwd=REPO, env=self.env({}),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"aidawork {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")

    def start(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", *args], cwd=REPO, env=self.env(extra or {}),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def start_stack(stack: Stack) -> tuple[httpx.Client, httpx.Client]:
    # Flower first, so that it hears every task event of the runs below.
    stack.start("flower", ["flower", "--port", str(stack.flower_port)], {"FLOWER_UNAUTHENTICATED_API": "1"})
    stack.start("worker", ["worker", "--concurrency", "2"], {"AIDAWORK_WORKER_NAME": WORKER_NODE})
    stack.start("api", ["api", "--port", str(stack.api_port)],
                {"AIDAWORK_API_TOKENS": json.dumps({TOKEN: "team-a", OTHER_TOKEN: "team-b"})})
    api = httpx.Client(base_url=f"http://127.0.0.1:{stack.api_port}", timeout=30.0,
                       headers={"Authorization": f"Bearer {TOKEN}"})
    flower = httpx.Client(base_url=f"http://127.0.0.1:{stack.flower_port}", timeout=10.0)

    def answers(http: httpx.Client, path: str) -> bool:
        stack.alive()
        try:
            return http.get(path).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(lambda: answers(api, "/healthz"), "the API to answer /healthz")
    wait_until(lambda: answers(flower, "/healthcheck"), "Flower to answer /healthcheck")

    def worker_heard() -> bool:  # Flower's event consumer hears the worker
        stack.alive()
        return flower.get("/api/workers", params={"status": "1"}).json().get(WORKER_NODE) is True

    wait_until(worker_heard, f"Flower to hear {WORKER_NODE}", interval_s=0.5)
    return api, flower


def submit(api: httpx.Client, body: dict[str, Any]) -> str:
    response = api.post("/v1/runs", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"POST /v1/runs answered {response.status_code}: {response.text}")
    return str(response.json()["run_id"])


def wait_status(stack: Stack, api: httpx.Client, run_id: str, status: str) -> None:
    def reached() -> bool:
        stack.alive()
        now = api.get(f"/v1/runs/{run_id}").json()["status"]
        if now in ("failed", "cancelled") and now != status:
            raise RuntimeError(f"run {run_id} ended {now}: {stack.tail('worker')}")
        return bool(now == status)

    wait_until(reached, f"run {run_id} to be {status}")


def loopback_only(route: Any) -> None:
    """The browser fetches from the stack only: anything else is refused."""
    if urlsplit(route.request.url).hostname == "127.0.0.1":
        route.continue_()
    else:
        route.abort()


def shoot(browser: Any, stack: Stack, flower: httpx.Client, waiting: str, run_ids: list[str]) -> None:
    ASSETS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(WAIT_S * 1000)
    page.route("**/*", loopback_only)

    # The inspector: sign in (the token stays in the tab), open the run waiting for the client tool.
    page.goto(f"http://127.0.0.1:{stack.api_port}/ui")
    page.fill("#token", TOKEN)
    page.click("#sign-in")
    for run_id in run_ids:
        page.locator(f'tr[data-run-id="{run_id}"]').wait_for()
    page.locator(f'tr[data-run-id="{waiting}"]').click()
    page.locator("#run-status").filter(has_text="suspended").wait_for()
    page.locator(".digest-check").nth(1).wait_for()
    # Round 0 open (its context, the add call and its output); round 1's call is the wait above.
    page.locator('details.round[data-round="0"] summary').click()
    page.locator('details.round[data-round="0"] .tool-call').filter(has_text="completed").wait_for()
    page.locator("#live").filter(has_text="live").wait_for()  # the run's event stream is open
    page.screenshot(path=str(ASSETS / "inspector.png"), full_page=True)

    # Flower: its task list, once it shows every round task as finished.
    def tasks_done() -> bool:
        tasks = flower.get("/api/tasks").json().values()
        return len(tasks) >= 5 and all(t.get("state") == "SUCCESS" for t in tasks)

    wait_until(tasks_done, "Flower to list the round tasks as SUCCESS", interval_s=0.5)
    page.goto(f"http://127.0.0.1:{stack.flower_port}/tasks")
    page.locator("#tasks-table tbody tr td a").first.wait_for()
    page.wait_for_load_state("networkidle")
    card = page.locator("section.tasks-table-card").bounding_box()  # cut the empty page below it
    height = min(VIEWPORT["height"], int(card["y"] + card["height"] + 24))
    page.screenshot(path=str(ASSETS / "flower.png"),
                    clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height})
    page.close()


def broker_in_use() -> int:
    """How many other clients are on the broker's Redis database: another stack's worker
    there would take this stack's round tasks (and this worker its tasks)."""
    import redis

    conn = redis.Redis.from_url(BROKER_URL)
    try:
        db = conn.connection_pool.connection_kwargs.get("db", 0)
        me = conn.client_id()
        return sum(1 for c in conn.client_list() if int(c.get("db", -1)) == db and int(c["id"]) != me)
    finally:
        conn.close()


def main() -> int:
    if not Path(CHROMIUM).exists():
        log(f"{CHROMIUM} is missing: apt-get install -y chromium")
        return 1
    if others := broker_in_use():
        log(f"{others} other client(s) use {BROKER_URL}: set SHOTS_BROKER_URL to an idle Redis database")
        return 1
    from playwright.sync_api import sync_playwright

    name = "aidawork_docs_shots_" + secrets.token_hex(4)
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    stack: Stack | None = None
    created = False
    with tempfile.TemporaryDirectory(prefix="aidawork-docs-shots-") as tmp:
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            created = True
            log(f"database {name}, logs in {tmp}")
            stack = Stack(f"{PG}/{name}", Path(tmp))
            stack.run("migrate")
            api, flower = start_stack(stack)
            log(f"api on :{stack.api_port}, flower on :{stack.flower_port}, worker {WORKER_NODE}")

            completed = submit(api, COMPLETED)
            waiting = submit(api, WAITING_FOR_CLIENT_TOOL)
            approval = submit(api, WAITING_FOR_APPROVAL)
            wait_status(stack, api, completed, "completed")
            wait_status(stack, api, waiting, "suspended")
            wait_status(stack, api, approval, "suspended")

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                try:
                    shoot(browser, stack, flower, waiting, [completed, waiting, approval])
                finally:
                    browser.close()
            api.close()
            flower.close()
        except Exception:
            if stack is not None:
                for proc in stack.procs:
                    log(f"--- {proc}.log (last lines)\n{stack.tail(proc)}")
            raise
        finally:
            if stack is not None:
                stack.stop()
            if created:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                log(f"dropped {name}")
            admin.dispose()

    too_big = []
    for picture in ("inspector.png", "flower.png"):
        size = (ASSETS / picture).stat().st_size
        log(f"docs/assets/{picture}: {size // 1024} kB")
        if size > MAX_PNG_BYTES:
            too_big.append(picture)
    if too_big:
        log(f"over {MAX_PNG_BYTES // 1000} kB: {', '.join(too_big)} (crop or shrink the viewport)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

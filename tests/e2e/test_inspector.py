"""The run inspector (``/ui``) in a real browser: headless Chromium (Debian's, driven by
Playwright) against a real ``aidawork api`` process and a real worker. Sign in, open a run
that waits for a client tool, see its rounds with the digest check passed, answer the
wait from the page and watch the run finish live (no reload); a stored message altered
in the database shows as a digest mismatch. The bearer token never reaches a URL or the
API's log, and neither does the stream token.

The docs' pictures are taken by `make docs-screenshots` (docs/screenshots.py), not here:
this test's screenshot goes to its tmp directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from sqlalchemy import text

from tests.support.api import TOKEN_A, ApiServer
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import wait_suspended, wait_terminal
from tests.support.requests import PICK_COLOR, scripted_request
from worker import client

CHROMIUM = "/usr/bin/chromium"
TURNS = [
    {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
    {"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]},
    {"content": "picked red"},
]
TIMEOUT_MS = 30_000


@pytest.fixture
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def screenshot_path(tmp_path: Path) -> Path:
    return tmp_path / "inspector.png"


def test_the_inspector_shows_a_run_answers_its_wait_and_follows_it_live(
    cluster: Cluster, api: ApiServer, ctx: Any, browser: Any, tmp_path: Path
) -> None:
    cluster.start_worker("w1", concurrency=2)
    wait_ready(cluster, "w1")
    request = scripted_request(TURNS, tools=["add"], owner="team-a", client_tools=[PICK_COLOR],
                               text_input="pick a color for 2 + 3")
    waiting = client.submit(request, ctx=ctx).run_id
    altered = client.submit(scripted_request([{"content": "hello"}], owner="team-a"), ctx=ctx).run_id
    wait_suspended(ctx.engine, waiting, boundary_seq=1)
    wait_terminal(ctx.engine, altered)
    with ctx.engine.begin() as conn:
        conn.execute(text("UPDATE messages SET body = jsonb_set(body, '{content}', '\"tampered\"') "
                          "WHERE run_id = :id AND role = 'user'"), {"id": altered})

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"http://127.0.0.1:{api.port}/ui")
    page.fill("#token", TOKEN_A)
    page.click("#sign-in")
    row = page.locator(f'tr[data-run-id="{waiting}"]')
    row.wait_for()
    assert "suspended" in row.inner_text()
    row.click()

    checks = page.locator(".digest-check")
    expect(checks).to_have_text(["digest verified", "digest verified"])
    assert page.locator("#run-status").inner_text() == "suspended"
    page.evaluate("window.notReloaded = true")  # gone if the page reloads
    for i in range(2):
        page.locator("details.round summary").nth(i).click()
    assert "pick a color for 2 + 3" in page.locator('details.round[data-round="1"]').inner_text()
    assert "add · call_0_0 · completed" in page.locator('details.round[data-round="0"] .tool-call').inner_text()
    expect(page.locator("#live")).to_contain_text("live")  # the stream is open
    page.screenshot(path=str(screenshot_path(tmp_path)), full_page=True)

    wait = page.locator('.wait[data-tool-call-id="call_1_0"]')
    wait.locator("textarea.tool-result").fill('"red"')
    wait.locator("button.send-result").click()
    # The run ends in the database first (so a failure says which side was slow: the run
    # or the page), then the stream's events update the page: the status, then the round.
    assert wait_terminal(ctx.engine, waiting)["status"] == "completed"
    expect(page.locator("#run-status")).to_have_text("completed", timeout=TIMEOUT_MS)
    expect(checks).to_have_text(["digest verified"] * 3)
    expect(page.locator("#run-output")).to_contain_text("picked red")
    assert page.evaluate("window.notReloaded") is True

    page.goto(f"http://127.0.0.1:{api.port}/ui#/runs/{altered}")  # a hash change: the same page
    expect(page.locator("#run-id")).to_have_text(str(altered))
    expect(checks).to_have_text(["digest MISMATCH"])

    # The token stays in the tab: never in a URL, never in the API's log lines.
    assert TOKEN_A not in page.url
    assert page.evaluate("sessionStorage.getItem('aidawork.token')") == TOKEN_A
    log = api.log_path.read_text()
    assert "request_served" in log and f"/v1/runs/{waiting}/events" in log
    assert TOKEN_A not in log and "stream_token" not in log

"""Stream tokens (``worker.api.stream_tokens``) and how the events endpoint takes them,
in process with no store: scoped to one run, expiring, refused when tampered with or
signed under another secret; accepted as ``?stream_token=`` by the events endpoint only."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
import pytest

from tests.support.api import TOKEN, error_of, in_process_request, no_store
from worker.api import create_app
from worker.api.errors import ApiError
from worker.api.stream_tokens import StreamTokens
from worker.ops.settings import Settings

SECRET = b"s" * 32
RUN = uuid.UUID(int=7)
NOW = 1_800_000_000.0


def request(method: str, url: str, settings: Settings | None = None, **kwargs: Any) -> httpx.Response:
    return in_process_request(method, url, settings or Settings(api_tokens=json.dumps({TOKEN: "team-a"})), **kwargs)


def refusal(tokens: StreamTokens, token: str, run_id: uuid.UUID = RUN, now: float = NOW) -> str:
    with pytest.raises(ApiError) as caught:
        tokens.owner_of(token, run_id, now=now)
    assert (caught.value.status, caught.value.field) == (401, "stream_token")
    return caught.value.message


def test_a_token_names_its_owner_for_its_run_until_it_expires() -> None:
    tokens = StreamTokens(SECRET, ttl_s=300)
    issued = tokens.issue(RUN, "team-a", now=NOW)
    assert issued.expires_at.timestamp() == NOW + 300
    assert tokens.owner_of(issued.token, RUN, now=NOW + 299) == "team-a"
    assert "expired" in refusal(tokens, issued.token, now=NOW + 300)
    assert "another run" in refusal(tokens, issued.token, run_id=uuid.UUID(int=8))


def test_a_tampered_or_foreign_token_is_refused() -> None:
    tokens = StreamTokens(SECRET, ttl_s=300)
    payload, _, signature = tokens.issue(RUN, "team-a", now=NOW).token.partition(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "o": "team-b"}).encode()).rstrip(b"=").decode()
    assert "not valid" in refusal(tokens, f"{forged}.{signature}")
    assert "not valid" in refusal(tokens, f"{payload}.{signature[:-1]}{'0' if signature[-1] != '0' else '1'}")
    assert "not valid" in refusal(tokens, "no-dot-at-all")
    other = StreamTokens(b"o" * 32, ttl_s=300).issue(RUN, "team-a", now=NOW)
    assert "not valid" in refusal(tokens, other.token)


def test_the_events_endpoint_refuses_a_bad_stream_token_before_the_store() -> None:
    app = create_app(Settings(api_tokens=json.dumps({TOKEN: "team-a"})), no_store)
    token = app.state.aidawork.stream_tokens.issue(uuid.UUID(int=9), "team-a", now=NOW).token
    for url in [f"/v1/runs/{RUN}/events?stream_token=junk", f"/v1/runs/{RUN}/events?stream_token={token}"]:
        response = request("GET", url)
        assert response.status_code == 401, response.text
        assert error_of(response)["field"] == "stream_token"
    # Only the events endpoint takes it: elsewhere it is no credential at all.
    status = request("GET", f"/v1/runs/{RUN}?stream_token={token}")
    assert (status.status_code, error_of(status)["field"]) == (401, "Authorization")


def test_a_cors_preflight_is_answered_for_a_listed_origin_only() -> None:
    preflight = {"Origin": "https://ops.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    off = request("OPTIONS", "/v1/runs")
    assert off.status_code == 405 and "access-control-allow-origin" not in off.headers
    on = Settings(api_tokens=json.dumps({TOKEN: "team-a"}), api_cors_origins="https://ops.example, http://x.test")
    allowed = request("OPTIONS", "/v1/runs", headers=preflight, settings=on)
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers["access-control-allow-origin"] == "https://ops.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    other = request("OPTIONS", "/v1/runs", headers={**preflight, "Origin": "https://evil.example"}, settings=on)
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # A simple request from a listed origin gets the header too (and is still authenticated).
    get = request("GET", f"/v1/runs/{RUN}", headers={"Origin": "http://x.test"}, settings=on)
    assert (get.status_code, get.headers["access-control-allow-origin"]) == (401, "http://x.test")


def test_the_inspector_page_is_served_with_every_event_kind_and_a_strict_policy() -> None:
    page = request("GET", "/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert '"run_completed"' in page.text and "/*EVENT_KINDS*/" not in page.text
    assert "sessionStorage" in page.text and "localStorage" not in page.text

"""The HTTP API in process (ASGI, no sockets, no database): every request refused for
its token, size or shape is refused before the store is touched (the context factory
below fails the test if it is called), with a JSON error naming the field."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from schema.wire import RunRequest
from tests.support.api import TOKEN, error_of, in_process_request, no_store
from worker.api import create_app
from worker.api.models import RunSubmission
from worker.ops.settings import Settings

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
LIMIT = 4096


def request(method: str, url: str, settings: Settings | None = None, **kwargs: Any) -> httpx.Response:
    settings = settings or Settings(api_tokens=json.dumps({TOKEN: "team-a"}), api_max_body_bytes=LIMIT)
    return in_process_request(method, url, settings, **kwargs)
VALID = {"input": "go", "config": {"model": {"provider": "scripted", "turns": [{"content": "hi"}]}}}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0000000000"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
)
def test_a_missing_or_invalid_token_gets_401(headers: dict[str, str]) -> None:
    for method, url in [("GET", "/v1/runs/00000000-0000-0000-0000-000000000001"), ("POST", "/v1/runs")]:
        response = request(method, url, headers=headers, json=VALID)
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert error_of(response)["field"] == "Authorization"


def test_a_declared_oversized_body_gets_413_before_anything_reads_it() -> None:
    body = json.dumps({**VALID, "input": "x" * LIMIT}).encode()

    response = request("POST", "/v1/runs", headers=AUTH, content=body)

    assert response.status_code == 413
    assert error_of(response)["code"] == "BODY_TOO_LARGE"
    assert "AIDAWORK_API_MAX_BODY_BYTES" in error_of(response)["message"]


def test_a_chunked_oversized_body_gets_413_as_it_arrives() -> None:
    sent = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(64):
            sent.append(1)
            yield b" " * 512

    response = request("POST", "/v1/runs", headers=AUTH, content=chunks())

    assert response.status_code == 413 and error_of(response)["field"] == "body"
    assert len(sent) < 64  # refused before the client had sent the whole body


def test_a_body_just_under_the_limit_is_parsed() -> None:
    body = json.dumps({**VALID, "owner": "team-b"}).encode()
    body += b" " * (LIMIT - len(body))

    response = request("POST", "/v1/runs", headers=AUTH, content=body)

    assert (response.status_code, error_of(response)["field"]) == (403, "owner")  # refused by the owner rule


@pytest.mark.parametrize(
    ("content", "status", "field"),
    [
        (b'{"input": "go", ', 400, "body"),
        (b'"just a string"', 422, "body"),
        (json.dumps({"config": {}}).encode(), 422, "input"),
        (json.dumps({**VALID, "input": 3}).encode(), 422, "input"),
        (json.dumps({**VALID, "config": []}).encode(), 422, "config"),
        (json.dumps({**VALID, "root_id": "not-a-uuid"}).encode(), 422, "root_id"),
        (json.dumps({**VALID, "extra": True}).encode(), 422, "extra"),
        (json.dumps({**VALID, "owner": "team-b"}).encode(), 403, "owner"),  # well formed, not this token's
    ],
)
def test_a_malformed_submission_is_refused_naming_the_field(content: bytes, status: int, field: str) -> None:
    response = request("POST", "/v1/runs", headers=AUTH, content=content)

    assert response.status_code == status, response.text
    assert error_of(response)["field"] == field


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/v1/runs/{id}/deliveries", {"files": {"a": "x"}}, "tool_call_id"),
        ("/v1/runs/{id}/deliveries", {"tool_call_id": "c", "files": {"a": 1}}, "files.a"),
        ("/v1/runs/{id}/deliveries", {"tool_call_id": "", "files": {}}, "tool_call_id"),
        ("/v1/runs/{id}/prerequisites", {"value": 1}, "key"),
        ("/v1/runs/{id}/prerequisites", {"key": "k"}, "value"),
        ("/v1/runs/not-a-uuid/cancel", None, "run_id"),
    ],
)
def test_malformed_inputs_for_a_run_are_refused_naming_the_field(url: str, body: Any, field: str) -> None:
    run_url = url.format(id="00000000-0000-0000-0000-000000000001")

    response = request("POST", run_url, headers=AUTH, json=body)

    assert (response.status_code, error_of(response)["field"]) == (422, field), response.text


def test_an_unknown_path_is_a_json_404() -> None:
    response = request("GET", "/v2/runs", headers=AUTH)

    assert (response.status_code, error_of(response)["code"]) == (404, "NOT_FOUND")


def test_every_v1_operation_requires_the_bearer_token_in_the_openapi_document() -> None:
    spec = request("GET", "/openapi.json").json()

    operations = [op for path, item in spec["paths"].items() if path.startswith("/v1/") for op in item.values()]
    assert len(operations) == 20  # 15 run and owner operations (fork among them), 5 of saved agents
    assert all(op["security"] == [{"HTTPBearer": []}] for op in operations)


def test_the_submission_has_the_fields_of_a_run_request() -> None:
    # RunSubmission mirrors RunRequest (owner optional): a field added there must be added here.
    assert set(RunSubmission.model_fields) == set(RunRequest.model_fields)
    assert not RunSubmission.model_fields["owner"].is_required()


def test_a_trailing_slash_is_a_404_not_a_redirect() -> None:
    url = "/v1/runs/00000000-0000-0000-0000-000000000001/"
    response = request("GET", url, headers={**AUTH, "Host": "evil.example"})

    assert (response.status_code, error_of(response)["code"]) == (404, "NOT_FOUND")
    assert "location" not in response.headers


def test_a_stream_beyond_the_tokens_cap_gets_429_before_the_store() -> None:
    app = create_app(Settings(api_tokens=json.dumps({TOKEN: "team-a"}), api_max_streams_per_token=1), no_store)
    app.state.aidawork.slots.acquire(hashlib.sha256(TOKEN.encode()).digest())  # one stream open already

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            return await http.get("/v1/runs/00000000-0000-0000-0000-000000000001/events", headers=AUTH)

    response = anyio.run(go)

    assert (response.status_code, error_of(response)["code"]) == (429, "TOO_MANY_STREAMS")
    assert "AIDAWORK_API_MAX_STREAMS_PER_TOKEN" in error_of(response)["message"]

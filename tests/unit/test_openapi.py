"""The OpenAPI document (``worker.api.openapi``) states what the API enforces: the run
request's config as TurnConfig (a union tagged by provider, plugins' providers
included), the constraints of each field, and each error answer with the error body."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from runtime.plugins import process_plugins
from tests.support.api import TOKEN, no_store
from worker.api import create_app
from worker.api.errors import ApiError
from worker.api.streams import parse_last_event_id
from worker.ops.settings import Settings


def spec(**settings: Any) -> dict[str, Any]:
    app = create_app(Settings(api_tokens=json.dumps({TOKEN: "team-a"}), **settings), no_store)
    return app.openapi()


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in document["paths"].items() for method, op in item.items()]


def test_the_config_is_turn_config_tagged_by_provider_with_the_plugins_providers() -> None:
    document = spec()
    schemas = document["components"]["schemas"]

    config = schemas["RunSubmission"]["properties"]["config"]
    assert config["$ref"] == "#/components/schemas/TurnConfig"
    model = schemas["TurnConfig"]["properties"]["model"]
    assert model["discriminator"]["propertyName"] == "provider"
    plugin_providers = set(process_plugins([]).providers)  # the example plugin's echo, installed
    assert plugin_providers
    assert set(model["discriminator"]["mapping"]) == {"scripted", "openai", "anthropic", *plugin_providers}
    assert "HTTPValidationError" not in schemas  # FastAPI's 422 body, which the API never sends


def test_the_deployments_tools_and_base_urls_are_stated() -> None:
    schemas = spec(model_base_urls='["http://127.0.0.1:11434/v1"]')["components"]["schemas"]

    tools = schemas["TurnConfig"]["properties"]["tools"]
    assert {"add", "sleep", "read_files"} <= set(tools["items"]["enum"]) and tools["uniqueItems"] is True
    calls = schemas["ScriptedToolCall"]["anyOf"]
    add = next(c for c in calls if c["properties"]["name"].get("const") == "add")
    assert add["properties"]["args"]["required"] == ["a", "b"] and add["required"] == ["name", "args"]
    openai = schemas["OpenAIModelConfig"]["properties"]
    assert openai["base_url"]["enum"] == ["https://api.openai.com/v1", "http://127.0.0.1:11434/v1"]


def test_input_has_min_length_1_and_owner_its_pattern() -> None:
    submission = spec()["components"]["schemas"]["RunSubmission"]["properties"]

    assert submission["input"]["minLength"] == 1
    owner = next(o for o in submission["owner"]["anyOf"] if o.get("type") == "string")
    assert owner["pattern"] == r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$" and owner["maxLength"] == 128


@pytest.mark.parametrize(("value", "valid"), [("7", True), (" 7 ", True), ("", True), ("seven", False),
                                              ("1234567890", False), ("-1", False), ("null", False)])
def test_the_last_event_id_pattern_is_what_the_server_accepts(value: str, valid: bool) -> None:
    (header,) = [
        p
        for _, _, op in operations(spec())
        for p in op.get("parameters", [])
        if p["in"] == "header" and p["name"] == "Last-Event-ID"
    ]
    assert header["schema"]["type"] == "string"  # absent or a string, never null

    matches = re.search(header["schema"]["pattern"], value) is not None
    try:
        parse_last_event_id(value)
        accepted = True
    except ApiError:
        accepted = False
    assert matches == accepted == valid


def test_every_operation_answers_500_and_503_with_the_error_body() -> None:
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    found = operations(spec())

    assert found
    for path, method, op in found:
        for status in ("401", "413", "500", "503"):
            assert op["responses"][status]["content"] == error, (path, method, status)
        # 422 where something is there to refuse: a body or a parameter (GET /v1/owner has neither).
        takes_input = "requestBody" in op or bool(op.get("parameters"))
        assert ("422" in op["responses"]) == takes_input, (path, method)
        if takes_input:
            assert op["responses"]["422"]["content"] == error, (path, method)
        assert ("404" in op["responses"]) == ("{" in path), (path, method)  # only where a path names an id
        if method == "get":  # nothing there is refused for the run's state
            assert "409" not in op["responses"], (path, method)
    answers = {f"/v1/runs/{{run_id}}/{name}" for name in ("deliveries", "prerequisites", "tool-results", "approvals")}
    assert all("409" in op["responses"] for path, _, op in found if path in answers | {"/v1/runs/{run_id}/cancel"})
    # A submit: IDEMPOTENCY_KEY_REUSED or ROOT_BUSY, and 200 for a replayed idempotency key.
    submit = next(op for path, method, op in found if (path, method) == ("/v1/runs", "post"))
    assert submit["responses"]["409"]["content"] == error
    assert {"200", "201"} <= set(submit["responses"])
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in submit["parameters"])


def test_the_document_has_the_package_version_and_the_bearer_scheme() -> None:
    document = spec()

    assert re.fullmatch(r"\d+\.\d+\.\d+.*", document["info"]["version"])
    assert document["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "a token from AIDAWORK_API_TOKENS",
    }


WEBHOOK_PREFIXES = "https://hooks.example.com,http://127.0.0.1:9000/hooks/"


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com",
        "https://hooks.example.com/a?b=c",
        "https://hooks.example.com.evil.net/",
        "https://hooks.example.com@evil.net/",
        "http://127.0.0.1:9000/hooks/abc",
        "http://127.0.0.1:9000/hooks/a b",
        "http://127.0.0.1:9000/other",
    ],
)
def test_the_webhook_url_pattern_allows_what_submit_allows(url: str) -> None:
    from worker.ops.webhooks.policy import WebhookRefused, check_webhook_url

    settings = {"webhook_urls": WEBHOOK_PREFIXES, "webhook_secret": "w" * 20}
    pattern = spec(**settings)["components"]["schemas"]["Webhook"]["properties"]["url"]["pattern"]
    try:
        check_webhook_url(url, Settings(**settings).webhook_prefixes)
        allowed = True
    except WebhookRefused:
        allowed = False
    assert bool(re.match(pattern, url)) is allowed


def test_without_webhook_prefixes_a_run_may_carry_no_webhook() -> None:
    assert spec()["components"]["schemas"]["RunSubmission"]["properties"]["webhook"]["type"] == "null"


def test_a_wrong_method_answers_with_every_method_of_the_path() -> None:
    from tests.support.api import in_process_request

    response = in_process_request("DELETE", "/v1/runs", Settings(api_tokens=json.dumps({TOKEN: "team-a"})))
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET, POST"


SETTINGS = {"api_tokens": json.dumps({TOKEN: "team-a"})}
RUN = "/v1/runs/00000000-0000-0000-0000-000000000001"
SUBMISSION = {"input": "go", "config": {"model": {"provider": "scripted", "turns": [{"content": "hi"}]}}}


def test_an_owner_other_than_the_tokens_is_a_documented_403() -> None:
    from tests.support.api import error_of, in_process_request

    submit = spec()["paths"]["/v1/runs"]["post"]
    assert "403" in submit["responses"] and "OWNER_MISMATCH" in submit["responses"]["403"]["description"]
    response = in_process_request("POST", "/v1/runs", Settings(**SETTINGS), json={**SUBMISSION, "owner": "team-b"},
                                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 403, response.text
    assert (error_of(response)["code"], error_of(response)["field"]) == ("OWNER_MISMATCH", "owner")


def body_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    """The JSON schema of the operation's body, with the document's components to resolve its $refs."""
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**body, "components": document["components"]}


# Each request as the API refuses it (a NUL in some string, 422), and with that NUL replaced by "x".
NUL_BODIES: list[Any] = [
    pytest.param("/v1/runs", {**SUBMISSION, "input": "g\x00o"}, id="input"),
    pytest.param("/v1/runs", {**SUBMISSION, "config": {**SUBMISSION["config"], "system_prompt": "\x00"}},
                 id="system_prompt"),
    pytest.param("/v1/runs", {**SUBMISSION, "config": {"model": {"provider": "scripted", "turns": [
        {"tool_calls": [{"name": "client_x", "args": {"k": ["\x00"]}}]}]}}}, id="client_tool_args"),
    pytest.param(f"{RUN}/tool-retries", {"tool_call_id": "c\x00"}, id="tool_call_id"),
    pytest.param(f"{RUN}/deliveries", {"tool_call_id": "c", "files": {"a\x00": "text"}}, id="file_path"),
    pytest.param(f"{RUN}/deliveries", {"tool_call_id": "c", "files": {"a": "te\x00xt"}}, id="file_content"),
    pytest.param(f"{RUN}/prerequisites", {"key": "k\x00", "value": 1}, id="prerequisite_key"),
    pytest.param(f"{RUN}/prerequisites", {"key": "k", "value": {"a": [{"b": "\x00"}]}}, id="prerequisite_value"),
    pytest.param(f"{RUN}/tool-results", {"tool_call_id": "c", "result": {"x\x00": 1}}, id="result_key"),
    pytest.param(f"{RUN}/approvals", {"tool_call_id": "c", "decision": "approve", "args": {"a": "\x00"}},
                 id="approval_args"),
    pytest.param(f"{RUN}/approvals", {"tool_call_id": "c", "decision": "reject", "reason": "no\x00"}, id="reason"),
]


@pytest.mark.parametrize(("path", "body"), NUL_BODIES)
def test_a_nul_the_api_refuses_is_refused_by_the_document_too(path: str, body: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator

    from tests.support.api import in_process_request

    validator = Draft202012Validator(body_schema(spec(), path.replace(RUN, "/v1/runs/{run_id}")))
    refused = in_process_request("POST", path, Settings(**SETTINGS), json=body,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 422, refused.text
    assert not validator.is_valid(body), "the document allows a request the API refuses"
    assert validator.is_valid(json.loads(json.dumps(body).replace("\\u0000", "x")))  # the NUL was the only fault

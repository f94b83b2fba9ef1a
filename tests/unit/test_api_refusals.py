"""The HTTP API in process (ASGI, no database): a JSON value no store can hold (NaN,
Infinity, 1e400, NUL, unpaired surrogates, too deep, too many digits) is a 422 naming the
field, refused before the store is touched; a body json.loads cannot read is a 400/422,
never a 500; and anything unexpected is a JSON 500 logged as one line without its text."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from runtime.canonical import MAX_JSON_DEPTH, NON_FINITE, NUL_CHARACTER, TOO_DEEP, TOO_MANY_DIGITS, UNPAIRED_SURROGATE
from tests.support.api import TOKEN, error_of, no_store
from worker.api import create_app
from worker.engine.bootstrap import WorkerContext
from worker.ops.settings import Settings

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
RUN = "/v1/runs/00000000-0000-0000-0000-000000000001"
LIMIT = 1_000_000


def post(url: str, content: bytes, context: Callable[[], WorkerContext] = no_store) -> httpx.Response:
    app = create_app(Settings(api_tokens=json.dumps({TOKEN: "team-a"}), api_max_body_bytes=LIMIT), context)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            response = await http.post(url, content=content, headers=AUTH)
            await response.aread()
            return response

    return anyio.run(go)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


PREREQUISITES: list[Any] = [
    pytest.param('{"key": "k", "value": NaN}', "value", NON_FINITE, id="nan"),
    pytest.param('{"key": "k", "value": Infinity}', "value", NON_FINITE, id="infinity"),
    pytest.param('{"key": "k", "value": {"a": [1, -Infinity]}}', "value.a[1]", NON_FINITE, id="minus_infinity"),
    pytest.param('{"key": "k", "value": 1e400}', "value", NON_FINITE, id="1e400"),
    pytest.param('{"key": "k", "value": "a\\u0000b"}', "value", NUL_CHARACTER, id="nul_in_value"),
    pytest.param('{"key": "k", "value": ["\\ud800"]}', "value[0]", UNPAIRED_SURROGATE, id="surrogate_in_value"),
    pytest.param('{"key": "k", "value": {"\\udfff": 1}}', "value", "an object key holds", id="surrogate_in_value_key"),
    pytest.param('{"key": "k\\u0000", "value": 1}', "key", NUL_CHARACTER, id="nul_in_key"),
    pytest.param('{"key": "\\ud800", "value": 1}', "key", "valid string", id="surrogate_in_key"),
    pytest.param('{"key": "k", "value": ' + deep(900) + "}", "value" + "[0]" * MAX_JSON_DEPTH, TOO_DEEP, id="900"),
    pytest.param('{"key": "k", "value": ' + deep(20_000) + "}", "body", TOO_DEEP, id="20000_deep"),
    pytest.param('{"key": "k", "value": ' + "9" * 4001 + "}", "value", TOO_MANY_DIGITS, id="4001_digits"),
    pytest.param('{"key": "k", "value": ' + "9" * 5000 + "}", "body", TOO_MANY_DIGITS, id="5000_digits"),
]


@pytest.mark.parametrize(("body", "field", "reason"), PREREQUISITES)
def test_a_prerequisite_no_store_can_hold_is_a_422_naming_the_field(body: str, field: str, reason: str) -> None:
    response = post(f"{RUN}/prerequisites", body.encode())

    assert (response.status_code, error_of(response)["code"]) == (422, "REQUEST_INVALID"), response.text
    assert error_of(response)["field"] == field
    assert reason in error_of(response)["message"]


DELIVERIES: list[Any] = [
    pytest.param({"a.md": "x\\u0000"}, "files[0].content", NUL_CHARACTER, id="nul_in_content"),
    pytest.param({"a.md": "ok", "b.md": "\\ud800"}, "files[1].content", UNPAIRED_SURROGATE, id="surrogate_in_content"),
    pytest.param({"a\\u0000.md": "x"}, "files[0].path", NUL_CHARACTER, id="nul_in_path"),
    pytest.param({"\\udc80.md": "x"}, "files[0].path", UNPAIRED_SURROGATE, id="surrogate_in_path"),
]


@pytest.mark.parametrize(("files", "field", "reason"), DELIVERIES)
def test_a_delivered_file_no_store_can_hold_is_a_422_naming_the_file(files: Any, field: str, reason: str) -> None:
    # Written by hand: json.dumps would escape the backslashes of the \u escapes.
    entries = ", ".join(f'"{path}": "{content}"' for path, content in files.items())
    body = '{"tool_call_id": "call_0_0", "files": {' + entries + "}}"

    response = post(f"{RUN}/deliveries", body.encode())

    assert (response.status_code, error_of(response)["field"]) == (422, field), response.text
    assert reason in error_of(response)["message"]


ANSWERS: list[Any] = [
    pytest.param("tool-results", '{"tool_call_id": "c", "result": NaN}', "result", NON_FINITE, id="result_nan"),
    pytest.param("tool-results", '{"tool_call_id": "c", "result": {"a": ["\\u0000"]}}', "result.a[0]", NUL_CHARACTER,
                 id="result_nul"),
    pytest.param("tool-results", '{"tool_call_id": "c", "result": ' + deep(100) + "}",
                 "result" + "[0]" * MAX_JSON_DEPTH, TOO_DEEP, id="result_deep"),
    pytest.param("tool-results", '{"tool_call_id": "", "result": 1}', "tool_call_id", "at least 1", id="empty_id"),
    pytest.param("tool-results", '{"tool_call_id": "c\\u0000", "result": 1}', "tool_call_id", NUL_CHARACTER,
                 id="nul_id"),
    pytest.param("tool-results", '{"tool_call_id": "c"}', "result", "Field required", id="no_result"),
    pytest.param("tool-results", '{"tool_call_id": "c", "result": 1, "is_error": "yes"}', "is_error", "boolean",
                 id="is_error_a_string"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "maybe"}', "decision", "approve", id="decision"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "reject"}', "reason", "must say why",
                 id="reject_without_reason"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "reject", "reason": "  "}', "reason", "empty",
                 id="reject_blank_reason"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "reject", "reason": "' + "r" * 2001 + '"}', "reason",
                 "over the limit of 2000", id="reject_long_reason"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "reject", "reason": "no", "args": {}}', "args",
                 "only an approval", id="reject_with_args"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "approve", "reason": "ok"}', "reason",
                 "only a rejection", id="approve_with_reason"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "approve", "args": [1]}', "args",
                 "dictionary", id="args_not_an_object"),
    pytest.param("approvals", '{"tool_call_id": "c", "decision": "approve", "args": {"a": Infinity}}', "args.a",
                 NON_FINITE, id="args_infinity"),
    pytest.param("tool-retries", '{"tool_call_id": ""}', "tool_call_id", "at least 1", id="retry_empty_id"),
    pytest.param("tool-retries", '{"tool_call_id": "c", "x": 1}', "x", "Extra inputs", id="retry_extra_field"),
]


@pytest.mark.parametrize(("endpoint", "body", "field", "reason"), ANSWERS)
def test_an_answer_no_store_can_hold_is_a_422_naming_the_field_before_the_store(
    endpoint: str, body: str, field: str, reason: str
) -> None:
    response = post(f"{RUN}/{endpoint}", body.encode())

    assert (response.status_code, error_of(response)["code"]) == (422, "REQUEST_INVALID"), response.text
    assert error_of(response)["field"] == field, response.text
    assert reason in error_of(response)["message"], response.text


VALID = {"input": "go", "config": {"model": {"provider": "scripted", "turns": [{"content": "hi"}]}}}
SUBMISSIONS: list[Any] = [
    pytest.param(json.dumps(VALID).replace('"hi"', "NaN"), "config.model.turns[0].content", NON_FINITE, id="nan"),
    pytest.param(json.dumps({**VALID, "config": {**VALID["config"], "x": 1e400}}), "config.x", NON_FINITE, id="inf"),
    pytest.param(
        json.dumps(VALID)[:-2] + ', "x": ' + deep(300) + "}}",
        "config.x" + "[0]" * (MAX_JSON_DEPTH - 2),
        TOO_DEEP,
        id="300_deep",
    ),
    pytest.param(json.dumps(VALID)[:-2] + ', "x": ' + deep(20_000) + "}}", "body", TOO_DEEP, id="20000_deep"),
    pytest.param(json.dumps({**VALID, "input": "a\x00"}), "input", NUL_CHARACTER, id="nul_in_input"),
    pytest.param(json.dumps(VALID)[:-2] + ', "n": ' + "1" * 4400 + "}}", "body", TOO_MANY_DIGITS, id="4400_digits"),
]


@pytest.mark.parametrize(("body", "field", "reason"), SUBMISSIONS)
def test_a_submission_no_store_can_hold_is_a_422_before_the_store(body: str, field: str, reason: str) -> None:
    response = post("/v1/runs", body.encode())

    assert (response.status_code, error_of(response)["field"]) == (422, field), response.text
    assert reason in error_of(response)["message"]


def test_a_body_that_is_not_utf8_is_a_400() -> None:
    response = post(f"{RUN}/prerequisites", b'{"key": "k", "value": "\xff"}')

    assert (response.status_code, error_of(response)["code"]) == (400, "BODY_INVALID")


def test_a_pydantic_error_on_a_key_with_a_surrogate_still_answers_json() -> None:
    response = post(f"{RUN}/deliveries", b'{"tool_call_id": "c", "files": {"a\\ud800": 1}}')

    assert response.status_code == 422
    assert error_of(response)["field"].startswith("files")


def test_an_unexpected_error_is_a_json_500_logged_as_one_line_without_its_text() -> None:
    def broken() -> WorkerContext:
        raise RuntimeError("secret-file-body-0451 in a failed statement")

    with capture_logs() as logs:
        response = post(f"{RUN}/prerequisites", b'{"key": "k", "value": 1}', context=broken)

    assert (response.status_code, error_of(response)["code"]) == (500, "INTERNAL_ERROR")
    assert "secret-file-body-0451" not in response.text
    (crashed,) = [line for line in logs if line["event"] == "request_crashed"]
    assert crashed["error"] == "RuntimeError" and crashed["log_level"] == "error"
    assert crashed["raised_at"].startswith("tests/unit/test_api_refusals.py:")
    assert "secret-file-body-0451" not in repr(logs)

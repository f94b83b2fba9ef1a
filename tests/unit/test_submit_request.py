"""The idempotency key and root policy of a run request: checked before anything is
stored (a 422 naming the field over HTTP, ``RequestInvalid`` in Python), and what
"the same request" means for a key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.errors import RequestInvalid
from runtime.prepare import parse_request
from tests.support.api import TOKEN, error_of, in_process_request
from tests.support.requests import scripted_request
from worker.client import request_digest
from worker.ops.settings import Settings


def request(**fields: Any) -> dict[str, Any]:
    return {**scripted_request([{"content": "done"}]), **fields}


@pytest.mark.parametrize(
    "key", ["", "a b", "k" * 256, "ключ", "a\nb", 42], ids=["empty", "space", "256", "non_ascii", "newline", "number"]
)
def test_a_bad_idempotency_key_is_refused_naming_it(key: object) -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_request(request(idempotency_key=key))
    assert refused.value.field == "idempotency_key"


def test_an_unknown_root_policy_is_refused_naming_it() -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_request(request(root_policy="replace"))
    assert refused.value.field == "root_policy"


def test_keys_up_to_255_visible_characters_and_every_policy_are_accepted() -> None:
    assert parse_request(request(idempotency_key="k" * 255)).idempotency_key == "k" * 255
    assert parse_request(request(idempotency_key="0f9c:ab/cd+ef=~_.-@")).root_policy == "enqueue"
    for policy in ("enqueue", "reject", "interrupt", "rollback"):
        assert parse_request(request(root_policy=policy)).root_policy == policy


def test_the_digest_ignores_the_key_and_defaults_but_not_the_body() -> None:
    plain = request_digest(parse_request(request()))
    assert request_digest(parse_request(request(idempotency_key="a"))) == plain
    assert request_digest(parse_request(request(idempotency_key="b", root_policy="enqueue"))) == plain
    assert request_digest(parse_request(request(root_policy="interrupt"))) != plain
    assert request_digest(parse_request(request(input="other"))) != plain
    # 20.0 and 20 are one JSON number: the same request.
    whole = request()
    whole["config"]["policy"]["max_rounds"] = 50.0
    assert request_digest(parse_request(whole)) == plain


SETTINGS = Settings(api_tokens=json.dumps({TOKEN: "team-test"}))


def post_run(body: dict[str, Any], **headers: str) -> Any:
    return in_process_request(
        "POST", "/v1/runs", SETTINGS, json=body, headers={"Authorization": f"Bearer {TOKEN}", **headers}
    )


def test_header_and_body_keys_that_differ_are_a_422_naming_the_field() -> None:
    response = post_run(request(idempotency_key="one"), **{"Idempotency-Key": "two"})
    assert response.status_code == 422
    assert error_of(response)["field"] == "idempotency_key"


@pytest.mark.parametrize("body", [{"idempotency_key": "a b"}, {"root_policy": "nope"}], ids=["key", "policy"])
def test_a_bad_field_over_http_is_a_422_before_the_store(body: dict[str, Any]) -> None:
    response = post_run(request(**body))
    assert response.status_code == 422
    assert error_of(response)["field"] == next(iter(body))


def test_a_bad_idempotency_key_header_is_a_422() -> None:
    response = post_run(request(), **{"Idempotency-Key": "k" * 256})
    assert response.status_code == 422
    assert "Idempotency-Key" in error_of(response)["field"]

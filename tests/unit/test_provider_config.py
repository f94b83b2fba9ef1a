"""Provider config, keys and retry timing: what a run request may say about its model,
which key it gets, where that key may go, and how long a retry waits."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from runtime.config import AnthropicModelConfig, OpenAIModelConfig
from runtime.deps import build_runtime
from runtime.errors import RequestInvalid
from runtime.models.anthropic import AnthropicModel
from runtime.models.keys import ModelKeys, NamedKey
from runtime.models.openai_compat import OpenAICompatModel
from runtime.outcomes import Fail, Finish
from runtime.prepare import prepare_execution, resolve_and_run
from schema.wire.retry import RetryPolicy, backoff_s
from tests.support.providers import FakeProvider, add_then_answer
from worker.ops.settings import SettingsError, load_settings

CANARY = "sk-canary-XYZ"


def run_request(model: dict[str, Any], tools: list[str] | None = None) -> dict[str, Any]:
    return {
        "owner": "team-test",
        "root_id": None,
        "input": "Add 2 and 3.",
        "config": {"model": model, "system_prompt": "You add.", "tools": tools or ["add"]},
    }


def refusal(model: dict[str, Any], keys: ModelKeys | None = None) -> RequestInvalid:
    with pytest.raises(RequestInvalid) as info:
        prepare_execution(build_runtime(model_keys=keys), run_request(model))
    return info.value


# --- the model config in a run request -------------------------------------------------------


def test_openai_and_anthropic_configs_parse_with_their_defaults() -> None:
    runtime = build_runtime()
    _, openai = prepare_execution(runtime, run_request({"provider": "openai", "name": "gpt-4o-mini"}))
    _, anthropic = prepare_execution(runtime, run_request({"provider": "anthropic", "name": "claude-x"}))

    assert openai.turn_config.model == OpenAIModelConfig(provider="openai", name="gpt-4o-mini")
    assert openai.turn_config.model.base_url == "https://api.openai.com/v1"
    assert openai.turn_config.model.api_key_ref == "default"
    assert isinstance(openai.deps.model, OpenAICompatModel)
    assert anthropic.turn_config.model == AnthropicModelConfig(provider="anthropic", name="claude-x")
    assert (anthropic.turn_config.model.base_url, anthropic.turn_config.model.max_tokens) == (
        "https://api.anthropic.com",
        4096,
    )
    assert isinstance(anthropic.deps.model, AnthropicModel)


def test_a_stored_config_parses_back_to_the_same_config() -> None:
    # The submit path stores model_dump(mode="json"); the worker parses it again.
    model = {
        "provider": "openai",
        "name": "m",
        "base_url": "http://10.0.0.5:8000/v1",
        "api_key_ref": None,
        "max_tokens": 64,
        "temperature": 0.0,
    }
    runtime = build_runtime(model_keys=ModelKeys(base_urls=("http://10.0.0.5:8000/v1",)))
    _, prepared = prepare_execution(runtime, run_request(model))
    stored = prepared.turn_config.model_dump(mode="json")
    _, again = prepare_execution(runtime, {**run_request(model), "config": stored})

    assert again.turn_config == prepared.turn_config


@pytest.mark.parametrize(
    ("model", "field_end", "fragment"),
    [
        ({"provider": "openai", "name": "m", "base_url": "ftp://h/v1"}, "base_url", "http:// or https://"),
        ({"provider": "openai", "name": "m", "base_url": "https:///v1"}, "base_url", "with a host"),
        ({"provider": "openai", "name": "m", "base_url": "not a url"}, "base_url", "whitespace"),
        ({"provider": "openai", "name": "m", "base_url": "notaurl"}, "base_url", "http:// or https://"),
        ({"provider": "anthropic", "name": "m", "base_url": "https://user:pw@h"}, "base_url", "user info"),
        ({"provider": "openai", "name": "m", "base_url": "https://h/v1?key=abc"}, "base_url", "query string"),
        ({"provider": "openai", "name": ""}, "name", "at least 1"),
        ({"provider": "openai", "name": "m", "temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"provider": "anthropic", "name": "m", "temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"provider": "anthropic", "name": "m", "max_tokens": 0}, "max_tokens", "greater than"),
        ({"provider": "openai", "name": "m", "max_tokens": "5"}, "max_tokens", "valid integer"),
        ({"provider": "openai", "name": "m", "api_key_ref": "has space"}, "api_key_ref", "pattern"),
        ({"provider": "openai", "name": "m", "headers": {"x": "y"}}, "headers", "Extra inputs"),
    ],
    ids=[
        "ftp",
        "no_host",
        "spaces",
        "not_a_url",
        "userinfo",
        "query",
        "empty_name",
        "openai_temp",
        "anthropic_temp",
        "zero_max_tokens",
        "string_max_tokens",
        "bad_ref",
        "extra_field",
    ],
)
def test_invalid_model_config_is_refused_naming_the_field(model: dict[str, Any], field_end: str, fragment: str) -> None:
    error = refusal(model)

    assert error.field.startswith("config.model") and error.field.endswith(field_end)
    assert fragment in error.reason


@pytest.mark.parametrize("field", ["api_key", "key", "authorization"])
def test_a_request_carrying_a_key_is_refused_without_echoing_it(field: str) -> None:
    error = refusal({"provider": "openai", "name": "m", field: CANARY})

    assert error.field.endswith(field) and "Extra inputs" in error.reason
    assert CANARY not in str(error) and CANARY not in repr(error)


def test_a_key_given_as_api_key_ref_is_refused_without_echoing_it() -> None:
    error = refusal({"provider": "openai", "name": "m", "api_key_ref": CANARY})

    assert error.field.endswith("api_key_ref") and "must never be the key itself" in error.reason
    assert CANARY not in str(error)


def owned(value: str, *owners: str) -> NamedKey:
    return NamedKey(SecretStr(value), frozenset(owners))


# --- which key, and where it may go ----------------------------------------------------------

NAMED = {"team-b": owned("x" * 20, "team-b"), "shared": owned("y" * 20, "*"), "team-t": owned("z" * 20, "team-test")}


@pytest.mark.parametrize("ref", ["team-b", "team-c", "x" * 20, "teamBsecret123"])
def test_a_key_the_owner_may_not_use_is_refused_alike_whether_it_exists_or_not(ref: str) -> None:
    # Another owner's key, an unknown name, a configured key's value and a wrong guess
    # all get the same answer: nothing tells a tenant which names or values exist.
    keys = ModelKeys(named={**NAMED, "guess": owned("teamBsecret123", "team-b")})
    error = refusal({"provider": "anthropic", "name": "m", "api_key_ref": ref}, keys)

    assert error.field == "config.model.api_key_ref"
    assert error.reason == "no model key of that name is available to this run's owner"
    for secret in ("x" * 20, "teamBsecret123", "team-b", "shared", "team-t"):
        assert secret not in error.reason


def test_a_key_shared_with_every_owner_or_bound_to_this_owner_is_usable() -> None:
    runtime = build_runtime(model_keys=ModelKeys(named=NAMED))
    for ref in ("shared", "team-t"):
        _, prepared = prepare_execution(runtime, run_request({"provider": "openai", "name": "m", "api_key_ref": ref}))
        assert isinstance(prepared.deps.model, OpenAICompatModel)


def test_a_call_never_goes_to_a_base_url_the_deployment_does_not_list() -> None:
    keys = ModelKeys(openai=SecretStr(CANARY), base_urls=("http://vllm.internal:8000/v1",))
    for key_ref in ("default", None):  # with a key or without one (server-side request forgery)
        error = refusal(
            {"provider": "openai", "name": "m", "base_url": "https://attacker.example/v1", "api_key_ref": key_ref}, keys
        )
        assert error.field == "config.model.base_url" and "AIDAWORK_MODEL_BASE_URLS" in error.reason
        assert "vllm.internal" not in error.reason  # the deployment's internal hosts are not listed
        assert CANARY not in str(error)


def test_listed_and_official_base_urls_are_accepted_up_to_case_default_port_and_trailing_slash() -> None:
    keys = ModelKeys(openai=SecretStr(CANARY), base_urls=("http://vllm.internal:8000/v1",))
    runtime = build_runtime(model_keys=keys)
    for url in ("https://API.openai.com/v1/", "https://api.openai.com:443/v1", "http://vllm.internal:8000/v1/"):
        for key_ref in ("default", None):
            prepare_execution(
                runtime, run_request({"provider": "openai", "name": "m", "base_url": url, "api_key_ref": key_ref})
            )


@pytest.mark.parametrize(
    "url",
    [
        "http://vllm.internal:8000/v1?",
        "http://vllm.internal:8000/v1#",
        " http://vllm.internal:8000/v1",
        "http://vllm.internal:8000/v1 ",
        "http://vllm.internal:8000/v1\t",
        "http://user@vllm.internal:8000/v1",
        "http://vllm.internal:8000/v1/../admin",
        "http://vllm.internal:8001/v1",
    ],
)
def test_a_base_url_that_differs_from_a_listed_one_in_any_way_is_refused(url: str) -> None:
    keys = ModelKeys(base_urls=("http://vllm.internal:8000/v1",))
    error = refusal({"provider": "openai", "name": "m", "base_url": url, "api_key_ref": None}, keys)
    assert error.field == "config.model.base_url"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider(add_then_answer)
    yield server
    server.close()


@pytest.mark.parametrize(
    ("provider", "variable"), [("openai", "AIDAWORK_OPENAI_API_KEY"), ("anthropic", "AIDAWORK_ANTHROPIC_API_KEY")]
)
def test_a_missing_default_key_fails_the_run_with_a_typed_error_and_no_call(
    fake: FakeProvider, provider: str, variable: str
) -> None:
    base_url = f"{fake.url}/v1" if provider == "openai" else fake.url
    runtime = build_runtime(model_keys=ModelKeys(base_urls=(base_url,)))  # no keys at all
    run = resolve_and_run(runtime, run_request({"provider": provider, "name": "m", "base_url": base_url}))

    assert isinstance(run.outcome, Fail)
    assert run.outcome.error_code == "MODEL_API_KEY_MISSING"
    assert variable in run.outcome.message
    assert fake.requests == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_tool_using_run_completes_in_process_against_the_loopback_provider(fake: FakeProvider, provider: str) -> None:
    base_url = f"{fake.url}/v1" if provider == "openai" else fake.url
    keys = ModelKeys(named={"team-b": owned("named-key-value-1", "team-test")}, base_urls=(base_url,))
    model = {"provider": provider, "name": "m", "base_url": base_url, "api_key_ref": "team-b"}
    run = resolve_and_run(build_runtime(model_keys=keys), run_request(model))

    assert run.outcome == Finish(output="The sum is 5.")
    assert run.rounds == 2 and len(fake.requests) == 2
    header = "authorization" if provider == "openai" else "x-api-key"
    expected = "Bearer named-key-value-1" if provider == "openai" else "named-key-value-1"
    assert [r.headers[header] for r in fake.requests] == [expected, expected]
    # The add tool really ran: its result is what the second request carries.
    assert '{"sum":5}' in str(fake.requests[1].body["messages"][-1])


# --- settings ----------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AIDAWORK_"):
            monkeypatch.delenv(name)


def test_keys_and_base_urls_are_read_from_the_environment_and_masked(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIDAWORK_OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("AIDAWORK_ANTHROPIC_API_KEY", "sk-ant-canary")
    monkeypatch.setenv("AIDAWORK_MODEL_KEYS", '{"team-b": "sk-named-canary"}')
    monkeypatch.setenv("AIDAWORK_MODEL_BASE_URLS", '["http://127.0.0.1:8000/v1"]')
    settings = load_settings()

    assert settings.openai_api_key is not None and settings.openai_api_key.get_secret_value() == CANARY
    assert settings.anthropic_api_key is not None
    assert settings.model_keys["team-b"].get_secret_value() == "sk-named-canary"
    assert settings.model_base_urls == ["http://127.0.0.1:8000/v1"]
    for text in (repr(settings), str(settings), str(settings.model_dump())):
        assert CANARY not in text and "sk-ant-canary" not in text and "sk-named-canary" not in text


def test_defaults_have_no_keys(clean_env: None) -> None:
    settings = load_settings()
    assert (settings.openai_api_key, settings.anthropic_api_key, settings.model_keys, settings.model_base_urls) == (
        None,
        None,
        {},
        [],
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AIDAWORK_MODEL_KEYS", '{"default": "sk-x"}'),
        ("AIDAWORK_MODEL_KEYS", '{"has space": "sk-x"}'),
        ("AIDAWORK_MODEL_BASE_URLS", '["ftp://h"]'),
        ("AIDAWORK_MODEL_BASE_URLS", '["https://h/v1?key=sk-x"]'),
        ("AIDAWORK_MODEL_KEYS", '{"b": "sk-x"'),
        ("AIDAWORK_MODEL_KEYS", '{"b": {"key": "sk-x", "owners": []}}'),
        ("AIDAWORK_MODEL_KEYS", '{"b": {"key": "sk-x", "owners": ["bad owner"]}}'),
        ("AIDAWORK_MODEL_KEYS", '{"b": {"key": "sk-x", "owner": ["b"]}}'),
        ("AIDAWORK_MODEL_BASE_URLS", '["https://h/v1", sk-x'),
    ],
    ids=[
        "reserved_name",
        "bad_name",
        "ftp_url",
        "url_with_query",
        "keys_invalid_json",
        "no_owners",
        "bad_owner",
        "misspelt_field",
        "urls_invalid_json",
    ],
)
def test_bad_key_settings_are_refused_naming_the_variable(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert variable in str(info.value)
    assert "sk-x" not in str(info.value)


def test_key_entries_bind_owners_and_plain_keys_belong_to_their_name(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIDAWORK_MODEL_KEYS",
        json.dumps({"team-b": {"key": "sk-b-canary", "owners": ["team-b", "team-c"]}, "all": {"key": "sk-shared",
                    "owners": ["*"]}, "team-d": "sk-d-canary"}),
    )
    settings = load_settings()

    owners = {name: (key.get_secret_value(), o) for name, (key, o) in settings.named_model_keys.items()}
    assert owners == {
        "team-b": ("sk-b-canary", ["team-b", "team-c"]),
        "all": ("sk-shared", ["*"]),
        "team-d": ("sk-d-canary", ["team-d"]),
    }
    assert "sk-b-canary" not in repr(settings) and "sk-d-canary" not in str(settings.model_dump())


def test_keys_lose_surrounding_whitespace_from_key_files(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_OPENAI_API_KEY", f"  {CANARY}\n")
    monkeypatch.setenv("AIDAWORK_MODEL_KEYS", json.dumps({"b": f"{CANARY}\n"}))
    settings = load_settings()

    assert settings.openai_api_key is not None and settings.openai_api_key.get_secret_value() == CANARY
    assert settings.model_keys["b"].get_secret_value() == CANARY


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AIDAWORK_OPENAI_API_KEY", "sk-canary XYZ"),
        ("AIDAWORK_ANTHROPIC_API_KEY", "sk-canary-\u00e9XYZ"),
        ("AIDAWORK_MODEL_KEYS", json.dumps({"b": "sk-canary\u0007XYZ"})),
        ("AIDAWORK_OPENAI_API_KEY", "   "),
    ],
    ids=["space", "non_ascii", "control", "blank"],
)
def test_a_key_that_cannot_be_an_http_header_is_refused_at_startup(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert variable in str(info.value) and "printable ASCII" in str(info.value)
    assert "canary" not in str(info.value)


# --- retry timing --------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(base_s=0.5, cap_s=4.0)
    assert [backoff_s(n, policy, rand=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert [backoff_s(n, policy, rand=lambda: 0.0) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    draws = {backoff_s(3, policy) for _ in range(50)}
    assert len(draws) > 1 and all(1.0 <= d <= 2.0 for d in draws)

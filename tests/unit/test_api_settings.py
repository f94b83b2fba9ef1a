"""AIDAWORK_API_* settings: the token map is parsed and checked at start-up, errors name
the variable and never echo a token, and the token table keeps no raw token."""

from __future__ import annotations

import json
import os

import pytest

from worker.api.auth import TokenTable
from worker.ops.settings import SettingsError, load_settings

TOKEN = "tok-" + "s3cr3t" * 4


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AIDAWORK_"):
            monkeypatch.delenv(name)


def test_api_defaults() -> None:
    settings = load_settings()

    assert settings.api_tokens is None
    assert settings.api_token_owners == {}
    assert settings.api_max_body_bytes == 2 * 1024 * 1024


def test_tokens_map_to_owners_and_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_API_TOKENS", json.dumps({TOKEN: "team-a", TOKEN + "2": "team-a", "x" * 16: "b"}))
    settings = load_settings()

    assert settings.api_token_owners == {TOKEN: "team-a", TOKEN + "2": "team-a", "x" * 16: "b"}
    assert TOKEN not in repr(settings) and TOKEN not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps([TOKEN]), "JSON object"),
        (json.dumps({"short-" + "s3cr3t": "team-a"}), "at least 16 characters"),
        (json.dumps({TOKEN + " x": "team-a"}), "without spaces"),
        (json.dumps({TOKEN: "team a"}), "not a valid owner"),
        (json.dumps({TOKEN: 7}), "must be a string"),
    ],
)
def test_a_bad_token_map_is_refused_naming_the_variable_not_the_token(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv("AIDAWORK_API_TOKENS", value)

    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "AIDAWORK_API_TOKENS" in message and expected in message
    assert "s3cr3t" not in message


def test_body_limit_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_API_MAX_BODY_BYTES", "10")

    with pytest.raises(SettingsError, match="AIDAWORK_API_MAX_BODY_BYTES"):
        load_settings()


def test_token_table_finds_owners_by_digest_only() -> None:
    table = TokenTable({TOKEN: "team-a"})

    assert table.owner_of(TOKEN) == "team-a"
    assert table.owner_of(TOKEN[:-1]) is None
    assert table.owner_of("") is None
    assert len(table) == 1
    assert TOKEN not in repr(vars(table)) and TOKEN.encode() not in repr(vars(table)).encode()


def test_slow_and_greedy_client_limits_have_defaults_and_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_settings()
    assert (defaults.api_header_timeout_s, defaults.api_body_timeout_s, defaults.api_body_min_bytes_per_s) == (
        10.0,
        10.0,
        65_536,
    )
    assert (defaults.api_max_connections, defaults.api_max_streams_per_token, defaults.api_docs) == (1000, 8, True)

    for name, value in {
        "AIDAWORK_API_HEADER_TIMEOUT_S": "1.5",
        "AIDAWORK_API_BODY_TIMEOUT_S": "2",
        "AIDAWORK_API_BODY_MIN_BYTES_PER_S": "100",
        "AIDAWORK_API_MAX_CONNECTIONS": "50",
        "AIDAWORK_API_MAX_STREAMS_PER_TOKEN": "3",
        "AIDAWORK_API_DOCS": "0",
    }.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()

    assert (settings.api_header_timeout_s, settings.api_body_timeout_s, settings.api_body_min_bytes_per_s) == (
        1.5,
        2.0,
        100,
    )
    assert (settings.api_max_connections, settings.api_max_streams_per_token, settings.api_docs) == (50, 3, False)


@pytest.mark.parametrize(
    "name", ["AIDAWORK_API_HEADER_TIMEOUT_S", "AIDAWORK_API_MAX_CONNECTIONS", "AIDAWORK_API_MAX_STREAMS_PER_TOKEN"]
)
def test_a_zero_limit_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "0")

    with pytest.raises(SettingsError, match=name):
        load_settings()

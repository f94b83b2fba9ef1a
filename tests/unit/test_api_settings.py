"""AIDAWORK_API_* settings: the token map is parsed and checked at start-up, errors name
the variable and never echo a token, and the token table keeps no raw token."""

from __future__ import annotations

import json
import os

import pytest

from worker.api import TokenTable
from worker.settings import SettingsError, load_settings

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

"""Settings from the environment: defaults, and errors that name the variable."""

from __future__ import annotations

import os

import pytest

from worker.ops.settings import FAILPOINTS, SettingsError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/conftest.py sets AIDAWORK_BROKER_URL for the e2e tests; start from nothing.
    for name in list(os.environ):
        if name.startswith("AIDAWORK_"):
            monkeypatch.delenv(name)


def test_defaults_point_at_127_0_0_1() -> None:
    settings = load_settings()

    assert "@127.0.0.1:5432/" in settings.database_url
    assert settings.broker_url.startswith("redis://127.0.0.1:6379/")
    assert settings.secret_key is None
    assert settings.failpoint_set == frozenset()
    assert settings.lease_s == 30.0
    assert settings.lease_renew_s == pytest.approx(10.0)


def test_values_are_read_from_aidawork_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_LEASE_S", "6")
    monkeypatch.setenv("AIDAWORK_WORKER_CONCURRENCY", "4")
    monkeypatch.setenv("AIDAWORK_BROKER_URL", "redis://10.0.0.1:6379/3")
    settings = load_settings()

    assert settings.lease_s == 6.0
    assert settings.lease_renew_s == pytest.approx(2.0)
    assert settings.worker_concurrency == 4
    assert settings.broker_url == "redis://10.0.0.1:6379/3"


def test_invalid_lease_raises_settings_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_LEASE_S", "abc")

    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "AIDAWORK_LEASE_S" in str(info.value)


def test_every_invalid_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_LEASE_S", "0.1")  # must be > 0.5
    monkeypatch.setenv("AIDAWORK_LOG_LEVEL", "LOUD")

    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "AIDAWORK_LEASE_S" in str(info.value)
    assert "AIDAWORK_LOG_LEVEL" in str(info.value)


def test_unknown_failpoint_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_FAILPOINTS", "after_commit,befor_commit")

    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "befor_commit" in str(info.value)


def test_unknown_failpoint_error_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module promises "Errors name the variable"; the failpoints check runs in a
    # model validator whose error has an empty loc, so the message says "settings:".
    monkeypatch.setenv("AIDAWORK_FAILPOINTS", "bogus")

    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "AIDAWORK_FAILPOINTS" in str(info.value)


def test_known_failpoints_are_parsed_from_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_FAILPOINTS", " after_commit , after_claim,,")

    assert load_settings().failpoint_set == frozenset({"after_commit", "after_claim"})
    assert frozenset({"after_commit", "after_claim"}) <= FAILPOINTS


def test_a_failpoint_may_be_scoped_to_one_owners_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.engine import failpoints

    monkeypatch.setenv("AIDAWORK_FAILPOINTS", "after_model_call@team-poison,after_commit")
    settings = load_settings()
    assert settings.failpoint_set == frozenset({"after_model_call@team-poison", "after_commit"})
    exits: list[int] = []
    monkeypatch.setattr(failpoints, "get_settings", lambda: settings)
    monkeypatch.setattr(failpoints.os, "_exit", exits.append)

    failpoints.hit("after_model_call", owner="team-healthy")
    failpoints.hit("after_model_call")
    assert exits == []
    failpoints.hit("after_model_call", owner="team-poison")
    failpoints.hit("after_commit", owner="team-healthy")  # unscoped: every run
    assert exits == [failpoints.EXIT_CODE, failpoints.EXIT_CODE]


def test_a_scoped_failpoint_with_an_unknown_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_FAILPOINTS", "after_modle_call@team-poison")

    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "after_modle_call" in str(info.value)


def test_worker_beat_and_api_need_the_secret_unless_in_development(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = load_settings().secret_problem()
    assert problem is not None and "AIDAWORK_SECRET_KEY" in problem and "AIDAWORK_DEV" in problem

    monkeypatch.setenv("AIDAWORK_DEV", "1")
    assert load_settings().secret_problem() is None

    monkeypatch.delenv("AIDAWORK_DEV")
    monkeypatch.setenv("AIDAWORK_SECRET_KEY", "s" * 32)
    assert load_settings().secret_problem() is None

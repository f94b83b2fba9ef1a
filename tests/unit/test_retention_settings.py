"""AIDAWORK_RETENTION_DAYS and ``aidawork prune --older-than-days``: what they accept."""

from __future__ import annotations

import pytest

from worker.ops.retention import older_than_days_arg
from worker.ops.settings import Settings, SettingsError, load_settings


def test_retention_is_unset_by_default_and_an_empty_value_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().retention_days is None and Settings().retention_s is None
    monkeypatch.setenv("AIDAWORK_RETENTION_DAYS", "")
    assert load_settings().retention_days is None


def test_fractional_days_are_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_RETENTION_DAYS", "0.5")
    assert load_settings().retention_s == 43_200


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "40000"])
def test_a_retention_that_is_no_positive_number_of_days_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("AIDAWORK_RETENTION_DAYS", value)
    with pytest.raises(SettingsError, match="AIDAWORK_RETENTION_DAYS"):
        load_settings()


@pytest.mark.parametrize("value", ["0", "-2", "x", "nan", "inf", "1e9"])
def test_older_than_days_must_be_a_positive_number_ofolder_than_days_arg(value: str) -> None:
    with pytest.raises(ValueError, match="--older-than-days"):
        older_than_days_arg(value)
    assert older_than_days_arg("0.25") == 0.25

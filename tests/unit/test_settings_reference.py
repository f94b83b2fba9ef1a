"""The settings reference (docs/reference_gen/settings.py) is generated from the settings
model: every field says what it means, and the page names every field's variable and
never a secret's value."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from worker.ops.settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def generator():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(DOCS))
    try:
        from reference_gen import settings as generator

        yield generator
    finally:
        sys.path.remove(str(DOCS))


def test_every_setting_has_a_description() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    assert missing == []


def test_the_page_names_every_settings_variable(generator) -> None:  # type: ignore[no-untyped-def]
    page = generator.page()

    for name, field in Settings.model_fields.items():
        assert f"`{generator.env_name(name, field)}`" in page, name
    assert "`AIDAWORK_LEASE_S`" in page and "`OTEL_EXPORTER_OTLP_ENDPOINT`" in page
    assert page.startswith("# Settings\n\n_Generated from ")


def test_types_defaults_and_constraints_are_readable(generator) -> None:  # type: ignore[no-untyped-def]
    fields = Settings.model_fields

    assert generator.type_name(fields["lease_s"].annotation) == "float"
    assert generator.type_name(fields["secret_key"].annotation) == "SecretStr | None"
    assert generator.type_name(fields["model_base_urls"].annotation) == "list[str]"
    assert generator.default_of(fields["lease_s"]) == "`30.0`"
    assert generator.constraints_of(fields["lease_s"]) == "> 0.5, ≤ 3600"
    assert "matches" in generator.constraints_of(fields["log_level"])


def test_a_secrets_default_is_never_shown(generator) -> None:  # type: ignore[no-untyped-def]
    class WithSecretDefault(Settings):
        leaked: SecretStr = SecretStr("sk-not-for-the-docs")

    assert generator.default_of(WithSecretDefault.model_fields["leaked"]) == "unset"
    assert generator.default_of(Settings.model_fields["webhook_secret"]) == "unset"

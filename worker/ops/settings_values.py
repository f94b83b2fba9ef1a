"""The values of settings that need more than a type: JSON-valued settings, model key
entries, API tokens. Reads nothing from the environment (``worker.ops.settings`` does)."""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError, field_validator

from runtime.models.keys import ANY_OWNER
from schema.wire import RunRequest

MIN_API_TOKEN_CHARS = 16
# An API token's owner is stored as runs.owner: the same rules as a run request's owner.
OWNER_NAME = TypeAdapter(Annotated[str, RunRequest.model_fields["owner"]])


class ModelKeyEntry(BaseModel):
    """One entry of ``AIDAWORK_MODEL_KEYS`` in its full form: the key and the owners
    whose runs may use it (``["*"]``: every owner, shared on purpose)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    key: SecretStr
    owners: list[str] = Field(min_length=1)

    @field_validator("owners")
    @classmethod
    def _owners(cls, value: list[str]) -> list[str]:
        for owner in value:
            if owner != ANY_OWNER:
                try:
                    OWNER_NAME.validate_python(owner)
                except ValidationError:
                    raise ValueError(f"{owner!r} is not a valid owner (letters, digits, ._:@-; 1-128) or '*'") from None
        return value


def json_setting(value: object, expected: str) -> object:
    """A JSON-valued setting, parsed here rather than by pydantic-settings, so that
    invalid JSON is a validation error naming the variable, not a traceback."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value) if value.strip() else None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos}); expected {expected}") from None


def parse_api_tokens(raw: str) -> dict[str, str]:
    """Parse AIDAWORK_API_TOKENS. Error messages never contain a token."""
    try:
        data = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos}); expected {{token: owner}}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object {token: owner}")
    for i, (token, owner) in enumerate(data.items()):
        if len(token) < MIN_API_TOKEN_CHARS or token != token.strip() or any(c.isspace() for c in token):
            raise ValueError(f"token #{i + 1} must be at least {MIN_API_TOKEN_CHARS} characters, without spaces")
        if not isinstance(owner, str):
            raise ValueError(f"the owner of token #{i + 1} must be a string")
        try:
            OWNER_NAME.validate_python(owner)
        except ValidationError:
            raise ValueError(
                f"the owner of token #{i + 1} ({owner!r}) is not a valid owner (letters, digits, ._:@-; 1-128)"
            ) from None
    return dict(data)

"""Reference of the settings, read from the settings model (``worker.ops.settings.Settings``):
each field's environment variable, type, default, constraints and description."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic.fields import FieldInfo

from reference_gen import cell, code, header, table

# Sections of the page, by the field name's prefix, in the order the page shows them
# (first match wins; a field matching none is "General").
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Database and broker", ("database_", "broker_")),
    ("Rounds and workers", ("lease_", "dispatch_", "reconcile_", "round_", "max_", "worker_")),
    ("Model providers", ("openai_", "anthropic_", "model_")),
    ("MCP toolsets", ("mcp_",)),
    ("HTTP API", ("api_", "idempotency_")),
    ("Webhooks", ("webhook_",)),
    ("Retention", ("retention_",)),
    ("Observability", ("log_", "metrics_", "otel_", "flower_")),
)
CONSTRAINTS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥", "max_length": "length ≤"}


def env_name(name: str, field: FieldInfo) -> str:
    """The variable a field is read from: its alias when it has one (the standard OTEL_*
    variables), else the prefix and its name in capitals."""
    from worker.ops.settings import ENV_PREFIX

    alias = field.validation_alias
    return alias if isinstance(alias, str) else f"{ENV_PREFIX}{name.upper()}"


def type_name(annotation: Any) -> str:
    """A readable type: ``float``, ``str | None``, ``SecretStr``, ``dict[str, RateLimit]``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in typing.get_args(annotation))}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _is_secret(annotation: Any) -> bool:
    return "SecretStr" in type_name(annotation)


def default_of(field: FieldInfo) -> str:
    """The default as the environment would spell it; a secret's is never shown."""
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, (str, dict, list)) and not value:
        return "empty"
    if _is_secret(field.annotation):
        return "unset"
    if isinstance(value, bool):
        return code(str(value).lower())
    return code(value)


def constraints_of(field: FieldInfo) -> str:
    found = []
    for item in field.metadata:
        for attr, sign in CONSTRAINTS.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            found.append(f"matches {code(pattern)}")
    return ", ".join(found)


def _group(name: str) -> str:
    return next((title for title, prefixes in GROUPS if name.startswith(prefixes)), "General")


def rows() -> dict[str, list[list[str]]]:
    from worker.ops.settings import Settings

    grouped: dict[str, list[list[str]]] = {title: [] for title in ("General", *(t for t, _ in GROUPS))}
    for name, field in Settings.model_fields.items():
        grouped[_group(name)].append([
            code(env_name(name, field)),
            code(type_name(field.annotation)),
            default_of(field),
            constraints_of(field),
            cell(field.description or ""),
        ])
    return {title: found for title, found in grouped.items() if found}


def page() -> str:
    from worker.ops.settings import ENV_PREFIX

    text = header(
        "Settings",
        "`worker.ops.settings.Settings` (its fields, types, defaults, constraints and descriptions)",
        f"Every process reads its settings from the environment: `{ENV_PREFIX}` and the name in capitals, except "
        "the standard `OTEL_*` variables. A value out of its constraints stops the process with an error naming "
        "the variable. Secrets are never shown, logged or echoed. A JSON-valued setting is given as a JSON string.",
    )
    for title, found in rows().items():
        text += f"## {title}\n\n" + table(["variable", "type", "default", "constraints", "meaning"], found) + "\n"
    return text



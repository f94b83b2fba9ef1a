"""Saved agents for ``worker.client``: each spec checked like a run's config before the
store sees it (``prepare_turn``: provider, tools, client tools, a scripted model's calls),
stored normalised (the ``TurnConfig`` as JSON), so what a run resolves is a config that
validated. Every refusal is ``RequestInvalid`` naming the field, and stores nothing."""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import ValidationError

from runtime.canonical import require_json
from runtime.config import TurnConfig
from runtime.errors import RequestInvalid
from runtime.prepare import invalid_from, prepare_turn
from schema.wire.agents import AGENT_NAME_PATTERN, OVERRIDE_PATH_PATTERN, AgentChange, AgentSpec, AgentView
from schema.wire.json import JsonObject
from worker.client.context import ClientContext

_NAME = re.compile(AGENT_NAME_PATTERN)
_PATH = re.compile(OVERRIDE_PATH_PATTERN)
_CONFIG_FIELDS = frozenset(TurnConfig.model_fields)


def check_agent_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RequestInvalid(
            "name", "must be a letter, then up to 63 letters, digits, '_' or '-' (it is a tool name in MCP)"
        )
    return name


def _check_overridable(paths: list[str]) -> None:
    for i, path in enumerate(paths):
        if not _PATH.fullmatch(path):
            raise RequestInvalid(f"overridable[{i}]", f"{path!r} is not a dotted config path (model.temperature)")
        if path.split(".")[0] not in _CONFIG_FIELDS:
            known = ", ".join(sorted(_CONFIG_FIELDS))
            raise RequestInvalid(f"overridable[{i}]", f"{path!r} is not under a config field ({known})")


def checked_spec(ctx: ClientContext, owner: str, raw: object) -> JsonObject:
    """The spec as stored: its config validated and normalised, or ``RequestInvalid``."""
    if not isinstance(raw, Mapping):
        raise RequestInvalid("agent", "must be a JSON object {description, config, overridable}")
    require_json(dict(raw), "")
    try:
        spec = AgentSpec.model_validate(dict(raw))
    except ValidationError as exc:
        raise invalid_from(exc) from None
    _check_overridable(spec.overridable)
    turn_config = prepare_turn(ctx.runtime, spec.config, owner).turn_config
    return {
        "description": spec.description,
        "config": turn_config.model_dump(mode="json"),
        "overridable": list(dict.fromkeys(spec.overridable)),
    }


def changed_spec(latest: AgentView, raw: object) -> JsonObject:
    """The latest version's spec with the change applied (not yet checked)."""
    if not isinstance(raw, Mapping):
        raise RequestInvalid("change", "must be a JSON object {description?, config?, overridable?}")
    require_json(dict(raw), "")
    try:
        change = AgentChange.model_validate(dict(raw))
    except ValidationError as exc:
        raise invalid_from(exc) from None
    if change.description is None and change.config is None and change.overridable is None:
        raise RequestInvalid("change", "nothing to change: send description, config or overridable")
    return {
        "description": latest.description if change.description is None else change.description,
        "config": dict(latest.config if change.config is None else change.config),
        "overridable": list(latest.overridable if change.overridable is None else change.overridable),
    }

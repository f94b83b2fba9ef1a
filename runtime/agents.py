"""A saved agent's config with a run's overrides applied: pure, so the submit path, the
deploy check and the tests share one rule.

An override is a JSON object shaped like the config. Objects merge key by key; any other
value (a string, a number, a list, null) replaces what is there. Every value it sets must
lie under one of the agent's ``overridable`` paths (``model.temperature`` allows that
field, ``policy`` everything under it); the merged config is then validated like any
run's config, so an override can never produce a config the agent could not have."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from runtime.canonical import join_path
from runtime.errors import RequestInvalid
from schema.wire.agents import AgentView
from schema.wire.json import JsonMapping, JsonObject, JsonValue


def _leaves(value: JsonMapping, path: str = "") -> Iterator[tuple[str, JsonValue]]:
    for key, item in value.items():
        here = join_path(path, key)
        if isinstance(item, Mapping) and item:
            yield from _leaves(item, here)
        else:
            yield here, item


def allowed(path: str, overridable: list[str]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in overridable)


def _merged(base: JsonMapping, change: JsonMapping) -> JsonObject:
    out: JsonObject = dict(base)
    for key, value in change.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            out[key] = _merged(current, value)
        else:
            out[key] = value
    return out


def apply_overrides(agent: AgentView, overrides: JsonMapping | None) -> JsonObject:
    """The agent's config with ``overrides`` merged in, or ``RequestInvalid`` naming the
    first path (``overrides.model.name``) the agent does not let a run set."""
    if not overrides:
        return dict(agent.config)
    for path, _ in _leaves(overrides):
        if not allowed(path, agent.overridable):
            shown = ", ".join(agent.overridable) or "nothing"
            raise RequestInvalid(
                f"overrides.{path}", f"agent {agent.name!r} does not let a run override {path!r} (it allows: {shown})"
            )
    return _merged(agent.config, overrides)


def blamed_on_overrides(exc: RequestInvalid, overrides: JsonMapping | None) -> RequestInvalid:
    """``exc`` about the merged config, naming ``overrides.<path>`` when a value the run's
    overrides set is what failed (the agent's own config validated when it was saved)."""
    if not overrides or not exc.field.startswith("config."):
        return exc
    path = exc.field.removeprefix("config.")
    for leaf, _ in _leaves(overrides):
        if path == leaf or path.startswith(leaf + ".") or path.startswith(leaf + "[") or leaf.startswith(path + "."):
            return RequestInvalid(f"overrides.{path}", exc.reason)
    return exc

"""Saved agents: a named, versioned run configuration of one owner (what other systems
call an assistant). Every change makes a new immutable version; a run names
``"NAME"`` (the latest version) or ``"NAME@VERSION"`` in place of ``config``, and may
override only the config paths the agent lists in ``overridable``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from schema.wire.json import JsonObjectField

AGENT_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
# A reference to a saved agent in a run request: its name, or its name and a version.
AGENT_REF_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}(@[1-9][0-9]{0,8})?$"
MAX_AGENT_DESCRIPTION_CHARS = 10_000
# A dotted path into the run config (``system_prompt``, ``model.temperature``, ``policy``).
OVERRIDE_PATH_PATTERN = r"^[a-z_]+(\.[a-z_]+)*$"
MAX_OVERRIDABLE = 32


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentSpec(_Wire):
    """What ``agent create`` takes: the run config (a ``TurnConfig``, validated like a run's:
    model, system prompt, tools and toolsets, client tools, policy and its approvals), a
    description (the card and the MCP tool show it), and the config paths a run may
    override."""

    description: str = Field(default="", max_length=MAX_AGENT_DESCRIPTION_CHARS)
    config: JsonObjectField
    overridable: list[str] = Field(
        default_factory=list,
        max_length=MAX_OVERRIDABLE,
        description="dotted paths into config that a run's overrides may set (system_prompt, model.temperature, "
        "policy); a path allows everything under it",
    )


class AgentChange(_Wire):
    """What ``agent update`` takes: the fields to change; the others are kept from the
    latest version."""

    description: str | None = Field(default=None, max_length=MAX_AGENT_DESCRIPTION_CHARS)
    config: JsonObjectField | None = None
    overridable: list[str] | None = Field(default=None, max_length=MAX_OVERRIDABLE)


class AgentView(_Wire):
    """One version of a saved agent, as stored."""

    owner: str
    name: str
    version: int
    description: str
    config: JsonObjectField
    overridable: list[str]
    created_at: datetime

    @property
    def ref(self) -> str:
        """``NAME@VERSION``: what a run records."""
        return f"{self.name}@{self.version}"

"""The deploy gate's record (``aidawork deploy-check``): what it reads of each run that has not
ended, and what it reports. ``DeployReport`` is the ``--json`` output, a stable shape for CI
(docs/how-to/deploy-check.md): fields are only ever added."""

from __future__ import annotations

from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from schema.wire import RunStatus
from schema.wire.json import JsonObjectField


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PendingCall(_Wire):
    """A suspended tool call of the run's current round: it runs (or is answered) when the
    run resumes, on whichever worker takes the resume."""

    tool_call_id: str
    tool_name: str
    kind: str  # what it waits for: local_read | prerequisite | client_tool | approval | outcome_unknown
    args: JsonObjectField  # as it will run: as a person approved them (maybe edited), else as proposed


class UnendedRun(_Wire):
    """A run that is queued, running or suspended, as stored."""

    run_id: UUID
    owner: str
    status: RunStatus
    agent: str | None  # NAME@VERSION of the saved agent it was made from
    config: JsonObjectField  # the stored run config (a saved agent's already resolved)
    pending_calls: list[PendingCall]


class IncompatibilityKind(StrEnum):
    TOOL_MISSING = "tool_missing"  # a tool the config enables, or a pending call waits on, is gone
    TOOL_ARGS_REJECTED = "tool_args_rejected"  # a pending call's args no longer fit its tool's schema
    MODEL_UNAVAILABLE = "model_unavailable"  # the config's provider or model is not configured
    AGENT_VERSION_GONE = "agent_version_gone"  # the saved agent version the run names will not exist
    CONFIG_INVALID = "config_invalid"  # the stored config no longer validates, for another reason


class Incompatibility(_Wire):
    kind: IncompatibilityKind
    # Where: a config path (``config.tools[1]``, ``config.model.provider``), a pending call's
    # (``pending_calls[call_0_0].args.text``) or ``agent``.
    field: str
    message: str
    tool_call_id: str | None = None  # the pending call it is about, if any


class RunReport(_Wire):
    run_id: UUID
    owner: str
    status: RunStatus
    agent: str | None
    problems: list[Incompatibility]


class DeployReport(_Wire):
    """``compatible`` is true when no run is affected (the command exits 0, else 1)."""

    compatible: bool
    checked: int  # runs not ended
    affected: int  # of those, runs with at least one problem
    plugins: list[str]  # the plugins the check loaded, in load order
    agents_dir: str | None  # --agents, when given
    runs: list[RunReport]  # the affected runs only, oldest first

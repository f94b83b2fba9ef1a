"""OrchestratorDeps: everything one run's rounds consume, composed once per run from the
process's base deps and the run's config (``runtime.deps.compose_deps``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from runtime.config import Policy
from runtime.models.base import ModelClient
from runtime.models.limits import CallLimitKey
from runtime.proofs import ProofAuthority
from runtime.tools import Tool
from schema.wire.json import JsonObject


@dataclass(frozen=True)
class OrchestratorDeps:
    """Everything ``drive_react_loop`` consumes for one run: model, tools, prompt, policy,
    and the digests of the prompt and tool set (fixed for the run, computed once)."""

    model: ModelClient
    tools: Mapping[str, Tool]
    system_prompt: str
    policy: Policy
    tool_specs: tuple[JsonObject, ...]
    system_digest: str
    tools_digest: str
    proofs: ProofAuthority
    # What the run's model calls are reported as (metrics labels, GenAI span attributes):
    # the provider and the provider's model name (the provider again when it has none).
    provider: str = "unknown"
    model_name: str = "unknown"
    # The run's model config as validated (a ``ModelConfig`` or a plugin's): what the
    # calls ask for (base URL, output limit, temperature), reported on their spans.
    model_config: BaseModel | None = None
    # What the run's model calls count against in the fleet's provider rate limits (None:
    # a provider without a configured key, never limited).
    call_limit: CallLimitKey | None = None
    # The most one model call can write (its output limit, or runtime.budget's documented
    # default): the output part of the estimate a call reserves against its owner's budget.
    max_output_tokens: int = 0

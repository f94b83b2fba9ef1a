"""The Runtime (built once per process) and the per-run OrchestratorDeps.

``Runtime`` keeps the shared base dependencies (model providers, tool registry, proof
authority) apart from ``contexts`` (conversation memory: the per-process cache of run
contexts), so a test can swap one without rebuilding the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.canonical import digest
from runtime.config import TurnConfig
from runtime.memory import ContextCache
from runtime.models.anthropic import AnthropicProvider
from runtime.models.base import ModelClient
from runtime.models.keys import ModelKeys
from runtime.models.openai_compat import OpenAIProvider
from runtime.models.scripted import ScriptedModel
from runtime.proofs import ProofAuthority
from runtime.run_deps import OrchestratorDeps
from runtime.tools import Tool, ToolRegistry, builtin_registry

__all__ = ["OrchestratorDeps"]  # re-exported: composed here, defined apart (no cycle with the cache)

# Builds one run's model client from its model config and the run's owner (whose keys
# the client may use).
ModelFactory = Callable[[Any, str], ModelClient]


def scripted_model(config: Any, owner: str) -> ModelClient:
    return ScriptedModel(config)


def default_model_providers(model_keys: ModelKeys | None = None) -> dict[str, ModelFactory]:
    """Every provider this process can run. The HTTP providers get the deployment's keys
    (``ModelKeys``; none by default) and check a run's ``api_key_ref`` and ``base_url``
    against them when the run is prepared."""
    keys = model_keys or ModelKeys()
    return {"scripted": scripted_model, "openai": OpenAIProvider(keys), "anthropic": AnthropicProvider(keys)}


# For in-process use and tests only; workers are given AIDAWORK_SECRET_KEY.
DEV_SECRET = b"aidawork-development-secret-do-not-use-in-production"


@dataclass(frozen=True)
class BaseDeps:
    model_providers: Mapping[str, ModelFactory]
    tools: ToolRegistry
    proofs: ProofAuthority = field(default_factory=lambda: ProofAuthority(DEV_SECRET))


@dataclass(frozen=True)
class Runtime:
    base: BaseDeps
    contexts: ContextCache = field(default_factory=ContextCache)


def build_runtime(
    *,
    secret: bytes = DEV_SECRET,
    memory_capacity: int = 1024,
    model_keys: ModelKeys | None = None,
) -> Runtime:
    return Runtime(
        base=BaseDeps(
            model_providers=default_model_providers(model_keys),
            tools=builtin_registry(),
            proofs=ProofAuthority(secret),
        ),
        contexts=ContextCache(capacity=memory_capacity),
    )


def compose_deps(runtime: Runtime, turn_config: TurnConfig, owner: str) -> OrchestratorDeps:
    """Combine the process's base deps with one owner's run config. Names must already
    be valid (``prepare_execution`` checks them); a missing one here is a bug."""
    factory = runtime.base.model_providers[turn_config.model.provider]
    tools: dict[str, Tool] = {}
    for name in turn_config.tools:
        tool = runtime.base.tools.get(name)
        if tool is None:
            raise KeyError(name)
        tools[name] = tool
    specs = tuple(tool.spec() for tool in tools.values())
    return OrchestratorDeps(
        model=factory(turn_config.model, owner),
        tools=tools,
        system_prompt=turn_config.system_prompt,
        policy=turn_config.policy,
        tool_specs=specs,
        system_digest=digest(turn_config.system_prompt),
        tools_digest=digest(list(specs)),
        proofs=runtime.base.proofs,
    )

"""The Runtime (built once per process) and the per-run OrchestratorDeps.

``Runtime`` keeps the shared base dependencies (model providers, tool registry, proof
authority) apart from ``contexts`` (conversation memory: the per-process cache of run
contexts), so a test can swap one without rebuilding the other.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from pydantic import BaseModel

from runtime.budget import max_output_tokens
from runtime.canonical import digest
from runtime.config import ClientToolSpec, ScriptedModelConfig, TurnConfig, turn_config_with
from runtime.memory import ContextCache
from runtime.models.base import ModelClient, ModelFactory
from runtime.models.keys import ModelKeys
from runtime.models.limits import call_limit_key
from runtime.models.scripted import ScriptedModel
from runtime.plugins import PluginError, Plugins
from runtime.proofs import ProofAuthority
from runtime.run_deps import OrchestratorDeps
from runtime.tools import NeedsInput, Tool, ToolContext, ToolRegistry, ToolSuspension, builtin_registry
from runtime.tools.base import ToolResolver
from schema.wire.vocab import ToolDomain

# Re-exported: composed here, defined apart (no cycle with the cache; the factory's type is
# the plugins' too).
__all__ = ["ModelFactory", "OrchestratorDeps"]


def scripted_model(config: ScriptedModelConfig, owner: str) -> ModelClient:
    return ScriptedModel(config)


class _Provider(Protocol):
    """What a provider module's provider class makes: a factory with clients to close."""

    def __call__(self, config: BaseModel, owner: str) -> ModelClient: ...

    def close(self) -> None: ...


class LazyProvider:
    """A provider whose module (and the official SDK it is built on) is imported when its
    first run is prepared: the ``openai`` and ``anthropic`` packages cost more to import
    than the rest of a worker, the API or the CLI together, and many processes never call
    a real provider (a worker's first run on one waits for that import, once)."""

    def __init__(self, module: str, name: str, keys: ModelKeys) -> None:
        self._module, self._name, self._keys = module, name, keys
        self._lock = threading.Lock()
        self._provider: _Provider | None = None

    def __repr__(self) -> str:
        return f"{self._name}()"

    def _load(self) -> _Provider:
        with self._lock:
            if self._provider is None:
                self._provider = getattr(importlib.import_module(self._module), self._name)(self._keys)
            return self._provider

    def __call__(self, config: BaseModel, owner: str) -> ModelClient:
        provider = self._provider or self._load()
        model: ModelClient = provider(config, owner)
        return model

    def close(self) -> None:
        if self._provider is not None:
            self._provider.close()


def default_model_providers(model_keys: ModelKeys | None = None) -> dict[str, ModelFactory]:
    """Every provider this process can run. The HTTP providers get the deployment's keys
    (``ModelKeys``; none by default) and check a run's ``api_key_ref`` and ``base_url``
    against them when the run is prepared."""
    keys = model_keys or ModelKeys()
    return {
        "scripted": scripted_model,
        "openai": LazyProvider("runtime.models.openai_compat", "OpenAIProvider", keys),
        "anthropic": LazyProvider("runtime.models.anthropic", "AnthropicProvider", keys),
    }


# For in-process use and tests only; workers are given AIDAWORK_SECRET_KEY.
DEV_SECRET = b"aidawork-development-secret-do-not-use-in-production"


@dataclass(frozen=True)
class BaseDeps:
    model_providers: Mapping[str, ModelFactory]
    tools: ToolRegistry
    proofs: ProofAuthority = field(default_factory=lambda: ProofAuthority(DEV_SECRET))
    # What a run's ``config`` is parsed as: ``TurnConfig``, with plugins' providers if any.
    turn_config: type[TurnConfig] = TurnConfig


@dataclass(frozen=True)
class Runtime:
    base: BaseDeps
    contexts: ContextCache = field(default_factory=ContextCache)


def build_runtime(
    *,
    secret: bytes = DEV_SECRET,
    memory_capacity: int = 1024,
    model_keys: ModelKeys | None = None,
    plugins: Plugins | None = None,
    toolsets: Sequence[Tool] = (),
    resolvers: Sequence[ToolResolver] = (),
) -> Runtime:
    """The process's runtime: the built-in tools and providers, plus what ``plugins``
    registered, plus ``toolsets`` (tools of other sources, such as MCP servers), and the
    ``resolvers`` that may find more of those later (a server unreachable at start)."""
    plugins = plugins or Plugins()
    providers: dict[str, ModelFactory] = {**default_model_providers(model_keys)}
    providers.update({name: p.factory for name, p in plugins.providers.items()})
    tools = builtin_registry()
    for tool in plugins.tools:
        try:
            tools.register(tool)
        except ValueError:  # a Plugins not filled by load_plugins (which refuses clashes)
            plugin = plugins.tool_plugins.get(tool.name, "?")
            raise PluginError(plugin, f"tool {tool.name!r} is already registered (built-in or plugin)") from None
    for tool in toolsets:
        tools.register(tool)
    for resolver in resolvers:
        tools.add_resolver(resolver)
    return Runtime(
        base=BaseDeps(
            model_providers=providers,
            tools=tools,
            proofs=ProofAuthority(secret),
            turn_config=turn_config_with([p.config_model for p in plugins.providers.values()]),
        ),
        contexts=ContextCache(capacity=memory_capacity),
    )


def _ask_client(args: object, ctx: ToolContext) -> NoReturn:
    raise NeedsInput(ToolSuspension("client_tool"))


def client_tool(spec: ClientToolSpec) -> Tool:
    """A run's client-side tool: every call waits for its result from outside (a call that
    has its answer never reaches the handler)."""
    return Tool(spec.name, spec.description, spec.parameters, ToolDomain.LOCAL, _ask_client)


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
    for spec in turn_config.client_tools:
        tools[spec.name] = client_tool(spec)
    specs = tuple(tool.spec() for tool in tools.values())
    output_tokens = max_output_tokens(turn_config.model)
    return OrchestratorDeps(
        model=factory(turn_config.model, owner),
        tools=tools,
        system_prompt=turn_config.system_prompt,
        policy=turn_config.policy,
        tool_specs=specs,
        system_digest=digest(turn_config.system_prompt),
        tools_digest=digest(list(specs)),
        proofs=runtime.base.proofs,
        provider=turn_config.model.provider,
        model_name=str(getattr(turn_config.model, "name", turn_config.model.provider)),
        model_config=turn_config.model,
        call_limit=call_limit_key(turn_config.model.provider, turn_config.model, output_tokens),
        max_output_tokens=output_tokens,
    )

"""Plugins: modules that add tools and model providers to every process of a deployment.

A plugin is an importable module named in ``AIDAWORK_PLUGINS`` (comma-separated) or
advertised by an installed package under the entry-point group ``aidawork.plugins``. It
defines ``register(plugins: Plugins)`` and calls ``plugins.tool(...)`` and
``plugins.provider(...)`` there (an entry point may also name that function itself). The
worker, the API, the CLI and the Python client load the same plugins the same way, so a
submission is validated exactly as it will run. A plugin that fails to load stops the
process at start, with an error naming it.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import entry_points
from types import ModuleType

from pydantic import BaseModel

from runtime.errors import AidaworkError
from runtime.models.base import ModelFactory
from runtime.tools import BUILTIN_TOOLS, Tool
from runtime.tools.define import NAME_PATTERN
from schema.wire.errors import ErrorCode

ENTRY_POINT_GROUP = "aidawork.plugins"
BUILTIN_PROVIDERS = frozenset({"scripted", "openai", "anthropic"})
BUILTIN_TOOL_NAMES = frozenset(t.name for t in BUILTIN_TOOLS)


class PluginError(AidaworkError):
    """A plugin could not be loaded (import failed, no ``register``, a bad registration)."""

    code = ErrorCode.PLUGIN_INVALID

    def __init__(self, plugin: str, problem: str) -> None:
        super().__init__(f"plugin {plugin!r}: {problem}")
        self.plugin = plugin


@dataclass(frozen=True)
class ProviderPlugin:
    """A model provider added by a plugin: the config model of ``config.model`` (it must
    have ``provider: Literal["<name>"]``) and ``factory(config, owner) -> ModelClient``."""

    name: str
    config_model: type[BaseModel]
    factory: ModelFactory


@dataclass
class Plugins:
    """What the loaded plugins registered, in load order."""

    tools: list[Tool] = field(default_factory=list)
    providers: dict[str, ProviderPlugin] = field(default_factory=dict)
    loaded: list[str] = field(default_factory=list)
    # Which plugin registered each tool (by tool name), so a clash can name it.
    tool_plugins: dict[str, str] = field(default_factory=dict)
    _current: str = ""

    def tool(self, *tools: Tool) -> None:
        for tool in tools:
            if not isinstance(tool, Tool):
                raise PluginError(self._current, f"tool() takes Tool objects (made with @tool), not {tool!r}")
            if not re.fullmatch(NAME_PATTERN, tool.name):
                raise PluginError(self._current, f"tool name {tool.name!r} must match {NAME_PATTERN}")
            if tool.name in BUILTIN_TOOL_NAMES:
                raise PluginError(self._current, f"tool {tool.name!r} is the name of a built-in tool")
            if tool.name in self.tool_plugins:
                by = self.tool_plugins[tool.name]
                raise PluginError(self._current, f"tool {tool.name!r} is already registered by plugin {by!r}")
            self.tools.append(tool)
            self.tool_plugins[tool.name] = self._current

    def provider(self, name: str, config_model: type[BaseModel], factory: ModelFactory) -> None:
        if name in BUILTIN_PROVIDERS or name in self.providers:
            raise PluginError(self._current, f"model provider {name!r} is already registered")
        if not callable(factory):
            raise PluginError(self._current, f"the factory of provider {name!r} must be callable(config, owner)")
        field_info = config_model.model_fields.get("provider")
        if field_info is None or getattr(field_info.annotation, "__args__", None) != (name,):
            raise PluginError(self._current, f"the config model of provider {name!r} needs provider: Literal[{name!r}]")
        self.providers[name] = ProviderPlugin(name, config_model, factory)


def _register_function(name: str, target: object) -> Callable[[Plugins], object]:
    register: object = getattr(target, "register", None) if isinstance(target, ModuleType) else target
    if not callable(register):
        raise PluginError(name, "has no register(plugins) function")
    return register


def _register(plugins: Plugins, name: str, register: Callable[[Plugins], object]) -> None:
    plugins._current = name
    try:
        register(plugins)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(name, f"register() raised {type(exc).__name__}: {exc}") from exc


def load_plugins(names: Sequence[str], *, discover: bool = True) -> Plugins:
    """Import the plugins named (``AIDAWORK_PLUGINS``) and, with ``discover``, those of the
    ``aidawork.plugins`` entry points; each once, in that order."""
    plugins = Plugins()
    targets: list[tuple[str, Callable[[], object]]] = [(n, partial(importlib.import_module, n)) for n in names]
    if discover:
        targets += [(f"{ep.name} ({ep.value})", ep.load) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    seen: set[int] = set()
    for name, load in targets:
        try:
            target = load()
        except Exception as exc:
            raise PluginError(name, f"cannot be imported: {type(exc).__name__}: {exc}") from exc
        register = _register_function(name, target)
        # Named in AIDAWORK_PLUGINS and advertised too (as the module or as its function).
        if id(register) in seen:
            continue
        seen.add(id(register))
        _register(plugins, name, register)
        plugins.loaded.append(name)
    return plugins


_CACHE: dict[tuple[str, ...], Plugins] = {}
_LOCK = threading.Lock()


def process_plugins(names: Sequence[str]) -> Plugins:
    """This process's plugins: loaded once (at start), the same for every later caller."""
    key = tuple(names)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = load_plugins(names)
        return _CACHE[key]

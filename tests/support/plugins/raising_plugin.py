"""A plugin whose ``register`` raises: the process that loads it must stop at start,
naming it (``AIDAWORK_PLUGINS=raising_plugin``)."""

from __future__ import annotations

from runtime.plugins import Plugins


def register(plugins: Plugins) -> None:
    raise RuntimeError("the plugin's backend is not configured")

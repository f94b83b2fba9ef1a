"""Version 2 of ``rolling_plugin`` (``AIDAWORK_PLUGINS=rolling_plugin``, this directory on
``PYTHONPATH``): the new release of a rolling upgrade (tests/e2e/test_rolling_upgrade.py).
Compatible with version 1: ``stamp`` keeps its name and accepts every call version 1
accepted (its description changes and it takes an optional ``note``), and ``shout`` is new."""

from __future__ import annotations

from runtime.plugins import Plugins
from runtime.tools import tool


@tool(effect="read_only")
def stamp(text: str, note: str = "") -> dict:
    """Return the text (and an optional note), stamped with the plugin's version."""
    return {"text": text, "version": 2, **({"note": note} if note else {})}


@tool(effect="read_only")
def shout(text: str) -> dict:
    """Return the text in capitals (new in version 2)."""
    return {"text": text.upper(), "version": 2}


def register(plugins: Plugins) -> None:
    plugins.tool(stamp, shout)

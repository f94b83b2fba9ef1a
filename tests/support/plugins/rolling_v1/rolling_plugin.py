"""Version 1 of ``rolling_plugin`` (``AIDAWORK_PLUGINS=rolling_plugin``, this directory on
``PYTHONPATH``): the old release of a rolling upgrade (tests/e2e/test_rolling_upgrade.py).
Version 2 (``../rolling_v2``) changes it compatibly."""

from __future__ import annotations

from runtime.plugins import Plugins
from runtime.tools import tool


@tool(effect="read_only")
def stamp(text: str) -> dict:
    """Return the text, stamped with the version of the plugin that ran the call."""
    return {"text": text, "version": 1}


def register(plugins: Plugins) -> None:
    plugins.tool(stamp)

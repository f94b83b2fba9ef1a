"""``lookup`` a version later (``AIDAWORK_PLUGINS=replay_lookup_v2``): its argument was
renamed from ``q`` to ``query``, so a call recorded with version 1 no longer validates."""

from __future__ import annotations

from runtime.plugins import Plugins
from runtime.tools import tool


@tool
def lookup(query: str) -> dict:
    """Look a word up."""
    return {"found": query.upper()}


def register(plugins: Plugins) -> None:
    plugins.tool(lookup)

"""The tool ``lookup(q)`` (``AIDAWORK_PLUGINS=replay_lookup_v1``): a run recorded with it is
replayed against ``replay_lookup_v2``, whose schema differs (tests/e2e/test_export_replay.py)."""

from __future__ import annotations

from runtime.plugins import Plugins
from runtime.tools import tool


@tool
def lookup(q: str) -> dict:
    """Look a word up."""
    return {"found": q.upper()}


def register(plugins: Plugins) -> None:
    plugins.tool(lookup)

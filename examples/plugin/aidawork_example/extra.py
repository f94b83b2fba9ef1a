"""A second plugin module, not advertised by an entry point: load it with
``AIDAWORK_PLUGINS=aidawork_example.extra``."""

from __future__ import annotations

from runtime.plugins import Plugins
from runtime.tools import tool


@tool(effect="read_only", name="word_count")
def word_count(text: str) -> dict:
    """Count the words of a text."""
    return {"words": len(text.split())}


def register(plugins: Plugins) -> None:
    plugins.tool(word_count)

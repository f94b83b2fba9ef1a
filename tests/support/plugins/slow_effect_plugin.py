"""A plugin whose at_most_once tool does its side effect and then takes its time, so a
test can SIGKILL the worker while the handler is still running
(``AIDAWORK_PLUGINS=slow_effect_plugin``)."""

from __future__ import annotations

import time
from pathlib import Path

from runtime.plugins import Plugins
from runtime.tools import ToolContext, tool


@tool(effect="at_most_once", timeout_s=120)
def append_then_wait(path: str, text: str, wait_s: float, ctx: ToolContext) -> dict:
    """Append a line (with the call's idempotency key), then wait before returning."""
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(f"{text}\t{ctx.idempotency_key}\n")
    time.sleep(wait_s)
    return {"appended": text}


def register(plugins: Plugins) -> None:
    plugins.tool(append_then_wait)

"""An example AIDAWORK plugin (installed with ``pip install -e examples/plugin``; found
through its ``aidawork.plugins`` entry point).

Its tools show each effect:

- ``lookup_order`` (``read_only``, ``async``): re-run freely;
- ``append_line`` (``at_most_once``): appends a line to a file, never twice for one call;
  after a crash inside it the call's outcome is unknown and waits for an operator;
- ``append_line_checked`` (``at_most_once`` with ``verify``): the same, but it can tell by
  reading the file whether an interrupted call wrote its line (each line carries the
  call's idempotency key), so no operator is needed.

And a model provider, ``echo``, that answers with the last user message.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aidawork_example.echo_model import EchoModel, EchoModelConfig
from runtime.plugins import Plugins
from runtime.tools import ToolContext, tool

ORDERS = {"A-1": {"status": "shipped", "total_cents": 1250}, "B-2": {"status": "open", "total_cents": 990}}


@tool(effect="read_only")
async def lookup_order(order_id: str) -> dict:
    """Look up an order by its id."""
    await asyncio.sleep(0)
    order = ORDERS.get(order_id)
    return {"order_id": order_id, "found": order is not None, **(order or {})}


def _append(path: str, text: str, ctx: ToolContext) -> dict:
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(f"{text}\t{ctx.idempotency_key}\n")
    return {"appended": text}


@tool(effect="at_most_once")
def append_line(path: str, text: str, ctx: ToolContext) -> dict:
    """Append a line of text to a file (a side effect that must not happen twice)."""
    return _append(path, text, ctx)


def _written(path: str, text: str, ctx: ToolContext) -> dict | None:
    """Whether the interrupted call wrote its line: its idempotency key is on it."""
    file = Path(path)
    lines = file.read_text(encoding="utf-8").splitlines() if file.exists() else []
    if any(line.endswith(f"\t{ctx.idempotency_key}") for line in lines):
        return {"appended": text, "verified": True}
    return None  # it did not write: cannot tell whether it would have; ask an operator


@tool(effect="at_most_once", verify=_written)
def append_line_checked(path: str, text: str, ctx: ToolContext) -> dict:
    """Append a line of text to a file; after a crash, the file tells whether it happened."""
    return _append(path, text, ctx)


def register(plugins: Plugins) -> None:
    plugins.tool(lookup_order, append_line, append_line_checked)
    plugins.provider("echo", EchoModelConfig, lambda config, owner: EchoModel(config))

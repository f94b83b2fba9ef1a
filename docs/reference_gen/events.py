"""Reference of the run event kinds, read from ``schema.wire.EventKind``: each kind's
value, with the comment above it in the source as its meaning where there is one, and
whether it ends the run or is sent to a run's webhook."""

from __future__ import annotations

import ast
import inspect

from reference_gen import cell, code, header, table


def comments(cls: type) -> dict[str, str]:
    """The ``#`` comment lines right above each member of an enum class, by member name
    (a comment in the source is the only place some members' meaning is written)."""
    lines, _ = inspect.getsourcelines(cls)
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        try:
            node = ast.parse(stripped).body[0] if stripped else None
        except SyntaxError:
            node = None
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and pending:
            found[node.targets[0].id] = " ".join(pending)
        pending = []
    return found


def page() -> str:
    from schema.wire import TERMINAL_EVENTS, WEBHOOK_EVENTS, EventKind

    meaning = comments(EventKind)
    doc = inspect.cleandoc(EventKind.__doc__ or "") if EventKind.__doc__ != EventKind.__mro__[1].__doc__ else ""
    text = header(
        "Events",
        "`schema.wire.EventKind` (with `TERMINAL_EVENTS` and `WEBHOOK_EVENTS`)",
        (doc + "\n\n" if doc else "")
        + "A run's events are stored with it (`run_events`) in order; `aidawork watch` and the API's event "
        "stream (`GET /v1/runs/{run_id}/events`) show them, and a run's webhook is sent the kinds marked below. "
        "The kinds, in the order of the source:",
    )
    rows = [
        [code(kind.value), "yes" if kind in TERMINAL_EVENTS else "no", "yes" if kind in WEBHOOK_EVENTS else "no",
         cell(meaning.get(kind.name, ""))]
        for kind in EventKind
    ]
    return text + table(["kind", "ends the run", "sent to webhooks", "meaning"], rows)

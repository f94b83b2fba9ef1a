"""Reference of the Python client (``worker.client``), read from the module: each public
function's signature and docstring, in the order they are defined. The client is the
stable API of AIDAWORK for Python callers; the page says so, as the package does."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from reference_gen import header


def functions() -> list[tuple[str, Callable[..., object]]]:
    """The public functions defined in ``worker.client`` (not those it imports), in source order."""
    import worker.client as client

    defined = [
        (name, value)
        for name, value in vars(client).items()
        if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == client.__name__
    ]
    return sorted(defined, key=lambda item: inspect.getsourcelines(item[1])[1])


def _signature(name: str, fn: Callable[..., object]) -> str:
    # Annotations as written in the source (the module uses postponed evaluation).
    return f"{name}{inspect.signature(fn)}".replace("'", "")


def page() -> str:
    import worker.client as client

    intro = inspect.getdoc(client) or ""
    text = header(
        "Python client",
        "the functions of `worker.client` and their docstrings",
        "**A stable API.** `from worker import client`: these functions, their parameters and what they return "
        "change only with a major version, announced in the [changelog](../changelog.md). Every other module of "
        "`worker` is internal.\n\n" + intro.split("\n\n", 1)[-1],
    )
    for name, fn in functions():
        doc = inspect.getdoc(fn) or ""
        text += f"## `{name}`\n\n```python\n{_signature(name, fn)}\n```\n\n{doc}\n\n"
    return text

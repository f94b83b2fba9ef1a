"""The generators of the reference pages (``docs/gen_reference.py`` runs them at build
time, ``docs/reference_gen/llms.py`` is the hook that writes ``llms.txt``). Each module
has a ``page()`` that returns the Markdown of one page, read from the code: nothing here
is copied by hand. Kept out of the site by ``exclude_docs`` in mkdocs.yml."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def header(title: str, source: str, intro: str = "") -> str:
    """The page's title and the one-line note every generated page starts with."""
    text = f"# {title}\n\n_Generated from {source} at build time._\n\n"
    return text + (f"{intro}\n\n" if intro else "")


def cell(value: object) -> str:
    """A value as one Markdown table cell: no line breaks, no bare ``|``."""
    return " ".join(str(value).split()).replace("|", "\\|")


def code(value: object) -> str:
    """A value as inline code in a table cell (backticks inside are doubled around). A
    ``|`` in a code span is no column break to Python-Markdown's tables, nor escapable."""
    text = " ".join(str(value).split())
    if not text:
        return ""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"

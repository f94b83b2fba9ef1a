"""The CLI reference page (docs/reference_gen/cli.py) is drawn from the command tree
``--help`` shows: every command, subcommand, argument and option of it is on the page,
so the help and the page cannot drift apart."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module", autouse=True)
def _reference_gen_importable() -> None:
    sys.path.insert(0, str(DOCS))


def _tree(command: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _tree(sub, f"{path} {name}")


def _sections(page: str) -> dict[str, str]:
    """Each command's section of the page, by its path (the headings are `aidawork ...`)."""
    found = {}
    for section in re.split(r"^#+ ", page, flags=re.MULTILINE)[1:]:
        title, _, body = section.partition("\n")
        found[title.strip("`")] = body
    return found


def test_the_page_shows_every_command_argument_and_option_of_the_click_tree() -> None:
    from reference_gen import cli as reference

    from worker.cli.main import app

    page = reference.page()
    sections = _sections(page)
    sections["aidawork"] = page.split("\n## ", 1)[0]  # the top: the options before a command
    commands = list(_tree(typer.main.get_command(app), "aidawork"))
    assert len(commands) == 35  # 23 commands, owner and its 4, agent and its 5, and aidawork itself
    for path, command in commands:
        assert path in sections, path
        assert command.help and " ".join(command.help.split())[1:] in sections[path], path
        for param in command.params:
            names = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else [param.metavar]
            for name in names:
                assert f"`{name}" in sections[path], f"{path}: {name}"
            if param.help:
                assert " ".join(param.help.split()) in sections[path], f"{path} {param.name}: {param.help}"


def test_the_page_shows_the_usage_and_help_of_each_command() -> None:
    from reference_gen import cli as reference

    page = reference.page()
    assert "aidawork submit [OPTIONS] {FILE}" in page
    assert "aidawork owner set [OPTIONS] {OWNER}" in page
    assert "Submit a run request (JSON file, or - for stdin); prints the run id." in page
    assert "| `--priority 0-9` |  | `0-9` |" in page
    assert "| `--file PATH|ASKED=LOCAL (repeatable)` | required |" in page
    assert "`enqueue, reject, interrupt, rollback`" in page
    assert "| `--port <int>` | `5555` |" in page

"""How the modules of ``worker.cli`` declare their commands (Typer, which carries its own
copy of Click as ``typer._click``): ``command`` registers a function as a ``Command``,
whose parsing stops at its context, so that ``worker.cli.main`` prepares the process
(logging, settings, plugins) before it runs it; and the arguments several commands share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar
from uuid import UUID

import typer
from typer._click import Context
from typer.core import TyperCommand

F = TypeVar("F", bound=Callable[..., int])

RunId = Annotated[UUID, typer.Argument(metavar="RUN_ID", show_default=False)]
ToolCallId = Annotated[str, typer.Argument(metavar="TOOL_CALL_ID", show_default=False)]
Owner = Annotated[str, typer.Argument(metavar="OWNER", show_default=False)]


class Command(TyperCommand):
    """A command of ``aidawork``. Click would parse its arguments and call its function in
    one step; here ``invoke`` returns them parsed instead, and ``Parsed.run`` calls the
    function once the process is ready for it."""

    def invoke(self, ctx: Context) -> Parsed:
        return Parsed(self, ctx)

    def run(self, ctx: Context) -> int:
        return int(super().invoke(ctx))


@dataclass(frozen=True)
class Parsed:
    """A command line parsed, not yet run: the command and the context of its arguments."""

    command: Command
    ctx: Context

    @property
    def name(self) -> str:
        """The command under ``aidawork``: ``owner`` for ``aidawork owner set``."""
        return self.ctx.command_path.split()[1]

    def run(self) -> int:
        """Calls the command's function with the arguments parsed: its exit code."""
        return self.command.run(self.ctx)


def command(app: typer.Typer, name: str, help: str) -> Callable[[F], F]:
    """Declares the function as the command ``name`` of ``app``. ``help`` is also its line
    in the list of commands, whole (Click would cut it to the width of the terminal)."""
    return app.command(name, help=help, short_help=help, cls=Command)


def commands(help: str, *, add_completion: bool = False) -> typer.Typer:
    """A group of commands, as ``aidawork --help`` shows it: plain text (no Rich panels),
    ``-h`` as well as ``--help``; ``add_completion``: ``--install-completion`` and
    ``--show-completion`` (the top level only)."""
    return typer.Typer(
        help=help,
        short_help=help,
        rich_markup_mode=None,
        add_completion=add_completion,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

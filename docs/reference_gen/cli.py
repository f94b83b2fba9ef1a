"""Reference of the ``aidawork`` command line, walked from the Click command tree that
``aidawork --help`` prints (``typer.main.get_command(worker.cli.main.app)``): every command
and subcommand, its help and usage, and each argument and option with its help, default and
choices, named as ``--help`` names them."""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum

import typer
from typer._click import Command, Context, Parameter

from reference_gen import cell, code, header, table

WIDTH = 100  # usage lines wrap at this width, whatever the terminal of the build is


def _subcommands(ctx: Context) -> Iterator[Context]:
    """The context of each subcommand of ``ctx``'s command, in the order of ``--help``."""
    commands: dict[str, Command] = getattr(ctx.command, "commands", {})
    for name, command in commands.items():
        if not command.hidden:
            yield Context(command, info_name=name, parent=ctx)


def _choices(param: Parameter) -> str:
    described = getattr(param, "type_descriptor", None)  # Typer's: what the annotation allows
    if described is not None and described.is_choice:
        return ", ".join(str(c.value if isinstance(c, Enum) else c) for c in described.choices)
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    return f"{low}-{high}" if low is not None and high is not None else ""


def _default(param: Parameter) -> str:
    if param.required:
        return "required"
    if getattr(param, "is_flag", False):
        return "on" if param.default else "off"
    return "" if param.default is None else code(param.default)


def _arguments(ctx: Context) -> str:
    rows = []
    for param in ctx.command.params:
        record = param.get_help_record(ctx)
        if record is None:  # hidden
            continue
        name = record[0] + (" (repeatable)" if param.multiple else "")
        rows.append([code(name), _default(param), code(_choices(param)), cell(getattr(param, "help", None) or "")])
    return table(["argument", "default", "choices", "meaning"], rows) if rows else ""


def _usage(ctx: Context) -> str:
    return ctx.command.get_usage(ctx).removeprefix("Usage: ").strip()


def _help(ctx: Context) -> str:
    text = " ".join((ctx.command.help or "").split())
    if not text:
        return ""
    return f"{text[0].upper()}{text[1:]}" + ("" if text.endswith(".") else ".")


def _command(ctx: Context, level: int) -> str:
    text = f"{'#' * level} `{ctx.command_path}`\n\n"
    if ctx.command.help:
        text += f"{_help(ctx)}\n\n"
    text += f"```text\n{_usage(ctx)}\n```\n\n"
    args = _arguments(ctx)
    if args:
        text += args + "\n"
    for sub in _subcommands(ctx):
        text += _command(sub, min(level + 1, 4))
    return text


def page() -> str:
    import worker.cli.main

    root = Context(typer.main.get_command(worker.cli.main.app), info_name="aidawork", terminal_width=WIDTH)
    # The module's docstring past its first line says what every command shares: exit
    # codes and logging.
    shared = (worker.cli.main.__doc__ or "").split("\n", 1)[-1].strip().replace("``", "`")
    every = "Every command also takes `-h`, `--help`: its usage, arguments and options, as on this page."
    text = header(
        "CLI", "`worker.cli.main.app` (its commands' `--help`)", f"{root.command.help}\n\n{shared}\n\n{every}"
    )
    text += f"```text\n{_usage(root)}\n```\n\n" + _arguments(root) + "\n"
    for sub in _subcommands(root):
        text += _command(sub, 2)
    return text

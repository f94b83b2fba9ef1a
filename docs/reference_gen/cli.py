"""Reference of the ``aidawork`` command line, walked from its argparse parser
(``worker.cli.main.build_parser``): every command and subcommand, its help and usage, and each
argument with its help, default and choices."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from reference_gen import cell, code, header, table

WIDTH = 100  # usage lines wrap at this width, whatever the terminal of the build is


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    # argparse has no public API to walk a parser: its actions (``_actions``), the
    # subparsers of a subcommand action (``choices``) and their help (``_choices_actions``)
    # are the only record of what was added.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _choices(action: argparse.Action) -> str:
    if action.choices is None or isinstance(action, argparse._SubParsersAction):
        return ""
    if isinstance(action.choices, range) and action.choices.step == 1:
        return f"{action.choices.start}-{action.choices.stop - 1}"
    return ", ".join(str(c) for c in action.choices)


def _default(action: argparse.Action) -> str:
    if action.required or not action.option_strings:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if action.default is False else "on"
    if action.default is None or action.default == argparse.SUPPRESS:
        return ""
    return code(action.default)


def _arguments(parser: argparse.ArgumentParser) -> str:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = str(action.metavar or action.dest).upper()
        if isinstance(action, argparse._AppendAction):
            name += " (repeatable)"
        rows.append([code(name), _default(action), code(_choices(action)), cell(action.help or "")])
    return table(["argument", "default", "choices", "meaning"], rows) if rows else ""


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    return parser.format_usage().removeprefix("usage: ").strip()


def _command(path: str, help_text: str, parser: argparse.ArgumentParser, level: int) -> str:
    text = f"{'#' * level} `{path}`\n\n"
    if help_text:
        text += f"{help_text[0].upper()}{help_text[1:]}.\n\n" if not help_text.endswith(".") else f"{help_text}\n\n"
    text += f"```text\n{_usage(parser)}\n```\n\n"
    args = _arguments(parser)
    if args:
        text += args + "\n"
    for name, sub_help, sub in _subcommands(parser):
        text += _command(f"{path} {name}", sub_help, sub, min(level + 1, 4))
    return text


def page() -> str:
    import worker.cli.main
    from worker.cli.main import build_parser

    parser = build_parser()
    # The module's docstring past its first line says what every command shares: exit
    # codes and logging.
    shared = (worker.cli.main.__doc__ or "").split("\n", 1)[-1].strip().replace("``", "`")
    text = header("CLI", "`worker.cli.main.build_parser` (with `worker.cli.owner`)", f"{parser.description}\n\n{shared}")
    text += f"```text\n{_usage(parser)}\n```\n\n" + _arguments(parser) + "\n"
    for name, help_text, sub in _subcommands(parser):
        text += _command(f"aidawork {name}", help_text, sub, 2)
    return text

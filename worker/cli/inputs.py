"""What the client commands read: JSON from a file, standard input or a flag, each way it
can fail an ``InputError`` (exit code 2) naming what was read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runtime.canonical import TOO_DEEP, TOO_MANY_DIGITS
from schema.wire.json import JsonValue


class InputError(Exception):
    """Bad input on the command line (exit code 2)."""


def parse_json(text: str, what: str) -> JsonValue:
    """``json.loads``, with each way it can fail as an ``InputError`` naming ``what``."""
    try:
        value: JsonValue = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # json.loads recurses per level: far deeper than allowed
        raise InputError(f"{what}: {TOO_DEEP}") from None
    except ValueError as exc:  # CPython's 4300-digit limit on int conversion
        reason = TOO_MANY_DIGITS if "digits" in str(exc) else "cannot be parsed as JSON"
        raise InputError(f"{what}: {reason}") from None
    return value


def read_json(source: str, what: str) -> JsonValue:
    """The JSON in the file ``source`` (``-``: standard input)."""
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source} is not UTF-8 text") from None
    return parse_json(text, what)

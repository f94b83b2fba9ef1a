"""Reference of the error codes, read from ``schema.wire.errors.ErrorCode``: each code's
meaning, whether retrying can help, its HTTP status and the CLI's exit code."""

from __future__ import annotations

import inspect

from reference_gen import cell, code, header, table

SOURCE = "`schema.wire.errors.ErrorCode`"


def _yes_no(value: object) -> str:
    return "yes" if value else "no"


def _or_blank(value: object) -> str:
    return "" if value is None else code(value)


def page() -> str:
    try:
        from schema.wire.errors import ErrorCode
    except ImportError as exc:
        return header("Error codes", SOURCE) + (
            f"!!! warning \"Not available\"\n    The error codes could not be read at build time ({cell(exc)}).\n"
        )
    doc = inspect.cleandoc(ErrorCode.__doc__ or "").replace("``", "`")
    text = header(
        "Error codes",
        SOURCE,
        (doc + "\n\n" if doc else "")
        + "An error answer of the HTTP API carries its code in `error.code` (see the [HTTP API](http-api.md)); "
        "the CLI prints one `aidawork: error:` line and exits with the code's exit code.",
    )
    rows = [
        [code(member.value), cell(member.meaning), _yes_no(member.retryable), _or_blank(member.http_status),
         _or_blank(member.exit_code)]
        for member in ErrorCode
    ]
    return text + table(["code", "meaning", "retryable", "HTTP status", "exit code"], rows)

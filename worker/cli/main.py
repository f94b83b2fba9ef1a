"""``aidawork``: the command line for operators and scripts.

Exit codes: 0 success; 2 bad input (invalid request, delivery, prerequisite value or answer,
unknown run, a refused delivery or answer), always as one ``aidawork: error:`` line naming
the field; 1 anything else.

Logging: every process logs JSON lines on stderr (``worker.ops.logging``), at
``AIDAWORK_LOG_LEVEL``; client commands log warnings and errors only, their results go to
stdout. The long-running commands (``worker.engine.processes``: migrate, worker, beat, flower,
api) write nothing but JSON lines, so a refusal to start is a ``start_refused`` line
(``error`` says why) rather than the ``aidawork: error:`` line of the client commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import OperationalError

from runtime.canonical import TOO_DEEP, TOO_MANY_DIGITS
from runtime.errors import AidaworkError, RequestInvalid
from runtime.plugins import PluginError, process_plugins
from schema.store.errors import IdempotencyKeyReused, RootBusy, RootNotFound, RunNotFound
from schema.store.suspensions import DeliveryRefused, Receipt
from schema.wire.route import MAX_PRIORITY, MIN_PRIORITY
from worker.cli.owner import OwnerInputError, add_owner_parser
from worker.cli.run_view import cmd_status, cmd_watch
from worker.engine.processes import (
    aidawork_version,
    cmd_beat,
    cmd_flower,
    cmd_migrate,
    cmd_webhooks,
    cmd_worker,
    refuse_start,
)
from worker.ops.logging import configure_logging
from worker.ops.retention import older_than_days_arg
from worker.ops.settings import Settings, SettingsError, get_settings

EXIT_OK, EXIT_ERROR, EXIT_INPUT = 0, 1, 2
# The long-running processes: nothing but JSON lines on stderr, refusals included.
PROCESS_COMMANDS = frozenset({"migrate", "worker", "beat", "flower", "api", "webhooks"})
CLIENT_COMMANDS = frozenset(
    {"submit", "status", "watch", "cancel", "deliver", "resolve", "tool-result", "retry-tool", "approve", "reject"}
) | {"owner"}
# The processes that sign or verify round proofs: they refuse to start without the secret.
SECRET_COMMANDS = frozenset({"worker", "beat", "api"})


class InputError(Exception):
    """Bad input on the command line (exit code 2)."""


_command: str | None = None  # the command main() runs: how _err reports


def _err(message: str, code: int) -> int:
    if _command in PROCESS_COMMANDS:
        return refuse_start(_command, message, code)
    print(f"aidawork: error: {message}", file=sys.stderr)
    return code


def _run_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id: {raw!r}") from None


def parse_json(text: str, what: str) -> Any:
    """``json.loads``, with each way it can fail as an ``InputError`` naming ``what``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # json.loads recurses per level: far deeper than allowed
        raise InputError(f"{what}: {TOO_DEEP}") from None
    except ValueError as exc:  # CPython's 4300-digit limit on int conversion
        reason = TOO_MANY_DIGITS if "digits" in str(exc) else "cannot be parsed as JSON"
        raise InputError(f"{what}: {reason}") from None


def _read_request(source: str) -> Any:
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source} is not UTF-8 text") from None
    return parse_json(text, "the request")


def cmd_submit(args: argparse.Namespace) -> int:
    from worker import client

    try:
        raw = _read_request(args.file)
    except InputError as exc:
        return _err(str(exc), EXIT_INPUT)
    except OwnerInputError as exc:
        return _err(str(exc), EXIT_INPUT)
    if not isinstance(raw, dict):
        return _err("the request must be a JSON object", EXIT_INPUT)
    for flag, field in (("idempotency_key", "idempotency_key"), ("root_policy", "root_policy")):
        given = getattr(args, flag, None)
        if given is not None:
            if raw.get(field) not in (None, given):
                return _err(f"invalid request: {field}: differs from --{flag.replace('_', '-')}", EXIT_INPUT)
            raw[field] = given
    if args.priority is not None:
        raw = {**raw, "priority": args.priority}
    try:
        submitted = client.submit(raw)
    except (RequestInvalid, RootNotFound) as exc:
        return _err(f"invalid request: {exc.message}", EXIT_INPUT)
    except (IdempotencyKeyReused, RootBusy) as exc:
        return _err(f"refused ({exc.code}): {exc.message}", EXIT_INPUT)
    if submitted.existing:
        # stdout stays the run id alone, for scripts; the note goes to stderr.
        print(f"aidawork: existing run: an earlier submit with this idempotency_key stored {submitted.run_id}",
              file=sys.stderr)
    for interrupted in submitted.interrupted:
        when = "at its next round boundary" if interrupted in submitted.interrupting else "now"
        print(f"aidawork: cancelling run {interrupted} {when} (root_policy)", file=sys.stderr)
    print(submitted.run_id)
    return EXIT_OK


def _read_delivery(specs: list[str]) -> dict[str, str]:
    """``--file PATH`` delivers PATH as asked; ``--file ASKED=LOCAL`` reads LOCAL for ASKED."""
    files = {}
    for spec in specs:
        asked, _, local = spec.partition("=")
        source = Path(local or asked)
        try:
            files[asked] = source.read_bytes().decode("utf-8")
        except OSError as exc:
            raise InputError(f"cannot read {source}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InputError(f"{source} is not UTF-8 text; only text files can be delivered") from None
    return files


def cmd_deliver(args: argparse.Namespace) -> int:
    from worker import client

    receipt = client.deliver(args.run_id, args.tool_call_id, _read_delivery(args.file))
    state = "stored" if receipt.stored else "already delivered; nothing changed"
    resumed = "; the run resumes" if receipt.resumes else ""
    print(f"{args.tool_call_id}: {state}{resumed}")
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    from worker import client

    value = parse_json(args.value, "--value")
    receipt = client.resolve(args.run_id, args.key, value)
    state = "resolved" if receipt.stored else "already resolved; nothing changed"
    print(f"{args.key}: {state}{'; the run resumes' if receipt.resumes else ''}")
    return EXIT_OK


def _print_answer(tool_call_id: str, receipt: Receipt, done: str) -> int:
    state = done if receipt.stored else "the same answer was already given; nothing changed"
    print(f"{tool_call_id}: {state}{'; the run resumes' if receipt.resumes else ''}")
    return EXIT_OK


def cmd_tool_result(args: argparse.Namespace) -> int:
    from worker import client

    value = parse_json(args.json, "--json")
    receipt = client.tool_result(args.run_id, args.tool_call_id, value, is_error=args.error)
    return _print_answer(args.tool_call_id, receipt, "failed result stored" if args.error else "result stored")


def cmd_retry_tool(args: argparse.Namespace) -> int:
    from worker import client

    receipt = client.retry_tool(args.run_id, args.tool_call_id)
    return _print_answer(args.tool_call_id, receipt, "it will run again")


def cmd_approve(args: argparse.Namespace) -> int:
    from worker import client

    edited = None if args.args is None else parse_json(args.args, "--args")
    if edited is not None and not isinstance(edited, dict):
        raise InputError("--args must be a JSON object: the call's args, edited")
    receipt = client.approve(args.run_id, args.tool_call_id, args=edited)
    return _print_answer(args.tool_call_id, receipt, "approved" + (" with edited args" if edited is not None else ""))


def cmd_reject(args: argparse.Namespace) -> int:
    from worker import client

    receipt = client.reject(args.run_id, args.tool_call_id, reason=args.reason)
    return _print_answer(args.tool_call_id, receipt, "rejected")


def cmd_cancel(args: argparse.Namespace) -> int:
    from worker import client

    if client.cancel(args.run_id):
        print(f"cancelled {args.run_id}")
        return EXIT_OK
    return _err(f"run {args.run_id} has already ended", EXIT_INPUT)


def cmd_prune(args: argparse.Namespace) -> int:
    from worker.client.context import engine_for
    from worker.ops.retention import describe, prune

    settings = get_settings()
    days = args.older_than_days if args.older_than_days is not None else settings.retention_days
    if days is None:
        return _err("--older-than-days: give a number of days, or set AIDAWORK_RETENTION_DAYS", EXIT_INPUT)
    engine = engine_for(settings, threads=1)
    try:
        report = prune(engine, older_than_days=days, batch_runs=settings.retention_batch_runs, dry_run=args.dry_run)
    finally:
        engine.dispose()
    print(json.dumps(report.to_json(), indent=2) if args.json else "\n".join(describe(report)))
    return EXIT_OK


def _answer_parser(sub: Any, name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Any:
    """A command that answers one suspended call: ``RUN_ID TOOL_CALL_ID`` and its options."""
    p = sub.add_parser(name, help=help)
    p.add_argument("run_id", type=_run_id)
    p.add_argument("tool_call_id")
    p.set_defaults(fn=fn)
    return p


def _cmd_api(args: argparse.Namespace) -> int:
    if not get_settings().api_token_owners:
        return _err("AIDAWORK_API_TOKENS is not set: give it a JSON object {token: owner}", EXIT_INPUT)
    return cmd_api(args)


def cmd_api(args: argparse.Namespace) -> int:
    from worker.api import create_app
    from worker.api.server import serve

    settings = get_settings()
    serve(create_app(settings), settings, host=args.host, port=args.port)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aidawork", description="AIDAWORK: durable LLM agent runs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {aidawork_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create the database if needed and run the migrations").set_defaults(fn=cmd_migrate)
    p = sub.add_parser("worker", help="start a Celery worker (threads pool)")
    p.add_argument("--concurrency", type=int, default=None, help="threads (default AIDAWORK_WORKER_CONCURRENCY)")
    p.set_defaults(fn=cmd_worker)
    p = sub.add_parser("beat", help="run the reconciler every AIDAWORK_RECONCILE_INTERVAL_S (one per deployment)")
    p.set_defaults(fn=cmd_beat)
    sub.add_parser(
        "webhooks", help="start the webhook deliverer (POSTs the outbox's due deliveries, signed)"
    ).set_defaults(fn=cmd_webhooks)
    p = sub.add_parser("flower", help="start Flower on the same broker")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--address", default="127.0.0.1")
    p.set_defaults(fn=cmd_flower)
    p = sub.add_parser("api", help="start the HTTP API (uvicorn); tokens from AIDAWORK_API_TOKENS")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.set_defaults(fn=_cmd_api)
    p = sub.add_parser("submit", help="submit a run request (JSON file, or - for stdin); prints the run id")
    p.add_argument("file")
    p.add_argument("--idempotency-key", help="the request's idempotency_key: a replay returns the same run")
    p.add_argument(
        "--root-policy", choices=["enqueue", "reject", "interrupt", "rollback"],
        help="the request's root_policy: what to do when the Root has an active run",
    )
    p.add_argument(
        "--priority",
        type=int,
        choices=range(MIN_PRIORITY, MAX_PRIORITY + 1),
        metavar="0-9",
        help="orders the run's rounds within its owner's share: 9 the most urgent (default: the file's, else 5)",
    )
    p.set_defaults(fn=cmd_submit)
    p = sub.add_parser("status", help="show a run")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("watch", help="print a run's events until it ends")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--no-deltas", action="store_true", help="durable events only, not the model's text as it streams")
    p.set_defaults(fn=cmd_watch)
    p = sub.add_parser("deliver", help="deliver the files a suspended tool call asked for")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("tool_call_id")
    p.add_argument(
        "--file",
        action="append",
        required=True,
        metavar="PATH|ASKED=LOCAL",
        help="a file to deliver (repeat for several)",
    )
    p.set_defaults(fn=cmd_deliver)
    p = sub.add_parser("resolve", help="resolve a prerequisite a suspended run waits for")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("key")
    p.add_argument("--value", required=True, help="the value, as JSON")
    p.set_defaults(fn=cmd_resolve)
    p = _answer_parser(sub, "tool-result", cmd_tool_result,
                       "the result of a client tool, or of a call whose outcome is unknown")
    p.add_argument("--json", required=True, metavar="VALUE", help="the result, as JSON")
    p.add_argument("--error", action="store_true", help="the call failed: the model sees a failed result")
    _answer_parser(sub, "retry-tool", cmd_retry_tool, "run an at_most_once call whose outcome is unknown once more")
    p = _answer_parser(sub, "approve", cmd_approve, "let a call that waits for approval run (maybe with edited args)")
    p.add_argument("--args", default=None, metavar="JSON", help="the call's args, edited (the whole object)")
    p = _answer_parser(sub, "reject", cmd_reject, "refuse a call that waits for approval; the model is told why")
    p.add_argument("--reason", required=True, help="why (shown to the model)")
    p = sub.add_parser("cancel", help="cancel a run that has not ended")
    p.add_argument("run_id", type=_run_id)
    p.set_defaults(fn=cmd_cancel)
    p = sub.add_parser("prune", help="delete Roots whose runs all ended long ago, with all their rows")
    p.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    p.add_argument("--older-than-days", type=older_than_days_arg, default=None, metavar="N",
                   help="runs that ended more than N days ago (default AIDAWORK_RETENTION_DAYS)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_prune)
    add_owner_parser(sub)
    return parser


def _prepare_process(command: str, settings: Settings) -> str | None:
    """Load the plugins (so one that cannot load stops the process before it starts) and
    check the secret of the processes that sign; what is wrong, or None."""
    plugins = process_plugins(settings.plugin_names)
    if plugins.loaded and command not in CLIENT_COMMANDS:
        structlog.get_logger("aidawork.cli").info("plugins_loaded", plugins=plugins.loaded)
    if command in SECRET_COMMANDS:
        problem = settings.secret_problem()
        if problem is not None:
            return problem
        if settings.secret_key is None:
            structlog.get_logger("aidawork.cli").warning(
                "secret_key_missing", detail="AIDAWORK_DEV is set: round proofs use the public development secret"
            )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    global _command
    args = build_parser().parse_args(argv)
    _command = args.command
    # Client commands print results on stdout; only warnings go to stderr. Logging is set
    # up before the settings are read, so even a refused setting is a JSON line.
    configure_logging("WARNING" if args.command in CLIENT_COMMANDS else "INFO")
    try:
        settings = get_settings()
        if args.command not in CLIENT_COMMANDS:
            configure_logging(settings.log_level)
        problem = _prepare_process(args.command, settings)
        if problem is not None:
            return _err(problem, EXIT_INPUT)
        return int(args.fn(args))
    except SettingsError as exc:
        return _err(str(exc), EXIT_INPUT)
    except PluginError as exc:
        return _err(f"{exc.code}: {exc.message} (AIDAWORK_PLUGINS or an aidawork.plugins entry point)", EXIT_INPUT)
    except (RunNotFound, DeliveryRefused) as exc:
        return _err(exc.message, EXIT_INPUT)
    except RequestInvalid as exc:  # a delivery or prerequisite no store can hold
        return _err(f"{exc.code}: {exc.message}", EXIT_INPUT)
    except InputError as exc:
        return _err(str(exc), EXIT_INPUT)
    except OwnerInputError as exc:
        return _err(str(exc), EXIT_INPUT)
    except AidaworkError as exc:
        return _err(f"{exc.code}: {exc.message}", EXIT_ERROR)
    except OperationalError as exc:
        return _err(f"cannot reach the database (AIDAWORK_DATABASE_URL): {exc.orig}", EXIT_ERROR)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

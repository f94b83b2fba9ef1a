"""``aidawork``: the command line for operators and scripts.

Exit codes: 0 success; 2 bad input (invalid request, delivery, prerequisite value or answer,
unknown run, a refused delivery or answer), always as one ``aidawork: error:`` line naming
the field; 1 anything else.

Logging: every process logs JSON lines on stderr (``worker.ops.logging``), at
``AIDAWORK_LOG_LEVEL``; client commands log warnings and errors only, their results go to
stdout. The long-running commands (``worker.engine.processes``: migrate, worker, beat, flower,
api) write nothing but JSON lines, so a refusal to start is a ``start_refused`` line
(``error`` says why) rather than the ``aidawork: error:`` line of the client commands.

The commands are declared with Typer (``worker.cli.commands``); a usage error (an unknown
command or option, an argument missing or of the wrong type) exits 2 before anything is
read, after the command's usage and one ``aidawork COMMAND: error:`` line naming it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, NoReturn

import structlog
import typer
from sqlalchemy.exc import OperationalError
from typer._click.exceptions import UsageError

from runtime.cases.verify import CaseInvalid
from runtime.errors import AidaworkError, RequestInvalid
from runtime.plugins import PluginError, process_plugins
from schema.store.errors import (
    AgentExists,
    AgentNotFound,
    ForkRefused,
    IdempotencyKeyReused,
    RootBusy,
    RootNotFound,
    RunNotFound,
)
from schema.store.suspensions import DeliveryRefused, Receipt
from schema.wire import RootPolicy
from schema.wire.route import MAX_PRIORITY, MIN_PRIORITY
from worker.cli import agent, owner
from worker.cli.audit import cmd_audit
from worker.cli.commands import Parsed, RunId, ToolCallId, command, commands
from worker.cli.deploy import cmd_deploy_check
from worker.cli.forks import cmd_diff, cmd_fork
from worker.cli.inputs import InputError, parse_json, read_json
from worker.cli.owner import OwnerInputError
from worker.cli.replay import cmd_export, cmd_replay
from worker.cli.run_view import cmd_status, cmd_watch
from worker.client.replay.export import ExportRefused
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
) | {"owner", "agent", "deploy-check", "audit", "fork", "diff", "export", "replay"}
# The commands that load plugins of their own choosing (deploy-check --plugins), not AIDAWORK_PLUGINS.
OWN_PLUGINS = frozenset({"deploy-check"})
# The processes that sign or verify round proofs: they refuse to start without the secret
# (a fork signs the rounds it copies).
SECRET_COMMANDS = frozenset({"worker", "beat", "api", "fork"})


_command: str | None = None  # the command main() runs: how _err reports


def _err(message: str, code: int) -> int:
    if _command in PROCESS_COMMANDS:
        return refuse_start(_command, message, code)
    print(f"aidawork: error: {message}", file=sys.stderr)
    return code


app = commands("AIDAWORK: durable LLM agent runs.", add_completion=True)


def _show_version(shown: bool) -> None:
    if shown:
        print(f"aidawork {aidawork_version()}")
        raise typer.Exit()


@app.callback()
def aidawork(
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_show_version, help="show the version and exit")
    ] = False,
) -> None:
    # The options before the command: --version (and --help, --install-completion).
    return None


# --- the long-running processes (worker.engine.processes) ---------------------------------

command(app, "migrate", "create the database if needed and run the migrations")(cmd_migrate)


@command(app, "worker", "start a Celery worker (threads pool)")
def start_worker(
    concurrency: Annotated[int | None, typer.Option(help="threads (default AIDAWORK_WORKER_CONCURRENCY)")] = None,
) -> int:
    return cmd_worker(concurrency)


command(app, "beat", "run the reconciler every AIDAWORK_RECONCILE_INTERVAL_S (one per deployment)")(cmd_beat)
command(app, "webhooks", "start the webhook deliverer (POSTs the outbox's due deliveries, signed)")(cmd_webhooks)


@command(app, "flower", "start Flower on the same broker")
def start_flower(port: int = 5555, address: str = "127.0.0.1") -> int:
    return cmd_flower(port, address)


@command(app, "api", "start the HTTP API (uvicorn); tokens from AIDAWORK_API_TOKENS")
def cmd_api(port: int = 8080, host: str = "127.0.0.1") -> int:
    from worker.api import create_app
    from worker.api.server import serve

    settings = get_settings()
    if not settings.api_token_owners:
        return _err("AIDAWORK_API_TOKENS is not set: give it a JSON object {token: owner}", EXIT_INPUT)
    serve(create_app(settings), settings, host=host, port=port)
    return EXIT_OK


# --- the client commands (worker.client) ---------------------------------------------------


@command(app, "submit", "submit a run request (JSON file, or - for stdin); prints the run id")
def cmd_submit(
    file: Annotated[str, typer.Argument(metavar="FILE", show_default=False)],
    idempotency_key: Annotated[
        str | None, typer.Option(help="the request's idempotency_key: a replay returns the same run")
    ] = None,
    root_policy: Annotated[
        RootPolicy | None, typer.Option(help="the request's root_policy: what to do when the Root has an active run")
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            min=MIN_PRIORITY,
            max=MAX_PRIORITY,
            metavar=f"{MIN_PRIORITY}-{MAX_PRIORITY}",
            help="orders the run's rounds within its owner's share: 9 the most urgent (default: the file's, else 5)",
        ),
    ] = None,
) -> int:
    from worker import client

    try:
        raw = read_json(file, "the request")
    except InputError as exc:
        return _err(str(exc), EXIT_INPUT)
    if not isinstance(raw, dict):
        return _err("the request must be a JSON object", EXIT_INPUT)
    for field, given in (("idempotency_key", idempotency_key), ("root_policy", root_policy)):
        if given is not None:
            if raw.get(field) not in (None, given):
                return _err(f"invalid request: {field}: differs from --{field.replace('_', '-')}", EXIT_INPUT)
            raw[field] = given
    if priority is not None:
        raw = {**raw, "priority": priority}
    try:
        submitted = client.submit(raw)
    except (RequestInvalid, RootNotFound, AgentNotFound) as exc:
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


command(app, "status", "show a run")(cmd_status)
command(app, "watch", "print a run's events until it ends")(cmd_watch)
command(app, "fork", "a new run whose first N rounds are the run's, copied, not re-run; prints its id")(cmd_fork)
command(app, "diff", "what differs between two runs, round by round")(cmd_diff)
command(app, "export", "a run as a self-contained, digest-verified case (JSON on stdout)")(cmd_export)
command(app, "replay", "replay an exported case against this code, config and tools; report per round")(cmd_replay)


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


@command(app, "deliver", "deliver the files a suspended tool call asked for")
def cmd_deliver(
    run_id: RunId,
    tool_call_id: ToolCallId,
    file: Annotated[
        list[str], typer.Option(metavar="PATH|ASKED=LOCAL", help="a file to deliver (repeat for several)")
    ],
) -> int:
    from worker import client

    receipt = client.deliver(run_id, tool_call_id, _read_delivery(file))
    state = "stored" if receipt.stored else "already delivered; nothing changed"
    resumed = "; the run resumes" if receipt.resumes else ""
    print(f"{tool_call_id}: {state}{resumed}")
    return EXIT_OK


@command(app, "resolve", "resolve a prerequisite a suspended run waits for")
def cmd_resolve(
    run_id: RunId,
    key: Annotated[str, typer.Argument(metavar="KEY", show_default=False)],
    value: Annotated[str, typer.Option(help="the value, as JSON")],
) -> int:
    from worker import client

    receipt = client.resolve(run_id, key, parse_json(value, "--value"))
    state = "resolved" if receipt.stored else "already resolved; nothing changed"
    print(f"{key}: {state}{'; the run resumes' if receipt.resumes else ''}")
    return EXIT_OK


def _print_answer(tool_call_id: str, receipt: Receipt, done: str) -> int:
    state = done if receipt.stored else "the same answer was already given; nothing changed"
    print(f"{tool_call_id}: {state}{'; the run resumes' if receipt.resumes else ''}")
    return EXIT_OK


@command(app, "tool-result", "the result of a client tool, or of a call whose outcome is unknown")
def cmd_tool_result(
    run_id: RunId,
    tool_call_id: ToolCallId,
    value: Annotated[str, typer.Option("--json", metavar="VALUE", help="the result, as JSON")],
    error: Annotated[bool, typer.Option("--error", help="the call failed: the model sees a failed result")] = False,
) -> int:
    from worker import client

    receipt = client.tool_result(run_id, tool_call_id, parse_json(value, "--json"), is_error=error)
    return _print_answer(tool_call_id, receipt, "failed result stored" if error else "result stored")


@command(app, "retry-tool", "run an at_most_once call whose outcome is unknown once more")
def cmd_retry_tool(run_id: RunId, tool_call_id: ToolCallId) -> int:
    from worker import client

    receipt = client.retry_tool(run_id, tool_call_id)
    return _print_answer(tool_call_id, receipt, "it will run again")


@command(app, "approve", "let a call that waits for approval run (maybe with edited args)")
def cmd_approve(
    run_id: RunId,
    tool_call_id: ToolCallId,
    args: Annotated[
        str | None, typer.Option(metavar="JSON", help="the call's args, edited (the whole object)")
    ] = None,
) -> int:
    from worker import client

    edited = None if args is None else parse_json(args, "--args")
    if edited is not None and not isinstance(edited, dict):
        raise InputError("--args must be a JSON object: the call's args, edited")
    receipt = client.approve(run_id, tool_call_id, args=edited)
    return _print_answer(tool_call_id, receipt, "approved" + (" with edited args" if edited is not None else ""))


@command(app, "reject", "refuse a call that waits for approval; the model is told why")
def cmd_reject(
    run_id: RunId,
    tool_call_id: ToolCallId,
    reason: Annotated[str, typer.Option(help="why (shown to the model)")],
) -> int:
    from worker import client

    receipt = client.reject(run_id, tool_call_id, reason=reason)
    return _print_answer(tool_call_id, receipt, "rejected")


@command(app, "cancel", "cancel a run that has not ended")
def cmd_cancel(run_id: RunId) -> int:
    from worker import client

    if client.cancel(run_id):
        print(f"cancelled {run_id}")
        return EXIT_OK
    return _err(f"run {run_id} has already ended", EXIT_INPUT)


def _days(raw: str) -> float:
    """``--older-than-days``, checked by ``older_than_days_arg``; a refusal is a usage error."""
    try:
        return older_than_days_arg(raw)
    except ValueError as exc:  # its message names the flag
        raise UsageError(str(exc)) from None


@command(app, "prune", "delete Roots whose runs all ended long ago, with all their rows")
def cmd_prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only count what would be deleted")] = False,
    older_than_days: Annotated[
        float | None,
        typer.Option(
            metavar="N", parser=_days, help="runs that ended more than N days ago (default AIDAWORK_RETENTION_DAYS)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> int:
    from worker.client.context import engine_for
    from worker.ops.retention import describe, prune

    settings = get_settings()
    days = older_than_days if older_than_days is not None else settings.retention_days
    if days is None:
        return _err("--older-than-days: give a number of days, or set AIDAWORK_RETENTION_DAYS", EXIT_INPUT)
    engine = engine_for(settings, threads=1)
    try:
        report = prune(engine, older_than_days=days, batch_runs=settings.retention_batch_runs, dry_run=dry_run)
    finally:
        engine.dispose()
    print(json.dumps(report.to_json(), indent=2) if as_json else "\n".join(describe(report)))
    return EXIT_OK


command(app, "deploy-check", "before a deploy: would this code break a run that has not ended? (exit 1: yes)")(
    cmd_deploy_check
)

command(app, "audit", "check every run's boundaries, fences and ledger against each other (exit 1: an error found)")(
    cmd_audit
)

app.add_typer(owner.app, name="owner")
app.add_typer(agent.app, name="agent")


# --- running a command --------------------------------------------------------------------


def parse(argv: Sequence[str] | None = None) -> Parsed:
    """The command line parsed (``argv``, else the process's), nothing run. Exits (SystemExit):
    0 after ``--help``, ``--version``, ``--install-completion`` or a shell's completion
    request; 2 on a usage error, after the command's usage and one line naming the problem."""
    try:
        parsed = typer.main.get_command(app).main(argv, prog_name="aidawork", standalone_mode=False)
    except UsageError as exc:
        _usage_error(exc)
    if isinstance(parsed, Parsed):
        return parsed
    raise SystemExit(parsed)  # the exit code of --help or --version, which ran


def _usage_error(exc: UsageError) -> NoReturn:
    if exc.ctx is not None:
        print(exc.ctx.get_usage(), file=sys.stderr)
    where = exc.ctx.command_path if exc.ctx is not None else "aidawork"
    print(f"{where}: error: {exc.format_message()}", file=sys.stderr)
    raise SystemExit(exc.exit_code)


def _prepare_process(command: str, settings: Settings) -> str | None:
    """Load the plugins (so one that cannot load stops the process before it starts) and
    check the secret of the processes that sign; what is wrong, or None."""
    if command in OWN_PLUGINS:
        return None
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
    parsed = parse(argv)
    _command = parsed.name
    # Client commands print results on stdout; only warnings go to stderr. Logging is set
    # up before the settings are read, so even a refused setting is a JSON line.
    configure_logging("WARNING" if _command in CLIENT_COMMANDS else "INFO")
    try:
        settings = get_settings()
        if _command not in CLIENT_COMMANDS:
            configure_logging(settings.log_level)
        problem = _prepare_process(_command, settings)
        if problem is not None:
            return _err(problem, EXIT_INPUT)
        return parsed.run()
    except SettingsError as exc:
        return _err(str(exc), EXIT_INPUT)
    except PluginError as exc:
        return _err(f"{exc.code}: {exc.message} (AIDAWORK_PLUGINS or an aidawork.plugins entry point)", EXIT_INPUT)
    except (RunNotFound, DeliveryRefused, AgentNotFound) as exc:
        return _err(exc.message, EXIT_INPUT)
    except (RequestInvalid, AgentExists, ForkRefused) as exc:  # e.g. a delivery or prerequisite no store can hold
        return _err(f"{exc.code}: {exc.message}", EXIT_INPUT)
    except (InputError, OwnerInputError) as exc:
        return _err(str(exc), EXIT_INPUT)
    except (CaseInvalid, ExportRefused) as exc:  # a case that cannot be read or does not verify; nothing written
        return _err(f"{exc.code}: {exc.message}", EXIT_INPUT)
    except AidaworkError as exc:
        return _err(f"{exc.code}: {exc.message}", EXIT_ERROR)
    except OperationalError as exc:
        return _err(f"cannot reach the database (AIDAWORK_DATABASE_URL): {exc.orig}", EXIT_ERROR)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

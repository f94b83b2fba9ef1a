"""``aidawork owner set/show/list``: an owner's limits (``schema.store.limits``);
``aidawork owner webhook-secret``: the secret its webhook receivers verify with.

``set`` changes only the flags given; ``none`` clears a limit (``--max-running none``: no
cap; ``--token-budget none``: no budget, and its window goes with it). A refusal names
the flag and exits 2, with nothing stored."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from schema.wire.owners import BUDGET_WINDOWS, ON_BUDGET, OwnerLimits, OwnerLimitsInvalid, check_owner_name
from worker.cli.commands import Owner, command, commands

# Each flag of ``set`` and the field it changes; the values ``none`` may clear.
FLAGS = {
    "max_running": "--max-running",
    "weight": "--weight",
    "token_budget": "--token-budget",
    "budget_window": "--budget-window",
    "on_budget": "--on-budget",
}
CLEARABLE = frozenset({"max_running", "token_budget"})


class OwnerInputError(Exception):
    """Bad input for an ``owner`` command, naming the flag (exit code 2)."""


def check_owner(owner: str) -> str:
    try:
        return check_owner_name(owner)
    except OwnerLimitsInvalid:
        raise OwnerInputError(f"OWNER: not an owner name: {owner[:80]!r} (letters, digits and ._:@-)") from None


def _value(field: str, raw: str) -> int | str | None:
    if raw.lower() == "none":
        if field not in CLEARABLE:
            raise OwnerInputError(f"{FLAGS[field]}: cannot be cleared (none is for --max-running, --token-budget)")
        return None
    if field in ("budget_window", "on_budget"):
        return raw
    try:
        return int(raw)
    except ValueError:
        raise OwnerInputError(f"{FLAGS[field]}: not a whole number: {raw[:40]!r}") from None


@dataclass(frozen=True)
class LimitFlags:
    """The flags of ``owner set`` as given (``None``: not given), each named as its field."""

    max_running: str | None = None
    weight: str | None = None
    token_budget: str | None = None
    budget_window: str | None = None
    on_budget: str | None = None


def changes_of(flags: LimitFlags) -> dict[str, Any]:
    """The fields the command line changes (only the flags given); the values are those of
    ``worker.client.set_owner_limits``'s keyword arguments."""
    given = {field: _value(field, raw) for field in FLAGS if (raw := getattr(flags, field)) is not None}
    if not given:
        raise OwnerInputError(f"nothing to set: give at least one of {', '.join(FLAGS.values())}")
    return given


def flag_error(exc: OwnerLimitsInvalid) -> OwnerInputError:
    return OwnerInputError(f"{FLAGS.get(exc.field, exc.field)}: {exc.reason}")


app = commands("an owner's limits: concurrency cap, weight, token budget")
JsonFlag = Annotated[bool, typer.Option("--json")]


@command(app, "set", "change an owner's limits (only the flags given; none clears a limit)")
def cmd_owner_set(
    owner: Owner,
    max_running: Annotated[str | None, typer.Option(metavar="N|none", help="at most N runs running at once")] = None,
    weight: Annotated[
        str | None, typer.Option(metavar="W", help="share of the fleet when it is saturated (1-1000, default 1)")
    ] = None,
    token_budget: Annotated[str | None, typer.Option(metavar="N|none", help="tokens per --budget-window")] = None,
    budget_window: Annotated[str | None, typer.Option(metavar="|".join(BUDGET_WINDOWS))] = None,
    on_budget: Annotated[str | None, typer.Option(metavar="|".join(ON_BUDGET), help="fail the run or wait")] = None,
) -> int:
    from worker import client

    flags = LimitFlags(max_running, weight, token_budget, budget_window, on_budget)
    try:
        limits = client.set_owner_limits(check_owner(owner), **changes_of(flags))
    except OwnerLimitsInvalid as exc:
        raise flag_error(exc) from None
    print(json.dumps(limits.model_dump(mode="json"), indent=2))
    return 0


@command(app, "show", "an owner's limits and the slots its runs hold now")
def cmd_owner_show(owner: Owner, as_json: JsonFlag = False) -> int:
    from worker import client

    limits = client.owner_limits(check_owner(owner))
    if as_json:
        print(json.dumps(limits.model_dump(mode="json"), indent=2))
    else:
        print(_table([limits]))
    return 0


@command(app, "list", "every owner that has limits")
def cmd_owner_list(as_json: JsonFlag = False) -> int:
    from worker import client

    found = client.list_owner_limits()
    if as_json:
        print(json.dumps([limits.model_dump(mode="json") for limits in found], indent=2))
    else:
        print(_table(found))
    return 0


@command(app, "webhook-secret", "the secret the owner's webhook receivers verify deliveries with")
def cmd_owner_webhook_secret(owner: Owner, as_json: JsonFlag = False) -> int:
    """Prints the owner's webhook secret in both forms. It is derived from
    ``AIDAWORK_WEBHOOK_SECRET`` (nothing stored, the same every time): run it where that is
    set, and hand each owner's receivers only their own."""
    from worker.ops.settings import get_settings
    from worker.ops.webhooks.signature import owner_secret, standard_secret

    checked = check_owner(owner)
    master = get_settings().webhook_secret
    if master is None:
        raise OwnerInputError("AIDAWORK_WEBHOOK_SECRET is not set: owners' webhook secrets are derived from it")
    secret = owner_secret(master.get_secret_value(), checked)
    shown = {"owner": checked, "secret": secret, "whsec": standard_secret(secret)}
    if as_json:
        print(json.dumps(shown, indent=2))
    else:
        print(f"owner   {checked}\n"
              f"secret  {shown['secret']}  (AIDAWORK-Signature: worker.client.verify_webhook(body, header, secret))\n"
              f"whsec   {shown['whsec']}  (Standard Webhooks: standardwebhooks.Webhook(whsec).verify(body, headers))")
    return 0


_HEADER = ("OWNER", "RUNNING", "MAX_RUNNING", "WEIGHT", "TOKEN_BUDGET", "WINDOW", "ON_BUDGET")


def _table(found: list[OwnerLimits]) -> str:
    def shown(value: object) -> str:
        return "-" if value is None else str(value)

    lines = [_HEADER] + [
        (o.owner, str(o.running), shown(o.max_running), str(o.weight), shown(o.token_budget),
         shown(o.budget_window), o.on_budget)
        for o in found
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_HEADER))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)

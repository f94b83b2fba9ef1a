"""``aidawork owner set/show/list``: an owner's limits (``schema.store.limits``);
``aidawork owner webhook-secret``: the secret its webhook receivers verify with.

``set`` changes only the flags given; ``none`` clears a limit (``--max-running none``: no
cap; ``--token-budget none``: no budget, and its window goes with it). A refusal names
the flag and exits 2, with nothing stored."""

from __future__ import annotations

import argparse
import json
from typing import Any

from schema.wire.owners import BUDGET_WINDOWS, ON_BUDGET, OwnerLimits, OwnerLimitsInvalid, check_owner_name

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


def _value(field: str, raw: str) -> Any:
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


def changes_of(args: argparse.Namespace) -> dict[str, Any]:
    """The fields the command line changes (only the flags given)."""
    given = {field: _value(field, raw) for field in FLAGS if (raw := getattr(args, field)) is not None}
    if not given:
        raise OwnerInputError(f"nothing to set: give at least one of {', '.join(FLAGS.values())}")
    return given


def flag_error(exc: OwnerLimitsInvalid) -> OwnerInputError:
    return OwnerInputError(f"{FLAGS.get(exc.field, exc.field)}: {exc.reason}")


def cmd_owner_set(args: argparse.Namespace) -> int:
    from worker import client

    try:
        limits = client.set_owner_limits(check_owner(args.owner), **changes_of(args))
    except OwnerLimitsInvalid as exc:
        raise flag_error(exc) from None
    print(json.dumps(limits.model_dump(mode="json"), indent=2))
    return 0


def cmd_owner_show(args: argparse.Namespace) -> int:
    from worker import client

    limits = client.owner_limits(check_owner(args.owner))
    if args.json:
        print(json.dumps(limits.model_dump(mode="json"), indent=2))
    else:
        print(_table([limits]))
    return 0


def cmd_owner_list(args: argparse.Namespace) -> int:
    from worker import client

    found = client.list_owner_limits()
    if args.json:
        print(json.dumps([limits.model_dump(mode="json") for limits in found], indent=2))
    else:
        print(_table(found))
    return 0


def cmd_owner_webhook_secret(args: argparse.Namespace) -> int:
    """Prints the owner's webhook secret in both forms. It is derived from
    ``AIDAWORK_WEBHOOK_SECRET`` (nothing stored, the same every time): run it where that is
    set, and hand each owner's receivers only their own."""
    from worker.ops.settings import get_settings
    from worker.ops.webhooks.signature import owner_secret, standard_secret

    owner = check_owner(args.owner)
    master = get_settings().webhook_secret
    if master is None:
        raise OwnerInputError("AIDAWORK_WEBHOOK_SECRET is not set: owners' webhook secrets are derived from it")
    secret = owner_secret(master.get_secret_value(), owner)
    shown = {"owner": owner, "secret": secret, "whsec": standard_secret(secret)}
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        print(f"owner   {owner}\n"
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


def add_owner_parser(sub: Any) -> None:
    owner = sub.add_parser("owner", help="an owner's limits: concurrency cap, weight, token budget")
    osub = owner.add_subparsers(dest="owner_command", required=True)
    p = osub.add_parser("set", help="change an owner's limits (only the flags given; none clears a limit)")
    p.add_argument("owner")
    p.add_argument("--max-running", dest="max_running", metavar="N|none", help="at most N runs running at once")
    p.add_argument("--weight", metavar="W", help="share of the fleet when it is saturated (1-1000, default 1)")
    p.add_argument("--token-budget", dest="token_budget", metavar="N|none", help="tokens per --budget-window")
    p.add_argument("--budget-window", dest="budget_window", metavar="|".join(BUDGET_WINDOWS))
    p.add_argument("--on-budget", dest="on_budget", metavar="|".join(ON_BUDGET), help="fail the run or wait")
    p.set_defaults(fn=cmd_owner_set)
    p = osub.add_parser("show", help="an owner's limits and the slots its runs hold now")
    p.add_argument("owner")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_owner_show)
    p = osub.add_parser("list", help="every owner that has limits")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_owner_list)
    p = osub.add_parser("webhook-secret", help="the secret the owner's webhook receivers verify deliveries with")
    p.add_argument("owner")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_owner_webhook_secret)

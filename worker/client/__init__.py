"""For upstream services in Python: the stable public client. Its functions and their
signatures change only with a major version (the docs' Python client reference).
May import ``worker.ops``, ``runtime`` and ``schema``; never ``worker.engine``, ``worker.api`` or ``worker.cli``.

The Python interface for upstream services: submit a run, read its status, follow its
events, cancel it, deliver what a suspended run waits for (files, a prerequisite) and
answer its suspended calls (a client tool's result, an approval or a rejection, an
operator's word on an unknown outcome). ``submit`` validates through
``prepare_execution`` first, and the others through ``check_delivery`` /
``check_prerequisite`` / ``check_tool_result`` / ``check_approval`` / ``check_rejection``
(the same ``json_problem`` rules), so bad input raises ``RequestInvalid`` naming the field
and nothing is stored or queued.

Each function takes a ``ClientContext`` (``worker.client.context``: an engine, the
request checks, a dispatcher on its broker); without one, this process's, built from
the environment on first use. Importing this module builds nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal, overload
from uuid import UUID

import structlog

from runtime.canonical import digest
from runtime.deps import client_tool
from runtime.errors import RequestInvalid
from runtime.forks import ForkRules, added_user_message, diff_runs, fork_config, parse_fork_request
from runtime.prepare import format_loc, parse_turn_config, prepare_execution
from runtime.tools import Tool, ToolArgsInvalid
from schema.store import agents as agent_store
from schema.store import answers as answer_store
from schema.store import budgets as budget_store
from schema.store import events as event_store
from schema.store import forks as fork_store
from schema.store import limits as limit_store
from schema.store import runs as run_store
from schema.store import suspensions as suspension_store
from schema.store.answers import Answer, WaitingCall
from schema.store.errors import IdempotencyKeyReused as IdempotencyKeyReused
from schema.store.errors import RootBusy as RootBusy
from schema.store.runs import Submitted
from schema.store.suspensions import Receipt
from schema.wire import TERMINAL_EVENTS, RunEvent, RunRequest, RunView
from schema.wire.agents import AgentView
from schema.wire.forks import Forked, ForkPlan, ForkRequest, RunDiff
from schema.wire.json import JsonMapping, JsonObject, JsonValue
from schema.wire.owners import OwnerLimits, OwnerLimitsChange, check_owner_name
from schema.wire.vocab import ToolAnswerKind
from worker.client.agents import changed_spec, check_agent_name, checked_spec
from worker.client.checks import MAX_REASON_CHARS as MAX_REASON_CHARS
from worker.client.checks import check_approval as check_approval
from worker.client.checks import check_delivery as check_delivery
from worker.client.checks import check_prerequisite as check_prerequisite
from worker.client.checks import check_rejection as check_rejection
from worker.client.checks import check_tool_call_id as check_tool_call_id
from worker.client.checks import check_tool_result as check_tool_result
from worker.client.context import ClientContext, get_client_context, send_woken
from worker.ops.celery_app import send_next_runs, send_or_defer
from worker.ops.deltas import DeltaOrder, DeltaSubscription, RunDelta, ends_stream_of
from worker.ops.observability.tracing import process_tracing, traceparent
from worker.ops.redis_clients import redis_target
from worker.ops.webhooks.policy import WebhookRefused as WebhookRefused
from worker.ops.webhooks.policy import check_webhook_url

# For receivers of a run's webhooks (README, "Webhooks"): re-exported here.
from worker.ops.webhooks.signature import DELIVERY_HEADER as DELIVERY_HEADER
from worker.ops.webhooks.signature import SIGNATURE_HEADER as SIGNATURE_HEADER
from worker.ops.webhooks.signature import verify_webhook as verify_webhook

log = structlog.get_logger("aidawork.client")


def submit(request: Mapping[str, object] | RunRequest, *, ctx: ClientContext | None = None) -> Submitted:
    """Validate, store (one transaction), then ring the doorbell. If the broker is down,
    the run is still stored and the reconciler sends it later. A ``webhook`` whose URL is
    not under ``AIDAWORK_WEBHOOK_URLS`` is refused with ``WebhookRefused``.

    With an ``idempotency_key`` the owner used within ``AIDAWORK_IDEMPOTENCY_TTL_S``, the
    run stored then is returned (``existing``: nothing stored or sent), or, for another
    request, ``IdempotencyKeyReused`` is raised. ``root_policy: reject`` on a Root with an
    active run raises ``RootBusy``; ``interrupt`` / ``rollback`` cancel it
    (``interrupted``)."""
    ctx = ctx or get_client_context()
    engine = ctx.engine
    parsed, prepared = prepare_execution(
        ctx.runtime, request, lambda owner, ref: agent_store.get_agent(engine, owner, ref)
    )
    if parsed.webhook is not None:
        check_webhook_url(parsed.webhook.url, ctx.settings.webhook_prefixes)
    # The submitting process starts the run's trace (None: tracing is off); its rounds join
    # it from the traceparent stored with the run.
    span = process_tracing(ctx.settings).start_submit()
    try:
        submitted = run_store.submit_run(
            ctx.engine,
            parsed,
            prepared.turn_config.model_dump(mode="json"),
            traceparent(span),
            request_digest=None if parsed.idempotency_key is None else request_digest(parsed),
            idempotency_ttl_s=ctx.settings.idempotency_ttl_s,
            agent=prepared.agent,
        )
        if span is not None:
            span.set_attribute("run_id", str(submitted.run_id))
        if submitted.existing:
            # A replay: the run was stored (and sent) by the first submit with this key.
            log.info("submit_replayed", run_id=str(submitted.run_id))
            return submitted
        if submitted.interrupted:
            log.info("runs_interrupted", run_id=str(submitted.run_id), root_policy=parsed.root_policy.value,
                     interrupted=[str(i) for i in submitted.interrupted])
        route = submitted.route
        assert route is not None, "a run stored by this submit has its route"
        # The run is durable: if the broker is down, the reconciler sends it once it is back.
        send_or_defer(ctx.store, submitted.run_id, lambda: ctx.dispatch.round(submitted.run_id, 0, route))
    finally:
        if span is not None:
            span.end()
    return submitted


def create_agent(owner: str, name: str, spec: Mapping[str, object], *, ctx: ClientContext | None = None) -> AgentView:
    """Save version 1 of agent ``name`` for ``owner``: ``spec`` is ``{"config", "description"?,
    "overridable"?}``, its config checked like a run's. ``AgentExists`` if the name is taken;
    ``RequestInvalid`` naming the field for a bad spec (nothing stored)."""
    ctx = ctx or get_client_context()
    check_owner_name(owner)
    return agent_store.create_agent(ctx.engine, owner, check_agent_name(name), checked_spec(ctx, owner, spec))


def update_agent(owner: str, name: str, change: Mapping[str, object], *, ctx: ClientContext | None = None) -> AgentView:
    """Save the next version of ``owner``'s agent ``name``: the latest version with the
    fields ``change`` sends (``description``, ``config``, ``overridable``), checked whole.
    Versions before it stay as they were. ``AgentNotFound`` if there is no such agent."""
    ctx = ctx or get_client_context()
    latest = agent_store.get_agent(ctx.engine, owner, check_agent_name(name))
    return agent_store.update_agent(ctx.engine, owner, name, checked_spec(ctx, owner, changed_spec(latest, change)))


def get_agent(owner: str, ref: str, *, ctx: ClientContext | None = None) -> AgentView:
    """``owner``'s agent: ``NAME`` (its latest version) or ``NAME@VERSION``;
    ``AgentNotFound`` for an unknown, deleted or another owner's agent."""
    return agent_store.get_agent((ctx or get_client_context()).engine, owner, ref)


def list_agents(owner: str, *, ctx: ClientContext | None = None) -> list[AgentView]:
    """The latest version of each of ``owner``'s agents, by name."""
    return agent_store.list_agents((ctx or get_client_context()).engine, owner)


def delete_agent(owner: str, name: str, *, ctx: ClientContext | None = None) -> int:
    """Delete every version of ``owner``'s agent ``name`` (a run may no longer name it;
    runs made from it keep their record); the number of versions deleted."""
    return agent_store.delete_agent((ctx or get_client_context()).engine, owner, check_agent_name(name))


def request_digest(request: RunRequest) -> str:
    """What "the same request" means for an idempotency key: the canonical digest of the
    parsed request (defaults filled in, so an omitted ``root_policy`` and ``"enqueue"``
    are the same) without the key itself."""
    return digest(request.model_dump(mode="json", exclude={"idempotency_key"}))


def status(run_id: UUID, *, owner: str | None = None, ctx: ClientContext | None = None) -> RunView:
    """The run's view; with ``owner``, another owner's run is ``RunNotFound``."""
    return run_store.get_run_view((ctx or get_client_context()).engine, run_id, owner=owner)


def cancel(run_id: UUID, *, ctx: ClientContext | None = None) -> bool:
    """Cancel the run: ``True`` if this call cancelled it, ``False`` if it had already
    ended. The runs queued behind it on its Root are sent."""
    ctx = ctx or get_client_context()
    cancelled, next_runs = run_store.cancel_run(ctx.engine, run_id)
    send_next_runs(ctx.store, ctx.dispatch, next_runs)
    return cancelled


# --- forks ------------------------------------------------------------------------------


def fork(
    run_id: UUID,
    request: ForkRequest | Mapping[str, object],
    *,
    owner: str | None = None,
    ctx: ClientContext | None = None,
) -> Forked:
    """Fork run ``run_id`` at ``request["at_round"]`` (N): a new run on a new Root, of the
    same owner, whose rounds 1..N are the parent's, copied (no model call and no tool
    execution is made for them again), queued to go on at round N + 1 with at most one
    edit (``edit_input``: at N = 0 its input, else a user message after round N;
    ``edit_tool_result``: ``{tool_call_id, result, is_error?}``, a call of round N given
    this result) and its config with ``config_overrides`` (``{"policy.max_rounds": 9}``)
    set, validated like a run's. Its tool calls get their own idempotency keys (they are
    derived from the run id). With ``owner``, another owner's run is ``RunNotFound``.

    Refused with nothing stored: ``RunNotFound``, ``RequestInvalid`` (a field of the
    request, the config) and ``ForkRefused`` (``at_round`` outside the rounds the parent
    committed, an edit naming no call of round N). Sign with the deployment's secret
    (AIDAWORK_SECRET_KEY): the copied rounds' proofs are signed anew for the fork."""
    parsed = parse_fork_request(request)
    ctx = ctx or get_client_context()
    parent_owner, parent_config = fork_store.read_fork_source(ctx.engine, run_id, owner)
    prepared = fork_config(ctx.runtime, parent_config, parsed.config_overrides, parent_owner)
    edit = parsed.edit_input
    span = process_tracing(ctx.settings).start_submit()
    try:
        plan = ForkPlan(
            parent_id=run_id,
            owner=parent_owner,
            at_round=parsed.at_round,
            config=prepared.turn_config.model_dump(mode="json"),
            input=edit if parsed.at_round == 0 else None,
            added_message=added_user_message(edit) if edit is not None and parsed.at_round > 0 else None,
            tool_result=parsed.edit_tool_result,
            trace_context=traceparent(span),
        )
        rules = ForkRules(ctx.runtime.base.proofs, prepared.deps.policy.max_tool_output_bytes)
        forked = fork_store.fork_run(ctx.engine, plan, rules)
        if span is not None:
            span.set_attribute("run_id", str(forked.run_id))
        # Stored: if the broker is down, the reconciler sends it once it is back.
        send_or_defer(
            ctx.store, forked.run_id, lambda: ctx.dispatch.round(forked.run_id, forked.at_round, forked.route)
        )
    finally:
        if span is not None:
            span.end()
    return forked


def diff(run_a: UUID, run_b: UUID, *, owner: str | None = None, ctx: ClientContext | None = None) -> RunDiff:
    """Each round either run committed, compared: the same, or which of its system,
    messages and tools digests, its response and its tool results differ (with both
    values); read in one snapshot. With ``owner``, another owner's run is ``RunNotFound``."""
    ctx = ctx or get_client_context()
    a, b = fork_store.read_run_records(ctx.engine, [run_a, run_b], owner=owner)
    return diff_runs(a, b)


def _resume(ctx: ClientContext, run_id: UUID, receipt: Receipt) -> Receipt:
    """After the commit that made the run ready: send its resume. The run is stored ready
    either way; a broker that is down makes it due for the reconciler instead."""
    if receipt.resumes:
        resumes = receipt.resumes
        route = ctx.store.route_of(run_id)  # a delivery is no round: one small read
        send_or_defer(ctx.store, run_id, lambda: ctx.dispatch.resume(resumes, route))
    return receipt


def deliver(run_id: UUID, tool_call_id: str, files: Mapping[str, str], *, ctx: ClientContext | None = None) -> Receipt:
    """Deliver the files a suspended tool call asked for (path -> UTF-8 text). Delivering
    the same files again changes nothing; anything the run is not waiting for is refused
    with ``DeliveryRefused``. When the round has all its inputs, its resume is sent."""
    check_delivery(tool_call_id, files)
    ctx = ctx or get_client_context()
    receipt = suspension_store.deliver_local_read(
        ctx.engine, run_id, tool_call_id, dict(files), max_file_bytes=ctx.settings.max_local_read_bytes
    )
    return _resume(ctx, run_id, receipt)


def resolve(run_id: UUID, key: str, value: JsonValue, *, ctx: ClientContext | None = None) -> Receipt:
    """Resolve a prerequisite the run waits for; idempotent like ``deliver``."""
    check_prerequisite(key, value)
    ctx = ctx or get_client_context()
    receipt = suspension_store.resolve_prerequisite(ctx.engine, run_id, key, value)
    return _resume(ctx, run_id, receipt)


# --- answers to suspended calls ----------------------------------------------------------
# Each is refused with ``DeliveryRefused`` (nothing stored) unless the run waits for that
# kind of answer to that very call; the same answer again changes nothing (stored False).


def _answer(ctx: ClientContext | None, run_id: UUID, tool_call_id: str, answer: Answer) -> Receipt:
    ctx = ctx or get_client_context()
    receipt = answer_store.answer_tool_call(ctx.engine, run_id, tool_call_id, answer)
    return _resume(ctx, run_id, receipt)


def tool_result(
    run_id: UUID, tool_call_id: str, value: JsonValue, *, is_error: bool = False, ctx: ClientContext | None = None
) -> Receipt:
    """The result of a call that waits for one: a client tool's (``client_tool``), or an
    operator's word on what an ``at_most_once`` call whose end was never recorded did
    (``outcome_unknown``). ``is_error``: the call failed; the model sees a failed result."""
    check_tool_result(tool_call_id, value, is_error)
    return _answer(ctx, run_id, tool_call_id, Answer(ToolAnswerKind.RESULT, value, is_error=is_error))


def retry_tool(run_id: UUID, tool_call_id: str, *, ctx: ClientContext | None = None) -> Receipt:
    """Run an ``at_most_once`` call whose outcome is unknown once more, knowingly (it may
    then have happened twice; its handler gets the same idempotency key)."""
    check_tool_call_id(tool_call_id)
    return _answer(ctx, run_id, tool_call_id, Answer(ToolAnswerKind.RETRY))


def approve(
    run_id: UUID, tool_call_id: str, *, args: JsonMapping | None = None, ctx: ClientContext | None = None
) -> Receipt:
    """Let a call that waits for approval run: as proposed, or with ``args`` instead (the
    whole args, edited), which are checked against the tool's schema first (``RequestInvalid``
    naming ``args.<field>``; nothing stored)."""
    check_approval(tool_call_id, args)
    ctx = ctx or get_client_context()
    edited = None if args is None else dict(args)
    if edited is not None:
        _check_edited_args(ctx, run_id, tool_call_id, edited)
    return _answer(ctx, run_id, tool_call_id, Answer(ToolAnswerKind.APPROVE, edited))


def reject(run_id: UUID, tool_call_id: str, *, reason: str, ctx: ClientContext | None = None) -> Receipt:
    """Refuse a call that waits for approval: it never runs, and the model gets a failed
    result (``TOOL_REJECTED``) with ``reason``; the run goes on to its next round."""
    check_rejection(tool_call_id, reason)
    return _answer(ctx, run_id, tool_call_id, Answer(ToolAnswerKind.REJECT, reason=reason))


def _check_edited_args(ctx: ClientContext, run_id: UUID, tool_call_id: str, args: JsonObject) -> None:
    waiting = answer_store.waiting_call(ctx.engine, run_id, tool_call_id)
    if waiting is None or waiting.kind != "approval":
        return  # not waiting for an approval: the store refuses it, saying why
    tool = _tool_of(ctx, waiting)
    if tool is None:
        # A tool this process does not have (one a worker opens at start): the worker
        # checks the args when it runs the call, and a mismatch is a failed result.
        log.warning("approval_args_unchecked", run_id=str(run_id), tool_call_id=tool_call_id, tool=waiting.tool_name)
        return
    try:
        tool.parse_args(args, strict=True)
    except ToolArgsInvalid as exc:
        raise RequestInvalid(format_loc(exc.loc, "args"), exc.message) from None


def _tool_of(ctx: ClientContext, waiting: WaitingCall) -> Tool | None:
    """The waiting call's tool: one of this process's, or a client tool of the run's config."""
    tool = ctx.runtime.base.tools.get(waiting.tool_name)
    if tool is not None:
        return tool
    try:
        config = parse_turn_config(waiting.config, ctx.runtime.base.turn_config)
    except RequestInvalid:  # a config of a provider this process does not load
        return None
    spec = next((t for t in config.client_tools if t.name == waiting.tool_name), None)
    return None if spec is None else client_tool(spec)


@overload
def events(
    run_id: UUID,
    *,
    after_seq: int = ...,
    poll_s: float = ...,
    follow: bool = ...,
    deltas: Literal[False] = ...,
    ctx: ClientContext | None = ...,
) -> Iterator[RunEvent]: ...


@overload
def events(
    run_id: UUID,
    *,
    after_seq: int = ...,
    poll_s: float = ...,
    follow: bool = ...,
    deltas: bool,
    ctx: ClientContext | None = ...,
) -> Iterator[RunEvent | RunDelta]: ...


def events(
    run_id: UUID,
    *,
    after_seq: int = 0,
    poll_s: float = 0.2,
    follow: bool = True,
    deltas: bool = False,
    ctx: ClientContext | None = None,
) -> Iterator[RunEvent] | Iterator[RunEvent | RunDelta]:
    """The run's events in order from ``after_seq``; with ``follow``, until the run ends.

    With ``deltas``, also the model's text as it streams (``RunDelta``, live only: from
    the moment of the call, never replayed), each before the durable events read after
    it; a delta of a round whose ``model_responded`` was yielded already is dropped."""
    context = ctx or get_client_context()
    run_store.get_run_view(context.engine, run_id)  # RunNotFound early
    if not deltas:
        return _durable_events(context, run_id, after_seq, poll_s, follow)
    return _events_with_deltas(context, run_id, after_seq, poll_s, follow)


def _durable_events(
    context: ClientContext, run_id: UUID, after_seq: int, poll_s: float, follow: bool
) -> Iterator[RunEvent]:
    while True:
        batch = event_store.read_events(context.engine, run_id, after_seq=after_seq)
        for event in batch:
            yield event
            after_seq = event.seq
            if event.kind in TERMINAL_EVENTS:
                return
        if not follow and not batch:
            return
        if not batch:
            time.sleep(poll_s)


def _events_with_deltas(
    context: ClientContext, run_id: UUID, after_seq: int, poll_s: float, follow: bool
) -> Iterator[RunEvent | RunDelta]:
    target = redis_target(context.settings)
    live = DeltaSubscription(target, run_id) if target is not None else None
    order = DeltaOrder()
    streaming: int | None = None  # the round whose deltas are being yielded
    held: list[RunDelta] = []
    try:
        wait_s = 0.0
        while True:
            deadline = time.monotonic() + wait_s
            while live is not None and (delta := live.next(max(0.0, deadline - time.monotonic()))) is not None:
                if delta.round != streaming:
                    # A round starts streaming: the durable events committed before it
                    # (the end of the previous round) are yielded first.
                    streaming = delta.round
                    held.append(delta)
                    break
                if order.keeps(delta):
                    yield delta
            if live is None:
                time.sleep(wait_s)
            batch = event_store.read_events(context.engine, run_id, after_seq=after_seq)
            for event in batch:
                if ends_stream_of(held, event.kind, event.data):
                    yield from held
                    held.clear()
                yield event
                order.responded(event.kind, event.data)
                after_seq = event.seq
                if event.kind in TERMINAL_EVENTS:
                    return
            yield from (delta for delta in held if order.keeps(delta))
            if not follow and not batch and not held:
                return
            wait_s = 0.0 if batch or held else poll_s
            held.clear()
    finally:
        if live is not None:
            live.close()


def wait(run_id: UUID, *, timeout_s: float = 60.0, poll_s: float = 0.1, ctx: ClientContext | None = None) -> RunView:
    """Poll until the run is terminal; returns its view (raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = status(run_id, ctx=ctx)
        if view.status.terminal:
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} is still {view.status} after {timeout_s}s")
        time.sleep(poll_s)


# --- owner limits (README, "Tenants") ---------------------------------------------------

_UNSET: Any = object()


def set_owner_limits(
    owner: str,
    *,
    max_running: int | None = _UNSET,
    weight: int = _UNSET,
    token_budget: int | None = _UNSET,
    budget_window: str | None = _UNSET,
    on_budget: str = _UNSET,
    ctx: ClientContext | None = None,
) -> OwnerLimits:
    """Change ``owner``'s limits: only the arguments given change, ``None`` clears a limit
    (``token_budget=None`` clears its window too). Raises ``OwnerLimitsInvalid`` naming
    the field (nothing stored): a budget without a window (none stored either), a bad
    window, a weight outside 1-1000, a cap below 1."""
    given = {
        name: value
        for name, value in {
            "max_running": max_running,
            "weight": weight,
            "token_budget": token_budget,
            "budget_window": budget_window,
            "on_budget": on_budget,
        }.items()
        if value is not _UNSET
    }
    change = OwnerLimitsChange.of(**given)
    ctx = ctx or get_client_context()
    limits = limit_store.set_owner_limits(ctx.engine, check_owner_name(owner), change)
    if {"token_budget", "budget_window", "on_budget"} & change.model_fields_set:
        # A budget raised or cleared: the runs parked waiting for it that may go on now.
        send_woken(ctx, budget_store.budget_changed(ctx.engine, owner))
    return limits


def owner_limits(owner: str, *, ctx: ClientContext | None = None) -> OwnerLimits:
    """``owner``'s limits and the slots its runs hold now (``running``)."""
    return limit_store.get_owner_limits((ctx or get_client_context()).engine, owner)


def list_owner_limits(*, ctx: ClientContext | None = None) -> list[OwnerLimits]:
    """Every owner that has limits stored, by name."""
    return limit_store.list_owner_limits((ctx or get_client_context()).engine)

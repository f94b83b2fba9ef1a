"""``Store``: the PostgreSQL implementation of ``schema.store.port.StorePort``, the store
operations the worker shell uses, bound to one engine.

Each operation is written once, as a ``<verb>_txn(conn, ...)`` helper in its module (a
function of a connection that never commits, so a caller can compose it in a transaction
of its own). ``Store`` only says how to run each one, with no logic and no extra round
trip: ``transaction`` runs it in one transaction through ``tx.run_transaction`` (its
name, isolation level and serialization-conflict retries; ``single_statement``: one
statement in autocommit, on the driver's connection for the round's hot path), ``read``
on a connection of its own (a read, as the reads have always run: no retry). The method's
signature is the helper's without its connection, so mypy checks it against the port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine

from schema.store import (
    budgets,
    claims,
    effects,
    leases,
    rebuilds,
    resumes,
    rounds,
    routes,
    runs,
    suspensions,
    webhooks,
)
from schema.store.port import StorePort
from schema.store.tx import run_transaction

P = ParamSpec("P")
T = TypeVar("T")


def transaction(
    txn: Callable[Concatenate[Connection, P], T],
    *,
    name: str,
    single_statement: bool = False,
    isolation_level: str | None = None,
) -> Callable[Concatenate[Store, P], T]:
    """The ``Store`` method that runs ``txn`` in one transaction named ``name``."""

    def method(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return run_transaction(
            self.engine,
            lambda conn: txn(conn, *args, **kwargs),
            name=name,
            single_statement=single_statement,
            isolation_level=isolation_level,
        )

    method.__doc__ = txn.__doc__
    return method


def read(txn: Callable[Concatenate[Connection, P], T]) -> Callable[Concatenate[Store, P], T]:
    """The ``Store`` method that runs the read ``txn`` on a connection of its own."""

    def method(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self.engine.connect() as conn:
            return txn(conn, *args, **kwargs)

    method.__doc__ = txn.__doc__
    return method


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- claims ---------------------------------------------------------------------------
    claim_round = transaction(claims.claim_round_txn, name="claim_round", single_statement=True)
    explain_refused_claim = read(claims.explain_refused_claim_txn)
    load_messages = read(claims.load_messages_txn)
    # --- rounds and the model-call ledger -------------------------------------------------
    record_model_call_started = transaction(
        rounds.record_model_call_started_txn, name="model_call_started", single_statement=True
    )
    record_model_call_finished = transaction(
        rounds.record_model_call_finished_txn, name="model_call_finished", single_statement=True
    )
    drop_unused_model_call = transaction(
        rounds.drop_unused_model_call_txn, name="drop_unused_model_call", single_statement=True
    )
    park_for_budget = transaction(budgets.park_for_budget_txn, name="park_for_budget", single_statement=True)
    commit_round = transaction(rounds.commit_round_txn, name="commit_round", single_statement=True)
    # --- at-most-once tool calls ----------------------------------------------------------
    start_tool_execution = transaction(effects.start_execution_txn, name="start_tool_execution")
    finish_tool_execution = transaction(effects.finish_execution_txn, name="finish_tool_execution")
    # --- giving a claim back, ending a run, dispatch --------------------------------------
    release_lease = transaction(leases.release_lease_txn, name="release_lease", single_statement=True)
    fail_claimed_run = transaction(runs.fail_claimed_run_txn, name="end_run", single_statement=True)
    end_interrupted_run = transaction(runs.end_interrupted_run_txn, name="end_interrupted_run")
    route_of = read(routes.route_of_txn)
    due_of = read(leases.due_of_txn)
    pending_resumes = read(suspensions.pending_resumes_txn)
    dispatch_failed = transaction(leases.dispatch_failed_txn, name="dispatch_failed", single_statement=True)
    # --- suspensions ----------------------------------------------------------------------
    resume_if_ready = transaction(suspensions.resume_if_ready_txn, name="resume_if_ready")
    load_suspension = transaction(
        resumes.load_suspension_txn, name="load_suspension", isolation_level="REPEATABLE READ"
    )
    # --- a run's webhook (set after submit: an A2A push config) -----------------------------
    set_webhook = transaction(webhooks.set_webhook_txn, name="set_webhook")
    read_webhook_url = read(webhooks.read_webhook_url_txn)
    # --- context rebuilds -----------------------------------------------------------------
    reserve_model_rebuild = transaction(rebuilds.reserve_model_rebuild_txn, name="reserve_model_rebuild")
    load_context_sources = read(rebuilds.load_context_sources_txn)
    record_candidate = transaction(
        rebuilds.record_candidate_txn, name="record_rebuild_candidate", single_statement=True
    )
    admit_model_rebuild_request = transaction(
        rebuilds.admit_model_rebuild_request_txn, name="admit_model_rebuild_request", isolation_level="REPEATABLE READ"
    )


def _conforms(store: Store) -> StorePort:
    return store  # mypy: Store implements every operation of the port, with its signature

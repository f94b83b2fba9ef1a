"""All SQL of the project, split by concern. Each operation is a module-level
``<verb>_txn(conn, ...)`` that never commits, so a caller can compose several of them in
one transaction of its own; the other public functions that write run one of them in one
transaction (through ``tx.run_transaction``).

- ``port``: ``StorePort``, the operations the worker shell uses (claim, ledger, commit,
  release, fail, suspensions, rebuilds, dispatch), as a ``Protocol``
- ``store``: ``Store``, the port on PostgreSQL: each operation's ``_txn`` helper, run in
  a transaction (or, a read, on a connection) of one engine; the worker's contexts carry
  one as ``ctx.store``, and the unit tests put an in-memory double in its place
  (``tests/support/memory_store.py``, checked against the port by mypy and by
  ``tests/db/test_store_contract.py``)
- ``rows``: ``StoredRow``, a row as a statement returns it

- ``runs``: submit a run, end it outside a round (fail a held run, cancel), its view
- ``claims``: the claim of a run for a round or a resume, and why a claim was refused
- ``rounds``: the model-call ledger and the one-statement commit of a round
- ``suspensions``: what a suspended round waits for, deliveries, when a run is ready
- ``answers``: answers to suspended calls (a client tool's result, an approval, ...)
- ``resumes``: what a resume reads (the suspended round, its calls, their inputs)
- ``rebuilds``: context rebuilds (reservation, candidate, admission)
- ``leases``: heartbeat, release, and the reconciler's query
- ``workers``: the registry of worker processes
- ``owners``, ``events``: reads (owner-scoped for the HTTP API; a run's event log)
- ``audit``: every run's boundaries, fences, messages, events and ledger checked
  against each other, read-only (``aidawork audit``)
- ``telemetry``: reads for the operator's metrics and traces
- ``roots``, ``bodies``: named SQL fragments (a Root's order; a message or event as read)
- ``tx``: the engine and the one transaction retry helper
"""

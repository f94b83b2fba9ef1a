"""What the tests share, and nothing else: builders, fakes, loopback servers, helpers that
start and watch real processes, and readers of rows. Test modules import from here, never
from ``conftest`` or from each other; the conftest files hold only fixtures.

- ``env``: where the test services are (PostgreSQL, the test Redis database) and the
  fast timings the worker processes run with.
- ``requests``: the one run-request builder for the scripted model.
- ``fakes``: in-memory models, hooks, factories and the recording broker (no I/O).
- ``providers``: a loopback HTTP server speaking the OpenAI and Anthropic wire formats.
- ``db``: reading rows and waiting for them; ``store``: driving the store directly.
- ``memory_store``: ``InMemoryStore``, the double of ``schema.store.store.Store`` over
  dicts (parts in ``memory_state``, ``memory_suspensions``, ``memory_rebuilds``; kept honest
  by tests/db/test_memory_store_parity.py); ``shell``: a worker
  context on it, with a fake lease keeper and a fake dispatcher (the shell's unit tests).
- ``suspensions``: runs suspended in-process, resumes altered, table snapshots.
- ``cluster``, ``storm``, ``api``: real worker, beat and API processes (and the API in
  process, for the unit tests); ``shapes``: deeply nested JSON values.
- ``wait``: ``wait_until``, the one polling loop.
- ``docs_summary``: the docs tier's summary of its examples (tests/conftest.py prints it).
"""

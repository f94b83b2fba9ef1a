"""Exported runs (``schema.wire.case``): their verification (``verify``), and their replay
against this process's code, config and tools (``replay``, compared in ``report``). Pure:
the worker reads the store and the files; nothing here stores anything."""

"""Export and replay, for operators' commands and for test suites: a run's case from the
store (``export``), a case verified and replayed in this process against this code, config
and tools (``session``, on ``runtime.cases``), and the pytest plugin that collects a folder
of cases as tests (``pytest_plugin``). Part of the client layer: it may import
``worker.ops``, ``runtime`` and ``schema``. A replay writes nothing anywhere."""

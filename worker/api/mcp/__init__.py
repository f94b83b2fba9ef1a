"""The MCP server (streamable HTTP, the official ``mcp`` SDK) at ``/mcp``: each of the
caller's saved agents is a tool, and a call of one is a durable run.

- Authentication: the API's bearer tokens (``worker.api.mcp.endpoint``); a tool listing,
  a call and a task are the token owner's only, and another owner's task is not found.
- A call waits for its run (60 s at most), sending the run's events as progress; a run
  that waits for an answer asks the client (form elicitations in an ``input_required``
  result, protocol 2026-07-28) or says how to answer it (``task.answer``).
- With the tasks extension (``io.modelcontextprotocol/tasks``) a call is a task whose id
  is the run id: ``tasks/get``, ``tasks/update``, ``tasks/cancel``, ``tasks/result``.
- No state in memory: the session manager is stateless and every answer is read from the
  run store, so any API process answers for a task, before or after a restart.

Modules: ``server`` (assembly), ``endpoint`` (``/mcp`` and its token check), ``calls``
(``tools/list``, ``tools/call``), ``tasks`` (the extension), ``runs`` (runs through
``worker.client``), ``elicit`` (waits as elicitations and back), ``results`` (runs as
results and tasks), ``tools`` (the tools and their arguments), ``caller`` (who asks).
"""

from worker.api.mcp.server import McpService

__all__ = ["McpService"]

"""The A2A server (protocol 1.0, JSON-RPC binding) of each saved agent, at ``/a2a/{agent}``.

A task is a run of the agent: its id is the run id, its context id the run's Root id, its
state the run's status, and its updates the run's durable events, so any API process
answers for any task and a task survives a restart. The SDK parses and dispatches
(``JsonRpcDispatcher``); ``RunTasks`` answers from the run store through ``worker.client``.

- ``routes``: the card and the JSON-RPC endpoint, authentication, the body's refusals;
- ``handler``: ``RunTasks``, each protocol method;
- ``sends``: what a message does (start a run, or answer one) and push configs (the
  run's webhook);
- ``answers``: the data parts that answer a suspended task;
- ``tasks``: runs and events as tasks and updates (pure); ``card``: the agent card (pure).
"""

from worker.api.a2a.routes import body_refusals, router

__all__ = ["body_refusals", "router"]

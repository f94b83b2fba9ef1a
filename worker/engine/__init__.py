"""For the Celery worker processes: the tasks, the round, the broker's fair queues, leases, reconcile.
Serves ``aidawork worker`` and ``aidawork beat``; nothing imports it but ``worker.cli``.
May import ``worker.client``, ``worker.ops``, ``runtime`` and ``schema``; never ``worker.api``."""

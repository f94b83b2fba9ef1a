"""Signed webhooks from the durable outbox (``schema.store.webhooks``).

``signature``: the ``AIDAWORK-Signature`` header and its check (receivers use
``worker.client.verify_webhook``); ``policy``: which URLs a run may name, the backoff
between attempts, the form of a URL that may be logged; ``deliverer``: the
``aidawork webhooks`` process that POSTs due deliveries."""

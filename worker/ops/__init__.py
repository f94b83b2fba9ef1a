"""For whoever deploys and operates AIDAWORK: settings, JSON logs, metrics and traces, the Celery
app's configuration, the live delta stream, webhooks, rate limits and retention. The bottom of
``worker``: it imports only ``runtime`` and ``schema``, and the other four packages import it."""

"""The Celery side of AIDAWORK: thin tasks around ``worker.round``."""

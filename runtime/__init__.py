"""The orchestration core: decides what a round does, never stores anything.

This package imports neither Celery, SQLAlchemy, psycopg nor redis (``make lint``
enforces it), so the whole loop can be driven in memory.
"""

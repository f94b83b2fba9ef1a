"""AIDAWORK's service side, in five packages by audience, each importing only those below it:
``cli`` (operators' commands) over ``engine`` (the Celery worker) and ``api`` (the HTTP API),
over ``client`` (the stable Python client), over ``ops`` (settings, logging, observability)."""

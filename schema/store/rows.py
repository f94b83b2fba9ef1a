"""``StoredRow``: a row as a statement of the store returns it, its columns read by name
(``row.status``): SQLAlchemy's ``Row`` of any columns. On the round's hot path the same
SQL runs on the driver (``schema.store.driver``), whose rows are read the same way."""

from __future__ import annotations

from typing import TypeAlias

from sqlalchemy import Row

StoredRow: TypeAlias = Row[*tuple[object, ...]]

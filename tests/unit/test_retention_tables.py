"""The prune's list of tables (schema.store.retention.ROWS) covers every table that holds
rows of a run or a Root: a table added later with a foreign key to runs, roots or a table
they own fails here until the prune deletes (and counts) its rows too."""

from __future__ import annotations

from schema.store.retention import TABLES
from schema.tables import metadata


def owned_tables() -> set[str]:
    """runs and roots, and every table reaching them through foreign keys."""
    owned = {"runs", "roots"}
    grew = True
    while grew:
        grew = False
        for table in metadata.sorted_tables:
            if table.name not in owned and any(fk.column.table.name in owned for fk in table.foreign_keys):
                owned.add(table.name)
                grew = True
    return owned


def test_the_prune_deletes_rows_of_every_table_that_references_a_run_or_a_root() -> None:
    assert set(TABLES) == owned_tables()


def test_the_prune_deletes_children_before_the_rows_they_reference() -> None:
    position = {name: i for i, name in enumerate(TABLES)}
    for table in metadata.sorted_tables:
        for fk in table.foreign_keys:
            parent = fk.column.table.name
            if table.name in position and parent in position and parent != table.name:
                assert position[table.name] < position[parent], (table.name, parent)

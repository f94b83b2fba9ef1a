"""Where a round's WAL goes: the WAL records written over a bench phase, read back with
PostgreSQL's ``pg_walinspect`` (in the server since 15) and grouped by the relation they
change (a table, or one of its indexes), with commit records and full-page images apart.

It shows what the WAL floor is made of: what each table's rows cost, what their indexes
add, and what no change to the rows can save (commit records, full-page images after a
checkpoint). ``bench/stack.py`` prints it under each phase.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import Connection, text

# PostgreSQL 15 and later: "blkref #0: rel 1663/16384/2619 fork main blk 10 ..."
_FIRST_BLOCK = re.compile(r"rel \d+/(\d+)/(\d+)")


@dataclass
class WalBreakdown:
    """Bytes of WAL by what they change, over one phase."""

    by_target: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    records: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    fpi_bytes: int = 0
    total: int = 0

    def lines(self, rounds: int) -> list[str]:
        n = max(rounds, 1)
        out = [f"  WAL per round by what it changes ({self.total / n:.0f} B in all, "
               f"of which full-page images {self.fpi_bytes / n:.0f} B):"]
        for target, size in sorted(self.by_target.items(), key=lambda item: -item[1]):
            if size / n >= 5:
                out.append(f"    {target:<44} {size / n:7.0f} B  {self.records[target] / n:5.2f} records")
        return out


def enable(conn: Connection) -> None:
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
    conn.commit()


def current_lsn(conn: Connection) -> str:
    return str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())


def breakdown(conn: Connection, start_lsn: str, end_lsn: str) -> WalBreakdown:
    """Group the records between the two positions by the relation of their first block
    (its table for an index, "name (indexes)"); records of other databases and of no
    relation (commits, running transactions) are named by their kind."""
    database = int(conn.execute(text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one())
    names: dict[int, str] = {}
    for row in conn.execute(text(
        "SELECT pg_relation_filenode(c.oid) AS node, c.relname, c.relkind, t.relname AS tab "
        "FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid "
        "WHERE pg_relation_filenode(c.oid) IS NOT NULL"
    )):
        names[int(row.node)] = f"{row.tab} (indexes)" if row.relkind == "i" and row.tab else str(row.relname)
    found = WalBreakdown()
    records = conn.execute(
        text("SELECT resource_manager, record_type, record_length, fpi_length, block_ref "
             "FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))"),
        {"start": start_lsn, "end": end_lsn},
    )
    for rec in records:
        block = _FIRST_BLOCK.search(rec.block_ref or "")
        if block is None:
            target = f"{rec.resource_manager} {rec.record_type.split()[0]} records"
        elif int(block.group(1)) != database:
            target = "other databases"
        else:
            target = names.get(int(block.group(2)), "other relations")
        found.by_target[target] += int(rec.record_length)
        found.records[target] += 1
        found.fpi_bytes += int(rec.fpi_length or 0)
        found.total += int(rec.record_length)
    return found

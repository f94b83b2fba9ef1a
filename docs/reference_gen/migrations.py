"""Reference of the database migrations, read by Alembic from
``schema/migrations/versions`` (no database needed): each revision in the order they
apply, the one it follows, and the first paragraph of its docstring."""

from __future__ import annotations

from pathlib import Path

from reference_gen import cell, code, header, table


def revisions() -> list[tuple[str, str, str, str]]:
    """(revision, down_revision, file, what it does), oldest first."""
    from alembic.script import ScriptDirectory

    import schema.migrations

    scripts = ScriptDirectory(str(Path(schema.migrations.__file__).parent))
    found = []
    for script in reversed(list(scripts.walk_revisions())):
        down = script.down_revision
        downs = down if isinstance(down, str) else ", ".join(down or ())
        doc = (script.longdoc or "").split("\n\n")[0]
        found.append((script.revision, downs, Path(script.path).name, " ".join(doc.split())))
    return found


def page() -> str:
    text = header(
        "Migrations",
        "the Alembic revisions of `schema/migrations/versions`",
        "`aidawork migrate` creates the database if needed and applies every revision not yet applied, in this "
        "order (see [Upgrade](../how-to/upgrade.md)).",
    )
    rows = [
        [code(rev), code(down) if down else "(base)", code(name), cell(doc)]
        for rev, down, name, doc in revisions()
    ]
    return text + table(["revision", "follows", "file", "what it does"], rows)

"""Everything about data at rest (tables, migrations, the store) and on the wire."""

"""DuckDB SQL (``lineage/sql/*.sql``) that reconstructs entry and adopted joint depth per
episode from a trace's event table, beside an independent scalar replay."""

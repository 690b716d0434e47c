"""The views' documentation without starting DuckDB: ``lineage/views_catalog.json``.

``hybridmem lineage views`` prints every view's comment and its columns' types and comments. The
live source is DuckDB's catalog after creating the views over an empty event table
(:func:`lineage.views.describe_views`, about 2 CPU-seconds with the imports). The same listing is
kept in ``views_catalog.json`` with a digest of what it was read from (the SQL files and the
event-table schema's source); it is used only while that digest matches, else the live catalog
answers. ``python -m lineage.catalog`` rewrites it; a test keeps it fresh.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lineage.sql_files import SQL_DIR

CATALOG = Path(__file__).with_name("views_catalog.json")
_SCHEMA_SOURCE = Path(__file__).parent.parent / "tracer" / "schema.py"

View = tuple[str, str, list[tuple[str, str, str]]]  # name, comment, (column, type, comment)


def digest() -> str:
    h = hashlib.sha256()
    for path in sorted(SQL_DIR.glob("*.sql")) + [_SCHEMA_SOURCE]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _live(include_private: bool) -> list[View]:
    from lineage.views import describe_views

    return [(v.name, v.comment, [(c.name, c.type, c.comment) for c in v.columns])
            for v in describe_views(include_private=include_private)]


def _cached() -> dict[str, Any] | None:
    try:
        data = json.loads(CATALOG.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("digest") == digest() else None


def describe(include_private: bool = False) -> list[View]:
    """Every view (private ones too with ``include_private``), from the catalog file while it is
    fresh, else from DuckDB."""
    data = _cached()
    if data is None:
        return _live(include_private)
    return [(v["name"], v["comment"], [(c[0], c[1], c[2]) for c in v["columns"]])
            for v in data["views"] if include_private or not v["name"].startswith("_")]


def write() -> Path:
    views = [{"name": n, "comment": c, "columns": cols} for n, c, cols in _live(True)]
    tmp = CATALOG.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"digest": digest(), "views": views}, indent=1) + "\n")
    tmp.replace(CATALOG)
    return CATALOG


if __name__ == "__main__":
    print(f"wrote {write()}")

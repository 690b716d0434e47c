"""Long-format results tables: one row per (seed, arm) with a numeric ``value``.

CSV (header row required) or Parquet (``.parquet``/``.pq``), columns ``seed,arm,value``; other
columns are ignored. Example::

    seed,arm,value
    88001,S2-share,522.152
    88001,Ret-share,560.830

Loaded as ``{arm: {seed: value}}``. A repeated ``(seed, arm)`` is an error, never averaged.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from hybridmem.stats.errors import StatsError

COLUMNS = ("seed", "arm", "value")
PARQUET_SUFFIXES = (".parquet", ".pq")

LongTable = dict[str, dict[int, float]]


def _seed(raw: Any, where: str) -> int:
    try:
        f = float(raw)
    except (TypeError, ValueError):
        raise StatsError(f"{where}: seed {raw!r} is not an integer") from None
    if not math.isfinite(f) or f != int(f):
        raise StatsError(f"{where}: seed {raw!r} is not an integer")
    return int(f)


def _value(raw: Any, where: str) -> float:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise StatsError(f"{where}: value {raw!r} is not a number") from None
    if not math.isfinite(v):
        raise StatsError(f"{where}: value {raw!r} is not finite")
    return v


def _rows_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            header = list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise StatsError(f"cannot read CSV {str(path)!r}: {exc}") from None
    return [h.strip() for h in header], [{k.strip(): v for k, v in r.items() if k} for r in rows]


def _rows_parquet(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise StatsError(f"cannot read Parquet {str(path)!r}: {exc}") from None
    return list(table.column_names), table.to_pylist()


def load_long(path: str | Path) -> LongTable:
    """``{arm: {seed: value}}`` from a long-format CSV or Parquet file."""
    p = Path(path)
    if not p.is_file():
        raise StatsError(f"no such file: {str(p)!r}")
    header, rows = (_rows_parquet(p) if p.suffix.lower() in PARQUET_SUFFIXES else _rows_csv(p))
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise StatsError(f"{str(p)!r} lacks column(s) {missing}; columns are {header}")
    if not rows:
        raise StatsError(f"{str(p)!r} has no data rows")
    table: LongTable = {}
    for i, row in enumerate(rows, start=2 if p.suffix.lower() not in PARQUET_SUFFIXES else 1):
        where = f"{p.name} row {i}"
        arm = row["arm"]
        if arm is None or str(arm).strip() == "":
            raise StatsError(f"{where}: empty arm")
        arm = str(arm).strip()
        seed = _seed(row["seed"], where)
        value = _value(row["value"], where)
        by_seed = table.setdefault(arm, {})
        if seed in by_seed:
            raise StatsError(f"{where}: seed {seed} of arm {arm!r} appears twice")
        by_seed[seed] = value
    return table


def arm(table: LongTable, name: str) -> dict[int, float]:
    """The seed -> value map of one arm, or an error naming the arms that exist."""
    if name not in table:
        raise StatsError(f"no arm {name!r}; arms are {sorted(table)}")
    return table[name]

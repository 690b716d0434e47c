"""Per-view CPU and wall time of the lineage report's SQL, for one or both SQL sets side by side.

    PYTHONPATH=. python benchmarks/ab_lineage_sql.py RUN.parquet [--sql reference current]
        [--modes report] [--rounds 2] [--threads N] [--json OUT.json] [--check]

The report's SQL is what ``lineage.report.analyse`` runs before the replay: load the events into
DuckDB, create every view with the heavy ones materialized (``views.connect(materialize=True)``),
then read ``episode_lineage``, ``run_summary``, ``table_checks``, ``class_counts`` and
``loss_causes``. Each step is timed separately: CPU = user + system of this process (DuckDB's
threads included; ``time.process_time``), wall = ``time.perf_counter``. Views that are not
materialized cost nothing when created (DuckDB inlines them into their readers), so their time
shows up in the step that reads them.

With two SQL sets (``reference``: the ASOF-join formulation kept in ``lineage/sql/reference``;
``current``: ``lineage/sql``) the rounds are interleaved (A B A B ...) so both see the same load,
and the last lines give each set's total per round and the ratio current / reference.

``--modes`` sets how the connection is made, per set: ``report`` (what ``analyse`` uses:
``views.connect`` defaults, i.e. a zero-copy Arrow scan of the events and, up to
``views.SINGLE_THREAD_EVENTS`` events, one DuckDB thread) and ``copy-mt`` (the events copied
into a DuckDB table, one thread per core: the report's connection before 2026-12-01). With
several modes every (set, mode) pair runs in each round and the ratio lines compare them to the
first pair.
``--check`` then compares every public view's rows between the two sets (exit 1 if any differ).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lineage import views
from lineage.table import table_meta

READS = ("episode_lineage", "run_summary", "table_checks", "class_counts", "loss_causes")
PUBLIC = ("episodes", "episode_lineage", "depth_changes", "class_counts", "run_summary",
          "loss_causes", "table_checks")


def public_rows(table: pa.Table, sql: str) -> dict[str, pa.Table]:
    """Every public view of the SQL set ``sql`` over ``table``, rows sorted by every column."""
    con = views.connect(table, materialize=True, sql=sql)
    out = {}
    for name in PUBLIC:
        t = con.sql(f"SELECT * FROM {name}").to_arrow_table()
        out[name] = t.sort_by([(c, "ascending") for c in t.column_names])
    con.close()
    return out


MODES = {"report": {}, "copy-mt": {"copy": True, "threads": os.cpu_count() or 1}}


def one_run(table: pa.Table, sql: str, threads: int | None,
            mode: str = "report") -> list[tuple[str, float, float]]:
    """[(step, cpu_s, wall_s)] for one complete report SQL over ``table``."""
    kw: dict[str, object] = dict(MODES[mode])
    if threads is not None:
        kw["threads"] = threads
    steps: list[tuple[str, float, float]] = []
    mark = [time.process_time(), time.perf_counter()]

    def lap(name: str) -> None:
        c, w = time.process_time(), time.perf_counter()
        steps.append((name, c - mark[0], w - mark[1]))
        mark[0], mark[1] = c, w

    con = views.connect(table, materialize=True, sql=sql, on_view=lap,
                        **kw)  # type: ignore[arg-type]
    for name in READS:
        con.sql(f"SELECT * FROM {name}").to_arrow_table()
        lap(f"read {name}")
    con.close()
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--sql", nargs="+", default=["reference", "current"],
                    choices=sorted(views.SQL_SETS))
    ap.add_argument("--modes", nargs="+", default=["report"], choices=sorted(MODES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all)")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    ap.add_argument("--check", action="store_true",
                    help="compare every public view between reference and current")
    a = ap.parse_args()
    if not 1 <= a.rounds <= 20:
        print(f"--rounds must be 1..20, got {a.rounds}", file=sys.stderr)
        return 2
    if a.threads is not None and not 1 <= a.threads <= 256:
        print(f"--threads must be 1..256, got {a.threads}", file=sys.stderr)
        return 2
    if not Path(a.path).is_file():
        print(f"no such file: {a.path}", file=sys.stderr)
        return 2
    table = pq.read_table(a.path)
    table_meta(table, a.path)
    events = table.num_rows
    print(f"# {a.path}: {events:,} events; load average {os.getloadavg()[0]:.2f}")
    pairs = [(sql, mode) for sql in a.sql for mode in a.modes]
    label = {p: p[0] if len(a.modes) == 1 else f"{p[0]}/{p[1]}" for p in pairs}
    totals: dict[str, list[tuple[float, float]]] = {label[p]: [] for p in pairs}
    records = []
    for r in range(a.rounds):
        for sql, mode in pairs:
            steps = one_run(table, sql, a.threads, mode)
            cpu = sum(s[1] for s in steps)
            wall = sum(s[2] for s in steps)
            totals[label[sql, mode]].append((cpu, wall))
            print(f"## round {r + 1} sql={sql} mode={mode} load {os.getloadavg()[0]:.2f}")
            for name, c, w in steps:
                if c >= 0.005 or w >= 0.005:
                    print(f"   {name:28s} cpu {c:6.2f} s  wall {w:6.2f} s")
            print(f"   {'TOTAL':28s} cpu {cpu:6.2f} s  wall {wall:6.2f} s  "
                  f"({cpu / events * 1e6:.2f} CPU-s per 1M events)", flush=True)
            records.append({"round": r + 1, "sql": sql, "mode": mode, "cpu_s": round(cpu, 3),
                            "wall_s": round(wall, 3),
                            "steps": [(n, round(c, 3), round(w, 3)) for n, c, w in steps]})
    for name, vals in totals.items():
        cpus = ", ".join(f"{c:.2f}" for c, _ in vals)
        walls = ", ".join(f"{w:.2f}" for _, w in vals)
        print(f"# {name:9s} CPU-s per round: {cpus}  (wall {walls})")
    first = label[pairs[0]]
    for p in pairs[1:]:
        ratios = [c[0] / r[0] for c, r in zip(totals[label[p]], totals[first], strict=True)]
        wratios = [c[1] / r[1] for c, r in zip(totals[label[p]], totals[first], strict=True)]
        print(f"# CPU ratio {label[p]} / {first} per round: "
              + ", ".join(f"{x:.2f}" for x in ratios)
              + "  (wall " + ", ".join(f"{x:.2f}" for x in wratios) + ")")
    if a.json:
        Path(a.json).write_text(json.dumps({"path": a.path, "events": events,
                                            "runs": records}, indent=1))
    if a.check:
        ref, cur = public_rows(table, "reference"), public_rows(table, "current")
        same = True
        for name in PUBLIC:
            equal = ref[name].equals(cur[name])
            same = same and equal
            print(f"# check {name}: {ref[name].num_rows:,} rows, "
                  f"{'equal' if equal else 'DIFFER'}")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

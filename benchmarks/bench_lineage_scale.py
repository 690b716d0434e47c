"""Lineage SQL at scale in bounded memory: 1M, 3M, 10M ... events, linear time.

    PYTHONPATH=. python benchmarks/bench_lineage_scale.py --tiles 1 3 10 [--memory-limit 4GB]
        [--work DIR] [--cache DIR] [--sql current|reference]

The ~1M-event S2 run of ``bench_lineage.py`` (simulated once, cached) is written as Parquet
tiles, one independent copy per file (``bench_lineage.tile_copy``), one tile in memory at a
time. Each size then runs in a fresh child process: DuckDB reads the first N tiles with
``read_parquet`` into an on-disk database under ``--work`` (``lineage.views.connect_parquet``),
builds every view with the heavy ones materialized, under ``--memory-limit`` with spilling to
``--work``, and reads the report views. ``_chain_validity`` is computed in key partitions of
about ``lineage.views.PART_EVENTS`` events each (``--parts`` overrides). The child prints wall
seconds, CPU seconds (its own user + system, DuckDB's threads included, also per view) and its
peak resident set (``ru_maxrss``). No Python copy of the events is made, so memory is bounded
by DuckDB's limit plus the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.bench_lineage import build, tile_copy


def write_tiles(base: Path, work: Path, count: int) -> list[str]:
    table = pq.read_table(base)
    steps = None
    paths = []
    for k in range(count):
        path = work / f"tile_{k:04d}.parquet"
        if not path.exists():
            if steps is None:
                import pyarrow.compute as pc

                steps = pc.max(table.column("step")).as_py() + 1
            tmp = path.with_suffix(".tmp")
            pq.write_table(tile_copy(table, k, steps), tmp)
            os.replace(tmp, path)
        paths.append(str(path))
    return paths


def child(paths: list[str], work: Path, memory_limit: str, sql: str,
          threads: int | None, parts: int | None, accelerate: bool = False) -> dict[str, object]:
    from lineage import views

    db = work / "lineage.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    spill = work / "spill"
    spill.mkdir(exist_ok=True)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    steps: dict[str, float] = {}
    mark = [r0.ru_utime + r0.ru_stime]

    def lap(name: str) -> None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        steps[name] = round(r.ru_utime + r.ru_stime - mark[0], 2)
        mark[0] = r.ru_utime + r.ru_stime

    con = views.connect_parquet(paths, database=str(db), memory_limit=memory_limit,
                                temp_directory=str(spill), sql=sql, on_view=lap,
                                threads=threads, parts=parts, accelerate=accelerate)
    events = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    lap("read events count")
    summary = con.sql("SELECT episodes, classified_episodes, shallower_episodes, "
                      "shallower_with_other_request_loss FROM run_summary").fetchall()[0]
    lap("read run_summary")
    for name in ("class_counts", "loss_causes", "table_checks"):
        con.sql(f"SELECT * FROM {name}").fetchall()
        lap(f"read {name}")
    con.close()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    db_bytes = db.stat().st_size
    db.unlink()
    return {"events": events, "episodes": summary[0], "classified": summary[1],
            "attribution": f"{summary[3]}/{summary[2]}", "sql_wall_s": round(wall, 2),
            "sql_cpu_s": round(cpu, 2), "cpu_s_per_m_events": round(cpu / events * 1e6, 2),
            "peak_rss_mib": round(r1.ru_maxrss / 1024), "db_file_mib": round(db_bytes / 2**20),
            "memory_limit": memory_limit, "sql": sql, "threads": threads,
            "accelerate": accelerate,
            "parts": parts if parts is not None else max(1, -(-events // views.PART_EVENTS)),
            "load_avg": round(os.getloadavg()[0], 2),
            "cpu_s_by_step": {k: v for k, v in steps.items() if v >= 0.01}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", type=int, nargs="+", default=[1, 3, 10])
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--work", default="/tmp/hybridmem-bench/scale")
    ap.add_argument("--cache", default="/tmp/hybridmem-bench")
    ap.add_argument("--sql", default="current", choices=["current", "reference"],
                    help="the lineage SQL set (lineage.views.SQL_SETS)")
    ap.add_argument("--threads", type=int, default=None,
                    help="DuckDB threads (default: one per core)")
    ap.add_argument("--parts", type=int, default=None,
                    help="key partitions of _chain_validity (default: one per "
                         "lineage.views.PART_EVENTS events)")
    ap.add_argument("--accelerate", action="store_true",
                    help="compute _supply, _chain_probe and _chain_validity in NumPy key "
                         "partition by key partition and the per-episode views episode range "
                         "by episode range (lineage/bounded.py; the Python side "
                         "needs memory beside DuckDB's limit: ~3 GiB at 100M events)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if any(n < 1 for n in args.tiles):
        print(f"--tiles must be >= 1, got {args.tiles}", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.child:
        paths = sorted(str(p) for p in work.glob("tile_*.parquet"))[:args.tiles[0]]
        print(json.dumps(child(paths, work, args.memory_limit, args.sql, args.threads,
                               args.parts, args.accelerate)), flush=True)
        return 0
    base = build("S2", 1_000_000, Path(args.cache))
    write_tiles(base, work, max(args.tiles))
    rows = []
    for n in args.tiles:
        print(f"# {n} tile(s) ...", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--child", "--tiles", str(n),
                              "--work", str(work), "--memory-limit", args.memory_limit,
                              "--sql", args.sql]
                             + ([] if args.threads is None else ["--threads", str(args.threads)])
                             + ([] if args.parts is None else ["--parts", str(args.parts)])
                             + (["--accelerate"] if args.accelerate else []),
                             check=True, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
        row = {"tiles": n, **json.loads(out.stdout.strip().splitlines()[-1])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    shutil.rmtree(work / "spill", ignore_errors=True)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        scale = int(str(last["events"])) / int(str(first["events"]))
        grow = float(str(last["sql_cpu_s"])) / float(str(first["sql_cpu_s"]))
        print(f"# events x{scale:.1f} -> SQL CPU x{grow:.2f} (linear: x{scale:.1f}); "
              f"100M events at {last['cpu_s_per_m_events']} CPU-s per 1M: "
              f"~{float(str(last['cpu_s_per_m_events'])) * 100 / 60:.0f} CPU-minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

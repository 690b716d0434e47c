"""Lineage throughput on synthetic traces of about 1M events, and how it grows at 10M.

    PYTHONPATH=. python benchmarks/bench_lineage.py [--org S2 D0] [--events 1000000]
        [--tile 10] [--cache DIR] [--no-replay-tiled] [--json OUT.json]

Each run is simulated once by :mod:`lineage.synth` (cached as Parquet under --cache) at a load
that keeps the waiting queue bounded (a realistic trace, not an ever-growing backlog). The
10M table is the 1M run tiled --tile times with disjoint hash, request and seq/step ranges, so
every tile is an independent copy of the same run. Timed per table:

    read     Parquet -> Arrow
    sql      DuckDB: load events, build every view (heavy ones materialized), read the report
    replay   the scalar replay and the per-episode comparison with the SQL rows
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lineage import views
from lineage.replay import compare, replay
from lineage.synth import D0_SYNTH, SynthConfig, synthesize

# requests per ~1M events and a stable arrival rate, measured with lineage.synth (seed 7)
RUNS = {
    "S2": dict(per_million=89_000, arrival_rate=0.7),
    "D0": dict(per_million=6_100, arrival_rate=0.7, **D0_SYNTH),
}


def build(org: str, events: int, cache: Path) -> Path:
    spec = dict(RUNS[org])
    per_million = spec.pop("per_million")
    requests = max(50, round(per_million * events / 1e6))
    path = cache / f"lineage_{org}_{requests}.parquet"
    if not path.exists():
        t0 = time.perf_counter()
        table = synthesize(SynthConfig(requests=requests, seed=7, **spec))  # type: ignore[arg-type]
        pq.write_table(table, path)
        print(f"# synthesized {org}: {requests:,} requests, {table.num_rows:,} events in "
              f"{time.perf_counter() - t0:.1f} s -> {path}", file=sys.stderr)
    return path


def _xor_hashes(col: pa.ChunkedArray, salt: int) -> pa.Array:
    arr = col.combine_chunks()
    mask = pc.equal(arr, pa.scalar(0, pa.uint64()))
    return pc.if_else(mask, arr, pc.bit_wise_xor(arr, pa.scalar(salt, pa.uint64())))


def _xor_lists(col: pa.ChunkedArray, salt: int) -> pa.Array:
    arr = col.combine_chunks()
    values = pc.bit_wise_xor(arr.values, pa.scalar(salt, pa.uint64()))
    return pa.ListArray.from_arrays(arr.offsets, values, mask=arr.is_null())


def _suffix(col: pa.ChunkedArray, k: int) -> pa.Array:
    arr = col.combine_chunks()
    tagged = pc.binary_join_element_wise(arr, pa.scalar(f"~{k}"), "")
    return pc.if_else(pc.equal(arr, ""), arr, tagged)


def tile_copy(table: pa.Table, k: int, steps: int | None = None) -> pa.Table:
    """Copy ``k`` of a run: seq and step shifted past copies 0..k-1, hashes XORed with a
    per-copy salt (0 stays 0), request ids suffixed, so copies share nothing."""
    n = table.num_rows
    if steps is None:
        steps = pc.max(table.column("step")).as_py() + 1
    salt = (k * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    t = table
    cols = {
        "seq": pc.add(t.column("seq"), k * n),
        "step": pc.add(t.column("step"), k * steps),
        "hash": _xor_hashes(t.column("hash"), salt),
        "chain": _xor_lists(t.column("chain"), salt),
        "recurrent_chain": _xor_lists(t.column("recurrent_chain"), salt),
        "request_id": _suffix(t.column("request_id"), k),
        "requester": _suffix(t.column("requester"), k),
    }
    for name, col in cols.items():
        t = t.set_column(t.column_names.index(name), t.schema.field(name), col)
    return t


def tile(table: pa.Table, copies: int) -> pa.Table:
    """``copies`` independent copies of a run, one after another."""
    steps = pc.max(table.column("step")).as_py() + 1
    return pa.concat_tables([tile_copy(table, k, steps) for k in range(copies)]).combine_chunks()


def measure(table: pa.Table, with_replay: bool, memory_limit: str) -> dict[str, object]:
    t0 = time.perf_counter()
    con = views.connect(table, materialize=True, memory_limit=memory_limit)
    rel = con.sql("SELECT * FROM episode_lineage")
    rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    summary = con.sql("SELECT episodes, classified_episodes, shallower_episodes, "
                      "shallower_with_other_request_loss FROM run_summary").fetchall()[0]
    con.sql("SELECT * FROM class_counts").fetchall()
    con.close()
    sql_s = time.perf_counter() - t0
    out: dict[str, object] = {
        "events": table.num_rows, "episodes": summary[0], "classified": summary[1],
        "attribution": f"{summary[3]}/{summary[2]}", "sql_s": round(sql_s, 2),
        "sql_events_per_s": round(table.num_rows / sql_s),
    }
    if with_replay:
        t1 = time.perf_counter()
        agreement = compare(rows, replay(table))
        out["replay_s"] = round(time.perf_counter() - t1, 2)
        out["agree"] = f"{agreement.agree}/{agreement.episodes}"
        out["details_agree"] = f"{agreement.details_agree}/{agreement.episodes}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--org", nargs="+", default=["S2", "D0"], choices=sorted(RUNS))
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--tile", type=int, default=10, help="copies for the large table (0: skip)")
    ap.add_argument("--cache", default="/tmp/hybridmem-bench")
    ap.add_argument("--no-replay-tiled", action="store_true",
                    help="skip the replay on the tiled table")
    ap.add_argument("--memory-limit", default="6GB", help="DuckDB memory limit (spills beyond)")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    for org in args.org:
        path = build(org, args.events, cache)
        t0 = time.perf_counter()
        table = pq.read_table(path)
        read_s = time.perf_counter() - t0
        r = {"org": org, "table": "1x", "load_avg": round(os.getloadavg()[0], 2),
             "read_s": round(read_s, 2), **measure(table, True, args.memory_limit)}
        print(json.dumps(r), flush=True)
        results.append(r)
        if args.tile > 1:
            big = tile(table, args.tile)
            r = {"org": org, "table": f"{args.tile}x", "load_avg": round(os.getloadavg()[0], 2),
                 **measure(big, not args.no_replay_tiled, args.memory_limit)}
            print(json.dumps(r), flush=True)
            results.append(r)
            del big
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

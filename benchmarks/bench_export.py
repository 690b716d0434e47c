"""Parquet export, ``verify`` and the Perfetto timeline of a binary trace: speed of the columnar
decoder against the row reader, and memory at two trace sizes, side by side in one run.

    PYTHONPATH=. python benchmarks/bench_export.py [--events 100000 1000000] [--work DIR]
        [--paths columnar row]

Each size: a synthetic trace (``tracer.synthetic``) is written once to ``--work``; then, for each
decoding path, a fresh child process runs the export (``tracer.export.write_parquet``) and then
``tracer.verify``, and reports CPU and wall seconds of each and its peak resident set
(``ru_maxrss``). ``columnar`` is the shipped path (``tracer.columnar``); ``row`` swaps in the
reference decoder (``tracer.export.row_batches`` for the export, ``TraceReader.events()`` for
verify). A second child per path writes the Perfetto timeline (``tracer.perfetto`` against
the ``Event``-at-a-time ``json.dumps`` exporter it replaced, ``tests/tracer/perfetto_reference``;
the two files must hold the same objects, the shipped one adding counters and flows). A
streaming export holds about one record batch (:data:`tracer.export.BATCH_ROWS` events) at
a time, so the peak stays flat as the trace grows. The last lines print the CPU ratios
columnar / row and the peak-RSS ratio between the sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _same_objects(shipped: Path, reference: Path) -> bool:
    """The shipped timeline holds the reference's objects, in order, besides its counters and
    loss-flow slices (the reference writes neither)."""
    a, b = (json.loads(p.read_text(encoding="utf-8")) for p in (shipped, reference))
    a["traceEvents"] = [e for e in a["traceEvents"] if e["ph"] not in ("C", "X")]
    for key in ("counters", "flows"):
        a["otherData"].pop(key, None)
    return bool(a == b)


def write_trace(path: Path, n: int) -> None:
    from tracer.synthetic import synthetic_events
    from tracer.writer import TraceWriter

    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    w = TraceWriter(tmp, meta={"organization": "S2", "source": "bench_export"})
    for e in synthetic_events(n):
        w.on_event(e)
    w.close()
    os.replace(tmp, path)


_PERFETTO = """
import json, resource, sys, time
t, c = time.perf_counter(), time.process_time()
if sys.argv[3] == "row":
    from tests.tracer.perfetto_reference import write_reference
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        write_reference(sys.argv[1], f)
else:
    from tracer.perfetto import write_perfetto
    write_perfetto(sys.argv[1], sys.argv[2])
t1, c1 = time.perf_counter(), time.process_time()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": t1 - t, "cpu_s": c1 - c, "peak_rss_kib": u.ru_maxrss}))
"""

_CHILD = """
import json, resource, sys, time
import tracer.export as ex
import tracer.verdict as vd
from tracer.reader import TraceReader
if sys.argv[3] == "row":
    ex._batches = ex.row_batches
    def _tally(reader):
        for _ in reader.events():
            pass
    import tracer.columnar as col
    col.tally = _tally
t, c = time.perf_counter(), time.process_time()
v = ex.write_parquet(sys.argv[1], sys.argv[2])
t1, c1 = time.perf_counter(), time.process_time()
v2 = vd.verify(sys.argv[1])
t2, c2 = time.perf_counter(), time.process_time()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": t1 - t, "cpu_s": c1 - c, "verify_wall_s": t2 - t1,
                  "verify_cpu_s": c2 - c1, "peak_rss_kib": u.ru_maxrss,
                  "accepted": v.accepted and v2 == v}))
"""


def export(trace: Path, out: Path, path: str = "columnar", child: str = _CHILD
           ) -> dict[str, float]:
    out.unlink(missing_ok=True)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root,
                                                                     os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-c", child, str(trace), str(out), path], env=env,
                         check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, nargs=2, default=[100_000, 1_000_000],
                    metavar=("SMALL", "LARGE"))
    ap.add_argument("--work", type=Path, default=None, help="where traces are kept (default: a "
                    "temporary directory)")
    ap.add_argument("--paths", nargs="+", choices=("columnar", "row"),
                    default=["columnar", "row"], help="decoding paths to run (default: both)")
    a = ap.parse_args(argv)
    small, large = a.events
    if not 1_000 <= small < large <= 50_000_000:
        ap.error(f"--events must satisfy 1000 <= SMALL < LARGE <= 50000000, got {small} {large}")
    with tempfile.TemporaryDirectory() as scratch:
        work = a.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        rows: dict[tuple[int, str], dict[str, float]] = {}
        for n in (small, large):
            trace = work / f"synthetic_{n}.bin"
            print(f"# writing {n:,} events ...", file=sys.stderr, flush=True)
            write_trace(trace, n)
            for path in a.paths:
                print(f"# {path}: export + verify of {n:,} events ...", file=sys.stderr,
                      flush=True)
                rows[n, path] = r = export(trace, work / f"synthetic_{n}_{path}.parquet", path)
                print(f"{n:>12,} events  {path:<8}  export CPU {r['cpu_s']:7.2f} s "
                      f"(wall {r['wall_s']:6.2f})  verify CPU {r['verify_cpu_s']:6.2f} s "
                      f"(wall {r['verify_wall_s']:6.2f})  peak RSS "
                      f"{r['peak_rss_kib'] / 1024:7.1f} MiB  accepted {r['accepted']}")
                print(f"# {path}: Perfetto timeline of {n:,} events ...", file=sys.stderr,
                      flush=True)
                timeline = work / f"synthetic_{n}_{path}.json"
                rows[n, path + "/perfetto"] = p = export(trace, timeline, path, _PERFETTO)
                print(f"{n:>12,} events  {path:<8}  perfetto CPU {p['cpu_s']:7.2f} s "
                      f"(wall {p['wall_s']:6.2f})  peak RSS {p['peak_rss_kib'] / 1024:7.1f} MiB")
        if "columnar" in a.paths and "row" in a.paths:
            for n in (small, large):
                same = _same_objects(work / f"synthetic_{n}_columnar.json",
                                     work / f"synthetic_{n}_row.json")
                print(f"perfetto files at {n:,} events: "
                      f"{'same objects' if same else 'DIFFER'}")
                if not same:
                    return 1
    if "columnar" in a.paths and "row" in a.paths:
        for n in (small, large):
            c, r = rows[n, "columnar"], rows[n, "row"]
            cp, rp = rows[n, "columnar/perfetto"], rows[n, "row/perfetto"]
            print(f"columnar / row at {n:,} events: export CPU {c['cpu_s'] / r['cpu_s']:.3f}, "
                  f"verify CPU {c['verify_cpu_s'] / r['verify_cpu_s']:.3f}, "
                  f"perfetto CPU {cp['cpu_s'] / rp['cpu_s']:.3f}")
    for path in a.paths:
        a_kib, b_kib = rows[small, path]["peak_rss_kib"], rows[large, path]["peak_rss_kib"]
        per_event = (b_kib - a_kib) * 1024 / (large - small)
        print(f"{path}: peak RSS ratio {b_kib / a_kib:.3f} for {large / small:.0f}x the events "
              f"({per_event:.1f} B per extra event)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

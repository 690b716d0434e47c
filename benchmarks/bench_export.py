"""Parquet export in bounded memory: peak resident set of ``hybridmem trace export --parquet``
at two trace sizes, side by side in one run.

    PYTHONPATH=. python benchmarks/bench_export.py [--events 100000 1000000] [--work DIR]

Each size: a synthetic trace (``tracer.synthetic``) is written once to ``--work``, then a fresh
child process runs the export (``tracer.export.write_parquet``) and reports its wall and CPU
seconds and its peak resident set (``ru_maxrss``). A streaming export holds one record batch
(:data:`tracer.export.BATCH_ROWS` events) at a time, so the peak stays flat as the trace grows;
an export that built the whole table would grow by hundreds of bytes per event. The last line
prints the ratio of the peaks and the bytes per extra event.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


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


_CHILD = """
import json, resource, sys, time
from tracer.export import write_parquet
t, c = time.perf_counter(), time.process_time()
v = write_parquet(sys.argv[1], sys.argv[2])
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c,
                  "peak_rss_kib": u.ru_maxrss, "accepted": v.accepted}))
"""


def export(trace: Path, out: Path) -> dict[str, float]:
    out.unlink(missing_ok=True)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root,
                                                                     os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-c", _CHILD, str(trace), str(out)], env=env,
                         check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, nargs=2, default=[100_000, 1_000_000],
                    metavar=("SMALL", "LARGE"))
    ap.add_argument("--work", type=Path, default=None, help="where traces are kept (default: a "
                    "temporary directory)")
    a = ap.parse_args(argv)
    small, large = a.events
    if not 1_000 <= small < large <= 50_000_000:
        ap.error(f"--events must satisfy 1000 <= SMALL < LARGE <= 50000000, got {small} {large}")
    with tempfile.TemporaryDirectory() as scratch:
        work = a.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        rows = {}
        for n in (small, large):
            trace = work / f"synthetic_{n}.bin"
            print(f"# writing {n:,} events ...", file=sys.stderr, flush=True)
            write_trace(trace, n)
            rows[n] = r = export(trace, work / f"synthetic_{n}.parquet")
            print(f"{n:>12,} events  wall {r['wall_s']:7.2f} s  CPU {r['cpu_s']:7.2f} s  "
                  f"peak RSS {r['peak_rss_kib'] / 1024:7.1f} MiB  accepted {r['accepted']}")
    a_kib, b_kib = rows[small]["peak_rss_kib"], rows[large]["peak_rss_kib"]
    per_event = (b_kib - a_kib) * 1024 / (large - small)
    print(f"peak RSS ratio {b_kib / a_kib:.3f} for {large / small:.0f}x the events "
          f"({per_event:.1f} B per extra event)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

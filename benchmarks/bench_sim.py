"""Time simulated runs in one process: imports once, then each cell's run (wall and CPU).

    PYTHONPATH=. python benchmarks/bench_sim.py --org S2 --budget b63 --seed 42000 --runs 2
    PYTHONPATH=. python benchmarks/bench_sim.py --org vllm,S0,S1,S2,D0 --seed 42000,42002 --trace
    PYTHONPATH=. python benchmarks/bench_sim.py --org S2 --profile 30     # cProfile, top 30

``--org``, ``--budget`` and ``--seed`` take comma lists: every combination runs ``--runs`` times
in this one process. Prints one line for the imports, one per run (``wall_s``, ``cpu_s`` =
this process's user + system seconds, steps, a digest of every request's first-token/finish
times, token counts and the run's preemptions), and with ``--trace`` a digest of the traced
event stream (every event in order without its wall-clock stamp) and the event count. The
digests are how an A/B shows a change kept behaviour: the same cell must print the same digests
on both sides.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _digest(result_dir: Path, steps: int, preemptions: int) -> str:
    import pyarrow.parquet as pq

    table = pq.read_table(result_dir / "results.parquet")
    cols = [c for c in ("request_id", "first_token", "finished", "output_tokens",
                        "cached_tokens", "finish_reason") if c in table.column_names]
    h = hashlib.sha256(f"{steps}/{preemptions}".encode())
    for row in table.select(cols).to_pylist():
        h.update(repr(sorted(row.items())).encode())
    return h.hexdigest()[:16]


def _event_digest(path: Path) -> str:
    """SHA-256 over every traced event in order, wall-clock stamps left out (``seq`` and the
    event's fields, which carry virtual time only), and the event count."""
    from tracer.reader import read_events

    h, n = hashlib.sha256(), 0
    for seq, _ts_ns, event in read_events(path):
        h.update(f"{seq} {event!r}\n".encode())
        n += 1
    return f"{h.hexdigest()[:16]}/{n}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--org", default="S2", help="comma list (default S2)")
    p.add_argument("--budget", default="b63", help="comma list (default b63)")
    p.add_argument("--seed", default="42000", help="comma list (default 42000)")
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--share", type=float, default=0.5)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--trace", action="store_true",
                   help="trace every run; print a digest of its events")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile the last run, print the top N by cumulative and own time")
    a = p.parse_args(argv)
    if not 1 <= a.runs <= 50:
        print(f"runs must be in [1, 50], got {a.runs}", file=sys.stderr)
        return 2
    try:
        seeds = [int(x) for x in a.seed.split(",")]
    except ValueError:
        print(f"seed must be a comma list of integers, got {a.seed!r}", file=sys.stderr)
        return 2
    cells = [(org, budget, seed) for org in a.org.split(",") for budget in a.budget.split(",")
             for seed in seeds]
    w0, c0 = time.perf_counter(), time.process_time()
    import vllm.v1.core.sched.scheduler  # noqa: F401  (the imports a run pays once)

    from hybridmem.sim.run import SimConfig, run_sim

    print(f"imports wall_s {time.perf_counter() - w0:.2f} cpu_s {time.process_time() - c0:.2f}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (org, budget, seed) in enumerate(c for c in cells for _ in range(a.runs)):
            out = Path(tmp) / f"run{i}"
            tdir = Path(tmp) / f"trace{i}" if a.trace else None
            cfg = SimConfig(org=org, budget=budget, seed=seed, rate=a.rate, share=a.share,
                            requests=a.requests, out=out, trace_dir=tdir)
            prof = None
            if a.profile and i == len(cells) * a.runs - 1:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            w0, c0 = time.perf_counter(), time.process_time()
            run_sim(cfg)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            if prof is not None:
                prof.disable()
            s = json.loads((out / "summary.json").read_text())
            line = (f"run {i} {org} {budget} seed {seed} wall_s {wall:.2f} cpu_s {cpu:.2f} "
                    f"loop_wall_s {s['wall_s']:.2f} steps {s['steps']} "
                    f"throughput {s['throughput_tok_s']:.3f} "
                    f"digest {_digest(out, s['steps'], s['preemptions'])}")
            if tdir is not None:
                line += f" events {_event_digest(tdir / 'trace.hmt')}"
            print(line + (" (profiled)" if prof is not None else ""), flush=True)
            shutil.rmtree(out)
            if tdir is not None:
                shutil.rmtree(tdir)
            if prof is not None:
                import pstats

                st = pstats.Stats(prof)
                st.sort_stats("cumulative").print_stats(a.profile)
                st.sort_stats("tottime").print_stats(a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())

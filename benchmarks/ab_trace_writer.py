"""A/B of the trace writer against an older revision, side by side in one process.

Loads ``tracer/writer.py`` as it was at ``--rev`` (``git show``) next to the working tree's, then
times, interleaved round by round over the same prebuilt synthetic events: the floor (one
``EVENT_NO_CHAIN.pack_into`` per event into a preallocated buffer, as ``trace bench`` does), the
old writer's ``on_event`` and the new one's. Prints best-of and median per-round ratios::

    PYTHONPATH=. python benchmarks/ab_trace_writer.py --rev HEAD~1 --events 100000 --rounds 7
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from tracer import writer as new_writer
from tracer.bench import floor_loop
from tracer.synthetic import synthetic_events
from tracer.verdict import verify


def _load_old(rev: str) -> Any:
    src = subprocess.run(["git", "show", f"{rev}:tracer/writer.py"], check=True,
                         capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="ab-writer-"), "old_writer.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("old_writer", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="HEAD~1")
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    if a.events < 1 or a.rounds < 1:
        print("--events and --rounds must be >= 1", file=sys.stderr)
        return 2
    old = _load_old(a.rev)
    events = list(synthetic_events(a.events))
    tmp = tempfile.mkdtemp(prefix="ab-writer-")
    clk = time.perf_counter_ns

    def floor() -> int:
        return floor_loop(events)[0]

    def writer(mod: Any, name: str) -> int:
        path = os.path.join(tmp, name)
        w = mod.TraceWriter(path, {}, handle_signals=False)
        on = w.on_event
        t0 = clk()
        for e in events:
            on(e)
        t = clk() - t0
        w.close()
        assert verify(path).accepted, f"{name}: trace not accepted"
        return t

    rows: dict[str, list[int]] = {"floor": [], "old": [], "new": []}
    for r in range(a.rounds):
        rows["floor"].append(floor())
        rows["old"].append(writer(old, "old.hmtrace"))
        rows["new"].append(writer(new_writer, "new.hmtrace"))
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1] / a.events:.0f}" for k, v in
                                              rows.items()) + " ns/event", file=sys.stderr)
    n = a.events
    best = {k: min(v) / n for k, v in rows.items()}
    for k in ("floor", "old", "new"):
        print(f"{k:5s} best {best[k]:7.1f} ns/event")
    for k in ("old", "new"):
        med = statistics.median(x / f for x, f in zip(rows[k], rows["floor"], strict=True))
        print(f"{k} / floor: best {best[k] / best['floor']:.2f}x, median of rounds {med:.2f}x")
    med = statistics.median(x / o for x, o in zip(rows["new"], rows["old"], strict=True))
    print(f"new / old: best {best['new'] / best['old']:.2f}x, median of rounds {med:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

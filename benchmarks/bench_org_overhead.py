"""Cost of the organization-backed path: ``--org S2`` against ``--org vllm`` on the same workload.

    PYTHONPATH=. python benchmarks/bench_org_overhead.py [--reps 4] [--requests 24]
        [--budget b96] [--share 0.8] [--seed 5] [--cap 8] [--org S2] [--write-through]
        [--json OUT.json]

Each repetition runs the same whole serving run (``hybridmem.engines.vllm_run.run_serving``,
traced, every request submitted at t = 0, greedy) once per arm, in ABBA order (the organization
first in odd repetitions) so that drift in the machine's load cancels. Engine start is excluded
(``engine_init_s`` is reported apart); the timed quantity is the ledger interval (first
submission to engine shut down, trace flushed) and the process CPU seconds over it. Per pair::

    ratio = organization seconds / vllm seconds        (1.10 = 10% slower)

then the geometric mean of the ratios (wall and CPU).

Same work. The ratio is the path's own cost only when both arms compute the same tokens. With
``--share 0`` no request shares a prefix, so neither arm has a prefix hit and the model work is
equal by construction: that is the figure for the cost goal. With sharing (``--share 0.8``)
the arms reuse differently -- the organization caches a checkpoint every grid (64 tokens for
the tiny model) within its budget, vLLM's align mode every 256-token block in its whole pool --
so the ratio also carries the difference in prefix-hit tokens, printed per run (``prefix
hits``) and flagged when the arms differ.

``--write-through`` adds a third arm: the organization with ``HYBRIDMEM_ORG_RESIDENT=0``
(every row read from its pages and written back every step, the path before residency), so
the residency's own effect is measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

WT = "-wt"  # suffix of the write-through arm


def one_run(arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from hybridmem.engines.vllm_run import RunConfig, run_serving

    org: dict[str, Any] = {}
    os.environ["HYBRIDMEM_ORG_RESIDENT"] = "0" if arm.endswith(WT) else "1"
    name = arm.removesuffix(WT)
    if name != "vllm":
        org = {"org": name, "budget": args.budget}
        if name == "D0":
            org["attention_fraction"] = 0.5
    cfg = RunConfig(model=args.model, requests=args.requests, rate=1e6, share=args.share,
                    seed=args.seed, cap=args.cap, out=out, trace_dir=out / "trace", **org)
    s = run_serving(cfg, progress=False).summary
    if s["completed"] != args.requests or not (s["trace_verdict"] or {}).get("accepted"):
        raise SystemExit(f"{arm}: {s['completed']}/{args.requests} completed, trace "
                         f"{(s['trace_verdict'] or {}).get('reason')}")
    ledger = s["output_tokens"] / s["throughput_ledger_tok_s"]
    return {"arm": arm, "wall_s": ledger, "cpu_s": s["cpu_s"], "init_s": s["engine_init_s"],
            "preemptions": s["preemptions"], "prefix_hit_tokens": s["prefix_hit_tokens"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--budget", default="b96")
    p.add_argument("--org", default="S2", choices=("S0", "S1", "S2", "D0"))
    p.add_argument("--share", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--cap", type=int, default=8)
    p.add_argument("--model", default="tiny")
    p.add_argument("--write-through", action="store_true",
                   help="also run the organization with HYBRIDMEM_ORG_RESIDENT=0")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not 1 <= args.reps <= 50 or not 1 <= args.requests <= 10_000:
        print(f"--reps must be 1..50 and --requests 1..10000, got {args.reps}, "
              f"{args.requests}", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    rows: list[dict[str, Any]] = []
    arms = [args.org, "vllm"] + ([args.org + WT] if args.write_through else [])
    with tempfile.TemporaryDirectory(prefix="bench-org-") as tmp:
        for rep in range(args.reps):
            order = arms if rep % 2 == 0 else arms[::-1]
            pair = {}
            for arm in order:
                pair[arm] = one_run(arm, args, Path(tmp) / f"{rep}-{arm}")
                r = pair[arm]
                print(f"rep {rep} {arm:>5}: wall {r['wall_s']:7.2f} s  cpu {r['cpu_s']:7.2f} s  "
                      f"init {r['init_s']:5.1f} s  preemptions {r['preemptions']:3d}  "
                      f"prefix hits {r['prefix_hit_tokens']}", file=sys.stderr, flush=True)
            row = {"rep": rep, **{arm: pair[arm] for arm in arms}}
            for arm in arms[::2]:  # the organization (and its write-through arm) over vllm
                row[f"{arm}_wall_ratio"] = pair[arm]["wall_s"] / pair["vllm"]["wall_s"]
                row[f"{arm}_cpu_ratio"] = pair[arm]["cpu_s"] / pair["vllm"]["cpu_s"]
            rows.append(row)
    gm: dict[str, float] = {}
    for arm in arms[::2]:
        print(f"{'rep':>3}  {arm + ' wall':>10}  {'vllm wall':>9}  {'ratio':>6}  "
              f"{'cpu ratio':>9}")
        for r in rows:
            print(f"{r['rep']:>3}  {r[arm]['wall_s']:10.2f}  {r['vllm']['wall_s']:9.2f}  "
                  f"{r[f'{arm}_wall_ratio']:6.3f}  {r[f'{arm}_cpu_ratio']:9.3f}")
        for kind in ("wall", "cpu"):
            gm[f"{arm}_{kind}"] = math.exp(sum(math.log(r[f"{arm}_{kind}_ratio"])
                                               for r in rows) / len(rows))
        print(f"geometric mean ratio {arm}/vllm: wall {gm[arm + '_wall']:.3f}, cpu "
              f"{gm[arm + '_cpu']:.3f} ({args.reps} interleaved runs, {args.requests} "
              f"requests, budget {args.budget}, share {args.share})")
    hits = {arm: rows[0][arm]["prefix_hit_tokens"] for arm in arms}
    if len(set(hits.values())) > 1:
        print(f"note: prefix-hit tokens differ between arms {hits}: the ratio includes the "
              "organizations' different reuse, not only the path's cost (--share 0 for equal "
              "work)")
    gm_wall, gm_cpu = gm[args.org + "_wall"], gm[args.org + "_cpu"]
    if args.json is not None:
        tmp_json = args.json.with_suffix(".json.tmp")
        tmp_json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                        "pairs": rows, "wall_ratio_gmean": gm_wall,
                                        "cpu_ratio_gmean": gm_cpu, "gmeans": gm,
                                        "prefix_hit_tokens": hits}, indent=2))
        tmp_json.rename(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

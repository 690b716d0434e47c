"""``hybridmem continuation``: does a retained checkpoint give the tokens recomputation gives?"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from hybridmem.cli import engine_log, models
from hybridmem.cli.common import attention_fraction
from hybridmem.errors import HybridMemError

HELP = ("continuation checks (App. D.5): retained-checkpoint continuation vs recomputation, "
        "split prefill, repeats and batch variance on vLLM; verdict per case with evidence")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("continuation", help=HELP, description=HELP)
    p.add_argument("--model", default="tiny", metavar="M",
                   help="'tiny' (the embedded model, built if missing) or a model directory")
    p.add_argument("--org", default=models.DEFAULT_ORG, metavar="X",
                   help="S0, S1, S2, D0 (the organization serves inside vLLM's scheduler, built as "
                   "`hybridmem run --org X` builds it; default %(default)s, as `run` and `sim`) "
                   "or vllm (vLLM's own manager)")
    p.add_argument("--dtype", default="float32", metavar="DTYPE",
                   help="model and recurrent-state dtype: float32 (default) or bfloat16")
    p.add_argument("--cases", type=int, default=64, metavar="N", help="cases (default 64)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="case and engine seed")
    p.add_argument("--cases-file", type=Path, default=None, metavar="FILE",
                   help="JSON lines {prompt, boundary, max_tokens} instead of seeded cases")
    p.add_argument("--edges", action="store_true",
                   help="seeded cases at exact block boundaries instead of random lengths: "
                   "boundary at L - 1, prompt a multiple of the block, prompt ending mid-block")
    p.add_argument("--max-tokens", type=int, default=16, metavar="T",
                   help="greedy tokens per seeded case (default 16)")
    p.add_argument("--fault", default=None, metavar="NAME",
                   help="fault control: corrupt-checkpoint (every other case's retained "
                   "checkpoint overwritten in place through the storage); with --org vllm also "
                   "fresh-slot (every other consumer reads a slot holding another case's "
                   "state) and boundary-shift (its adopted state is the one a block earlier); "
                   "with an organization its own stale-checkpoint, swap-members, "
                   "skip-invalidate")
    p.add_argument("--budget", default=None, metavar="B",
                   help="organization mode: per-layer budget as in `hybridmem run` (label bN, "
                   "bytes or a size; default b1536: no reclaim during a check of the tiny model)")
    p.add_argument("--attention-fraction", type=attention_fraction(), default=None, metavar="F",
                   help="D0's attention share in (0, 1) (models without a preset)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    p.add_argument("--json", action="store_true", help="print report.json to stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    engine_log.add_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    models.served(args.model, "hybridmem continuation")
    from continuation_checks.check import CheckConfig, run_check

    if args.attention_fraction is not None and not math.isfinite(args.attention_fraction):
        raise HybridMemError(f"--attention-fraction must be finite, got {args.attention_fraction}")
    cfg = CheckConfig(out=args.out, model=args.model, org=args.org, dtype=args.dtype,
                      cases=args.cases, seed=args.seed, fault=args.fault,
                      cases_file=args.cases_file, max_tokens=args.max_tokens,
                      progress=not args.quiet, budget=args.budget,
                      attention_fraction=args.attention_fraction, edges=args.edges)
    cfg.check()
    # vLLM's own handlers would log to stdout: its records go to OUT/engine.log instead, so
    # stdout carries only this command's output (--json stays parseable)
    log = engine_log.route_engine_logs(args.out, args.engine_log_level)
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise HybridMemError(f"{exc.name} is not installed; install hybridmem[vllm]") from None
    report = run_check(cfg)
    if args.json:
        print(json.dumps(report))
    else:
        s = report["summary"]
        print(f"{args.org} {args.dtype} fault={args.fault}: "
              + ", ".join(f"{k} {v}" for k, v in s.items() if v))
        for line in report["explanation"]["supported"]:
            print(f"  supported: {line}")
        for line in report["explanation"]["ruled_out"]:
            print(f"  ruled out: {line}")
        if report.get("stopped"):
            print(f"  wrote {args.out}/report.json (no case classified)")
        else:
            print(f"  wrote {args.out}/report.json, cases.parquet, continuation.png")
        if log is not None:
            print(f"  vLLM's log: {log}")
    return int(report["exit_code"])

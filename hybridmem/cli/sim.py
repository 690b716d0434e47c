"""``hybridmem sim``: a serving run on vLLM's real scheduler with a GPU cost model, no GPU.

    hybridmem sim --out DIR [--org vllm|S0|S1|S2|D0] [--budget b63 | --total SIZE]
                  [--device a100-40gb] [--model falcon-h1-7b] [run options as in ``hybridmem run``]
    hybridmem sim calibrate TIMING.csv|.parquet [--model M] [--device D] [--org O] [--json]
                  [--out FIT.json]

Writes results.parquet, summary.json, workload.json (and trace/trace.hmt unless --no-trace)
like ``hybridmem run``; every time in them is simulated GPU time (hybridmem/sim/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from hybridmem.cli import models
from hybridmem.cli.common import TOTAL_HELP, attention_fraction, path_arg, total_label
from hybridmem.errors import HybridMemError

HELP = ("simulate a serving run: vLLM's real scheduler, the organizations, a GPU cost model "
        "(a100-40gb, h100-80gb, h200) and virtual time; 'sim calibrate' fits the cost model")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hybridmem.geometry import SHIPPED
    from hybridmem.sim.devices import DEVICES

    p = sub.add_parser("sim", help=HELP, description=HELP + ".\n\n" + __doc__.split("\n\n")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("form", nargs="*", metavar="calibrate TIMING",
                   help="'calibrate TIMING': fit the cost constants to measured step times")
    p.add_argument("--model", default=None, metavar="M",
                   help=f"preset ({', '.join(SHIPPED)}), a config.json or a model directory "
                   "(default falcon-h1-7b; with --replay the recorded model's geometry)")
    p.add_argument("--device", default="a100-40gb", choices=sorted(DEVICES),
                   help="GPU preset of the cost model (default a100-40gb, the paper's)")
    p.add_argument("--org", default=models.DEFAULT_ORG, action=_OrgGiven, metavar="ORG",
                   help=f"memory organization: {', '.join(models.ORG_CHOICES)} ('vllm': "
                   f"vLLM's own KV-cache manager; default {models.DEFAULT_ORG}, as `run` and "
                   "`continuation`); with --replay also a comma list or 'all' (default all)")
    b = p.add_mutually_exclusive_group()
    b.add_argument("--budget", default=None, metavar="B",
                   help="per-layer budget: label bN, bytes, or a size like 96MiB (default b63, "
                   "the paper's main point)")
    b.add_argument("--total", default=None, metavar="SIZE",
                   help=TOTAL_HELP + " (--org vllm: its blocks per layer likewise)")
    p.add_argument("--requests", type=int, default=300, metavar="N", help="requests (300)")
    p.add_argument("--rate", type=float, default=3.0, metavar="R",
                   help="Poisson arrival rate, requests/s (default 3)")
    p.add_argument("--share", type=float, default=0.5, metavar="Q",
                   help="shared-prefix fraction q in [0, 1] (default 0.5)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="workload seed (default 0)")
    p.add_argument("--cap", type=int, default=None, metavar="C",
                   help="running-sequence cap, vLLM max_num_seqs (default 63, the paper's)")
    p.add_argument("--headroom", type=float, default=0.0, metavar="F",
                   help="admission headroom fraction f in [0, 1) (organizations only)")
    p.add_argument("--pin-k", type=int, default=None, choices=(1, 2, 3),
                   help="preemption-time pinning threshold K (organizations only; off by default)")
    p.add_argument("--retention", action="store_true",
                   help="producer-side retention (S2+Retention)")
    p.add_argument("--grid", type=int, default=None, metavar="TOKENS",
                   help="organizations: attention block in tokens, a multiple of 16 (default: "
                   "each organization's own, S0-S2 512 = their checkpoint grid, D0 16 with its "
                   "model's checkpoint interval)")
    p.add_argument("--attention-fraction", type=attention_fraction(), default=None, metavar="FRAC",
                   help="D0's attention share of the budget (default: the model preset's)")
    p.add_argument("--chunking", default=None, choices=models.CHUNKING_CHOICES,
                   help=f"how prefill chunks are cut (default {models.DEFAULT_CHUNKING}: vLLM's "
                   "block-aligned split at each organization's checkpoint interval; block: at "
                   "its scheduler block; grid512: at 512 tokens for every arm; budget: no "
                   "alignment, organizations only; hybridmem/sim/README.md)")
    p.add_argument("--admit-first-chunk", action="store_true",
                   help="admit a request when its first prefill chunk fits, not its whole "
                   "prompt (vLLM's --no-scheduler-reserve-full-isl)")
    p.add_argument("--check-invariants", action="store_true",
                   help="organizations: run the App. D.2 checkers after every step (slow)")
    p.add_argument("--isolate", action="store_true",
                   help="per-request cache_salt: no cross-request prefix reuse")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--trace", type=path_arg(), default=None, metavar="DIR",
                   help="write the event trace into DIR (default: OUT/trace)")
    g.add_argument("--no-trace", action="store_true", help="run without tracing hooks")
    p.add_argument("--max-model-len", type=int, default=8192, metavar="T",
                   help="model limit the workload is scaled to (default 8192, the paper's)")
    p.add_argument("--cost", action="append", default=[], metavar="NAME=VALUE",
                   help="override one cost constant (repeatable), e.g. --cost mfu=0.5")
    p.add_argument("--step-log", action="store_true",
                   help="also write OUT/steps.parquet (per-step features and durations)")
    p.add_argument("--replay", type=path_arg(), default=None, metavar="RUN",
                   help="re-run a recorded run's workload (RUN: a run directory with "
                   "workload.json, or its trace) under each --org at the same bytes; writes "
                   "OUT/<org>/ and OUT/comparison.md (hybridmem/sim/README.md, 'Replay')")
    p.add_argument("--replay-arrivals", default="planned", choices=("planned", "steps"),
                   help="with --replay: requests enter at their planned arrival on virtual "
                   "time (default), or at the scheduler step they entered the recorded run "
                   "(its trace)")
    p.add_argument("--out", type=path_arg(), default=None, metavar="DIR",
                   help="output directory (a run); for calibrate: the fit as JSON")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout and nothing else there (a run: its "
                   "summary; calibrate: the fit)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


class _OrgGiven(argparse.Action):
    """``--org``, remembering that it was given (a replay runs every organization unless
    told otherwise; a plain run defaults to one)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        namespace.org = values
        namespace.org_given = True


def parse_costs(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not sep or not name or not math.isfinite(v):
            raise HybridMemError(f"--cost {item!r}: expected NAME=VALUE with a finite number")
        out[name.strip()] = v
    from hybridmem.sim.cost import CostConstants

    CostConstants().with_values(**out)
    return out


def _config(args: argparse.Namespace) -> object:
    from hybridmem.sim.run import SimConfig, check_budget

    models.simulated(args.model)
    if args.budget is None:
        args.budget = models.default_budget(args.model)
    if args.cap is None:
        args.cap = models.default_cap(args.model)
    if args.out is None:
        raise HybridMemError("--out DIR is required")
    if args.out.exists() and not args.out.is_dir():
        raise HybridMemError(f"--out {str(args.out)!r} exists and is not a directory")
    trace = None if args.no_trace else (args.trace or args.out / "trace")
    cfg = SimConfig(model=args.model, device=args.device, org=args.org, budget=args.budget,
                    requests=args.requests, rate=args.rate, share=args.share, seed=args.seed,
                    cap=args.cap, headroom=args.headroom, pin_k=args.pin_k,
                    retention=args.retention, isolate=args.isolate, trace_dir=trace,
                    grid=args.grid, attention_fraction=args.attention_fraction,
                    check_invariants=args.check_invariants, chunking=args.chunking,
                    admit_first_chunk=args.admit_first_chunk,
                    out=args.out, max_model_len=args.max_model_len,
                    constants=parse_costs(args.cost), step_log=args.step_log).check()
    check_budget(cfg)
    return cfg


def _calibrate(args: argparse.Namespace) -> int:
    from hybridmem.sim.calibrate import fit, load_timing
    from hybridmem.sim.cost import CostConstants, CostModel
    from hybridmem.sim.devices import get_device
    from hybridmem.sim.model_shape import load_shape
    from hybridmem.sim.schedulers import default_grid

    if len(args.form) != 2:
        raise HybridMemError(f"'calibrate' takes exactly one TIMING file, got {args.form[1:]}")
    shape = load_shape(args.model)
    device = get_device(args.device)
    grid = default_grid(args.org, shape.geometry)
    model = CostModel(shape, device, args.org, grid,
                      CostConstants().with_values(**parse_costs(args.cost)))
    cols = load_timing(args.form[1])
    result = fit(model, cols).as_dict()
    result.update({"model": shape.name, "device": device.name, "org": args.org,
                   "timing": args.form[1]})
    text = json.dumps(result, indent=2)
    if args.out is not None:
        from hybridmem.outputs import write_text_atomic

        write_text_atomic(args.out, text + "\n", [args.form[1]], "--out")
    if args.json:
        print(text)
    else:
        k = result["constants"]
        print(f"fit over {result['rows']} steps ({result['rounds']} rounds): "
              f"rmse {result['rmse_before_s'] * 1e3:.3f} -> {result['rmse_s'] * 1e3:.3f} ms, "
              f"R^2 {result['r2']:.4f}")
        for name, value in k.items():
            print(f"  {name:<20} {value:.6g}")
        print("use them with: " + " ".join(f"--cost {n}={v:.6g}" for n, v in k.items()))
    return 0


def run(args: argparse.Namespace) -> int:
    named_model = args.model
    if args.model is None:
        args.model = "falcon-h1-7b"
    if args.form:
        if args.form[0] != "calibrate":
            raise HybridMemError(f"unknown form {args.form[0]!r}; the only form is "
                                 "'calibrate TIMING' (a run takes options only)")
        return _calibrate(args)
    total_label(args)
    if args.replay is not None:
        return _replay(args, named_model)
    if args.org not in models.ORG_CHOICES:
        raise HybridMemError(f"--org {args.org!r}: expected one of "
                             f"{', '.join(models.ORG_CHOICES)} (a list or 'all' only with "
                             "--replay)")
    cfg = _config(args)
    from hybridmem.sim.run import run_sim

    try:
        result = run_sim(cfg, progress=not args.quiet)  # type: ignore[arg-type]
    except RuntimeError as exc:
        if type(exc).__name__ != "InvariantStop":
            raise
        print(f"hybridmem sim: invariant violation: {exc}", file=sys.stderr)
        return 1
    s = result.summary
    keys = ("org", "budget", "device", "seed", "chunking", "chunk_align_tokens", "requests",
            "completed", "throughput_tok_s",
            "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "preemptions", "prefix_hit_tokens",
            "num_blocks", "block_tokens", "steps", "wall_s", "trace_path", "trace_verdict")
    if args.json:
        print(json.dumps({k: s[k] for k in keys}, indent=2))
    else:
        from hybridmem.cli.summary_text import format_summary

        print(format_summary(s, simulated=True))
    print(f"wrote {result.results_path}, {result.summary_path}, {result.manifest_path}",
          file=sys.stderr)
    verdict = s.get("trace_verdict")
    return 1 if isinstance(verdict, dict) and not verdict.get("accepted") else 0


REPLAY_OPTIONS = ("requests", "rate", "share", "seed", "cap", "isolate", "max_model_len")


def _replay(args: argparse.Namespace, model: str | None) -> int:
    """``--replay RUN``: the recorded workload under each organization, and the comparison."""
    from hybridmem.sim.replay import load_recorded, plan_replay, replay
    from hybridmem.sim.run import SimConfig

    defaults = {"requests": 300, "rate": 3.0, "share": 0.5, "seed": 0, "cap": None,
                "isolate": False, "max_model_len": 8192}
    given = [k for k in REPLAY_OPTIONS if getattr(args, k) != defaults[k]]
    if given:
        raise HybridMemError(f"--{given[0].replace('_', '-')} does not apply to --replay: the "
                             "recorded run fixes the workload, cap and model limit")
    text = args.org if getattr(args, "org_given", False) else "all"
    arms = list(models.ORG_CHOICES) if text == "all" else [o.strip() for o in text.split(",")]
    bad = [o for o in arms if o not in models.ORG_CHOICES]
    if bad or not arms or len(set(arms)) != len(arms):
        raise HybridMemError(f"--org {text!r}: expected 'all' or a comma list of distinct "
                             f"{', '.join(models.ORG_CHOICES)}")
    if args.out is None:
        raise HybridMemError("--out DIR is required")
    if args.out.exists() and not args.out.is_dir():
        raise HybridMemError(f"--out {str(args.out)!r} exists and is not a directory")
    if args.trace is not None:
        raise HybridMemError("--trace does not apply to --replay: each arm traces into "
                             "OUT/<org>/trace (or --no-trace)")
    if model is not None:
        models.simulated(model)
    rec = load_recorded(args.replay)
    base = SimConfig(headroom=args.headroom, pin_k=args.pin_k, retention=args.retention,
                     check_invariants=args.check_invariants, chunking=args.chunking,
                     constants=parse_costs(args.cost), step_log=args.step_log)
    planned, conditions = plan_replay(rec, arms, args.out, model=model, budget=args.budget,
                                      device=args.device,
                                      attention_fraction=args.attention_fraction,
                                      trace=not args.no_trace, base=base)
    from hybridmem.sim.replay import COMPARISON_MD, format_comparison

    doc = replay(rec, planned, conditions, args.out, arrivals=args.replay_arrivals,
                 progress=not args.quiet)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(format_comparison(doc))
    print(f"wrote {args.out}/<org>/ and {args.out / COMPARISON_MD}", file=sys.stderr)
    return 0

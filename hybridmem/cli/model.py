"""``hybridmem model build | sensitivity``: the embedded tiny Falcon-H1, and whether state matters.

``build`` writes config, weights, tokenizer and ``hybridmem.json`` (deterministic per seed).
``sensitivity`` measures, with transformers, how many shared-prefix requests change greedy tokens
when their checkpoint is replaced by zeros (and that the true checkpoint changes none); exit 1
when the control fails or the zeroed state changes no strict majority.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from hybridmem.cli.common import count as count_arg
from hybridmem.cli.common import out_path as path_arg
from hybridmem.cli.common import real as real_arg
from hybridmem.cli.common import seed as seed_arg
from hybridmem.engines.tiny_model import DEFAULT_DIR, TINY_GRID_TOKENS
from hybridmem.errors import HybridMemError

HELP = "build the embedded tiny Falcon-H1, or measure whether a model's recurrent state matters"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help=HELP, description=HELP)
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", parser_class=type(p))
    msub.required = True
    b = msub.add_parser("build", help="build (or reuse) the tiny model in --out",
                        description="Build the tiny Falcon-H1 (hidden 128, 2 layers, 20 Mamba "
                        "heads of 16, d_state 64, 512-word vocabulary, weights shaped so the "
                        "recurrent state matters) from a seed. An existing build of the same "
                        "seed and version is reused.")
    b.add_argument("--out", type=path_arg(), default=str(DEFAULT_DIR), metavar="DIR",
                   help=f"model directory (default: {DEFAULT_DIR})")
    b.add_argument("--seed", type=seed_arg(), default=0, metavar="S",
                   help="weight seed (default 0)")
    b.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    b.set_defaults(func=run)
    s = msub.add_parser("sensitivity", help="greedy tokens from a true vs a zeroed checkpoint",
                        description="On a shared-prefix workload, continue each request with "
                        "transformers from its checkpoint at the deepest grid boundary inside "
                        "the shared prefix: once with the true state, once with SSM and conv "
                        "state zeroed. Reports how many requests change tokens (exit 1 unless "
                        "a strict majority changes and the true state changes none).")
    s.add_argument("--model", default="tiny", metavar="M",
                   help="'tiny' (the embedded model, built if missing) or a model directory")
    s.add_argument("--requests", type=count_arg(1, 1000), default=20, metavar="N",
                   help="workload requests, 1..1000 (default 20)")
    s.add_argument("--seed", type=seed_arg(), default=0, metavar="S",
                   help="workload seed (default 0)")
    s.add_argument("--share", type=real_arg(0.0, 1.0, lo_open=True), default=0.5, metavar="Q",
                   help="shared-prefix fraction of each prompt, in (0, 1] (default 0.5)")
    s.add_argument("--tokens", type=count_arg(1, 256), default=32, metavar="T",
                   help="greedy tokens generated per arm, 1..256 (default 32)")
    s.add_argument("--grid", type=count_arg(1, 8192), default=None, metavar="G",
                   help="checkpoint grid in tokens (default: the model's hybridmem.json, else "
                   f"{TINY_GRID_TOKENS})")
    s.add_argument("--max-model-len", type=count_arg(64, 8192), default=1024, metavar="L",
                   help="model limit the workload is scaled to, 64..8192 (default 1024, as "
                   "`hybridmem run`)")
    s.add_argument("--json", action="store_true", help="print the full report as JSON")
    s.set_defaults(func=run_sensitivity)


def _import_error(exc: ImportError) -> HybridMemError:
    return HybridMemError(f"{exc.name} is not installed; install hybridmem[vllm] "
                          "(see hybridmem/engines/README.md)")


def run(args: argparse.Namespace) -> int:
    args.out = Path(args.out)
    if args.out.exists() and not args.out.is_dir():
        raise HybridMemError(f"--out {str(args.out)!r} exists and is not a directory")
    from hybridmem.engines.tiny_model import build_tiny_model

    try:
        model = build_tiny_model(args.out, seed=args.seed, force=args.force)
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    except ImportError as exc:
        raise _import_error(exc) from None
    verb = "built" if model.built else "reused"
    print(f"{verb} {model.path} (seed {model.seed}, sha256 {model.digest[:16]})")
    return 0


def _check(args: argparse.Namespace) -> None:
    for name, value, lo, hi in (("--requests", args.requests, 1, 1000),
                                ("--seed", args.seed, 0, 2**32 - 1),
                                ("--tokens", args.tokens, 1, 256),
                                ("--max-model-len", args.max_model_len, 64, 8192)):
        if not lo <= value <= hi:
            raise HybridMemError(f"{name} must lie in [{lo}, {hi}], got {value}")
    if not (math.isfinite(args.share) and 0.0 < args.share <= 1.0):
        raise HybridMemError(f"--share must lie in (0, 1], got {args.share}")
    if args.grid is not None and not 1 <= args.grid < args.max_model_len:
        raise HybridMemError(f"--grid must lie in [1, {args.max_model_len - 1}] tokens, "
                             f"got {args.grid}")


def run_sensitivity(args: argparse.Namespace) -> int:
    _check(args)
    try:
        from hybridmem.engines.state_sensitivity import measure_sensitivity
        from hybridmem.engines.tiny_model import grid_tokens, resolve_model

        model = resolve_model(args.model)
        grid = args.grid or grid_tokens(model) or TINY_GRID_TOKENS

        def progress(done: int, total: int) -> None:
            print(f"\rsensitivity: {done}/{total} requests", end="", file=sys.stderr, flush=True)

        report = measure_sensitivity(model, requests=args.requests, seed=args.seed,
                                     share=args.share, new_tokens=args.tokens, grid_tokens=grid,
                                     model_limit=args.max_model_len, progress=progress)
        print(file=sys.stderr)
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    except ImportError as exc:
        raise _import_error(exc) from None
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print(f"model {report.model}: grid {report.grid_tokens} tokens, {report.new_tokens} greedy "
              f"tokens per arm, {report.measured} requests with a checkpoint "
              f"({report.skipped} without one)")
        print(f"{'request':<12} {'prompt':>6} {'b':>5}  true==ref  zero: first diff")
        for r in report.requests:
            div = "-" if r.zero_divergence is None else str(r.zero_divergence)
            print(f"{r.request_id:<12} {r.prompt_tokens:>6} {r.boundary:>5}  "
                  f"{'yes' if r.true_matches_reference else 'NO':>9}  {div:>15}")
        divs = sorted(r.zero_divergence for r in report.requests if r.zero_divergence is not None)
        median = divs[len(divs) // 2] if divs else None
        margin = min((r.min_margin for r in report.requests), default=float("nan"))
        print(f"zeroed state changed {report.zero_changed}/{report.measured} requests "
              f"(median first divergence {median}); true state changed "
              f"{report.control_changed}/{report.measured}; min top-1/top-2 logit margin "
              f"{margin:.2e}")
        print("accepted" if report.accepted else
              "NOT accepted: need a strict majority changed by zeros and none by the true state")
    return 0 if report.accepted else 1

"""``hybridmem model build``: create the embedded tiny Falcon-H1 (config, weights, tokenizer)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybridmem.cli.common import out_path as path_arg
from hybridmem.cli.common import seed as seed_arg
from hybridmem.errors import HybridMemError

HELP = "build the embedded tiny Falcon-H1 model (deterministic for a seed)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help=HELP, description=HELP)
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", parser_class=type(p))
    msub.required = True
    b = msub.add_parser("build", help="build (or reuse) the tiny model in --out",
                        description="Build the tiny Falcon-H1 (hidden 128, 2 layers, 8 Mamba "
                        "heads of 16, d_state 16, 512-word vocabulary) with seeded random "
                        "weights. An existing build of the same seed is reused.")
    b.add_argument("--out", type=path_arg(), default="data/models/tiny-falcon-h1", metavar="DIR",
                   help="model directory (default: data/models/tiny-falcon-h1)")
    b.add_argument("--seed", type=seed_arg(), default=0, metavar="S",
                   help="weight seed (default 0)")
    b.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    b.set_defaults(func=run)


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
        raise HybridMemError(f"{exc.name} is not installed; install hybridmem[vllm] "
                             "(see hybridmem/engines/README.md)") from None
    verb = "built" if model.built else "reused"
    print(f"{verb} {model.path} (seed {model.seed}, sha256 {model.digest[:16]})")
    return 0

"""``hybridmem serve``: vLLM's OpenAI-compatible server with a memory organization.

Builds the plain vLLM command (``hybridmem.engines.serve_command``), prints it, and replaces this
process by it (``exec``): signals, exit code and logs are vLLM's own. ``--print-command`` prints
it and exits, for users who run vLLM themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hybridmem.cli import models
from hybridmem.cli.common import attention_fraction, count, path_arg
from hybridmem.errors import HybridMemError

HELP = "start vLLM's OpenAI-compatible server serving through a memory organization"
# flags hybridmem serve sets itself: passed after `--` they would silently undo the organization
OWNED_FLAGS = ("--model", "--host", "--port", "--block-size", "--scheduler-cls",
               "--additional-config", "--distributed-executor-backend", "--async-scheduling",
               "--no-async-scheduling", "--enable-prefix-caching", "--no-enable-prefix-caching")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help=HELP,
        description=HELP + ". The server is vLLM's own (`python -m "
        "vllm.entrypoints.openai.api_server`, what `vllm serve` runs); hybridmem sets the "
        "flags and environment that route every KV-cache decision through the organization "
        "(hybridmem/engines/README.md). Flags after `--` go to vLLM unchanged.",
        epilog="example: hybridmem serve --org S2 --budget b40 --model tiny --trace "
        "/tmp/s2.hmt --port 8000 -- --max-num-seqs 8")
    p.add_argument("--org", default=models.DEFAULT_ORG, choices=models.ORG_CHOICES,
                   help="S0, S1, S2 or D0 (the organization decides every KV-cache allocation "
                   "and reuse), or vllm (vLLM's own manager) (default %(default)s)")
    p.add_argument("--budget", default=None, metavar="B",
                   help="per-layer budget as in `hybridmem plan`: label bN, bytes or a size "
                   "(default b40 for the tiny model, b63 for others; not with --org vllm)")
    p.add_argument("--model", default=models.TINY, metavar="M",
                   help="'tiny' (the embedded model, built if missing) or a model directory "
                   "with weights")
    p.add_argument("--attention-fraction", type=attention_fraction(), default=None,
                   metavar="F", help="D0's attention share in (0, 1) (models without a preset)")
    p.add_argument("--check-invariants", action="store_true",
                   help="run the invariant checkers after every scheduler step")
    p.add_argument("--trace", type=path_arg(), default=None, metavar="PATH",
                   help="write the event trace to PATH (a file; replaced if it exists). "
                   "Stopping the server with Ctrl-C or SIGTERM writes its END record")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=count(1, 65535), default=8000, metavar="P",
                   help="TCP port (default %(default)s)")
    p.add_argument("--print-command", action="store_true",
                   help="print the equivalent plain vLLM command line and exit")
    p.add_argument("vllm_args", nargs="*", metavar="-- VLLM_ARGS",
                   help="further vLLM flags, after `--` (e.g. -- --max-num-seqs 8)")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    """Everything checkable before the model is built or vLLM starts; one line on failure."""
    models.served(args.model, "hybridmem serve")
    if args.org == "vllm":
        for flag, value in (("--budget", args.budget),
                            ("--attention-fraction", args.attention_fraction),
                            ("--check-invariants", args.check_invariants or None)):
            if value is not None:
                raise HybridMemError(f"{flag} needs an organization (S0-S2, D0); --org vllm "
                                     "is vLLM's own KV-cache manager")
    if not args.host.strip() or any(c.isspace() for c in args.host):
        raise HybridMemError(f"--host {args.host[:80]!r}: expected an address")
    extra = list(args.vllm_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if "--print-command" in extra:
        raise HybridMemError("--print-command after `--` would go to vLLM; put it before `--`")
    for word in extra:
        flag = word.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise HybridMemError(f"{flag} is set by hybridmem serve (use its own --model, "
                                 "--host, --port, --org, --budget); print the command with "
                                 "--print-command to change it by hand")
    args.vllm_args = extra
    if args.trace is not None:
        trace = Path(args.trace).absolute()
        if trace.is_dir():
            raise HybridMemError(f"--trace {str(args.trace)!r} is a directory; name a file")
        if trace.exists() and not trace.is_file():
            raise HybridMemError(f"--trace {str(args.trace)!r} exists and is not a regular file")
        args.trace = trace
    from hybridmem.vllm_plugin.shutdown import grace_s

    try:
        grace_s()
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None


def _plan(args: argparse.Namespace, model: Path) -> tuple[int, int] | None:
    """The organization's grid and KV-cache bytes after checking its budget as the engine core
    will (None for --org vllm). The bytes are what vLLM allocates for the organization's block
    ids: one G x a page per block in each attention and Mamba layer."""
    if args.org == "vllm":
        return None
    from hybridmem.vllm_plugin.org_geometry import org_grid
    from hybridmem.vllm_plugin.org_settings import OrgSettings, plan_org

    if args.budget is None:
        args.budget = models.default_budget(args.model)
    grid = org_grid(args.org, model)
    try:
        settings = OrgSettings(args.org, args.budget, attention_fraction=args.attention_fraction,
                               check_invariants=args.check_invariants).check()
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    geo = models.geometry(str(model))
    plan = plan_org(settings, geo, grid)  # HybridMemError: no unit
    layers = geo.n_attention_layers + geo.n_mamba_layers
    return int(grid), plan.num_block_ids * grid * geo.attn_bytes_per_token * layers


def run(args: argparse.Namespace) -> int:
    _check(args)
    from hybridmem.engines.serve_command import ServeSpec, serve_command, shell_line
    from hybridmem.engines.tiny_model import resolve_model

    try:
        model = resolve_model(args.model).absolute()
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    planned = _plan(args, model)
    grid, kv_bytes = planned if planned is not None else (None, None)
    spec = ServeSpec(org=args.org, model=model, grid=grid, budget=args.budget,
                     attention_fraction=args.attention_fraction,
                     check_invariants=args.check_invariants, trace=args.trace, host=args.host,
                     port=args.port, served_name=models.TINY if args.model == models.TINY else None,
                     kv_cache_bytes=kv_bytes, extra=tuple(args.vllm_args))
    argv, env = serve_command(spec)
    line = shell_line(argv, env)
    if args.print_command:
        print(line)
        return 0
    print(f"hybridmem serve: {line}", file=sys.stderr, flush=True)
    full = {k: v for k, v in os.environ.items()
            if k not in ("HYBRIDMEM_TRACE", "HYBRIDMEM_ORG_GRID")}  # only what was printed
    full.update(env)
    sys.stdout.flush()
    os.execve(argv[0], argv, full)
    return 0  # not reached

"""``hybridmem run``: a timed serving run on vLLM (in-process), traced or not."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from hybridmem.cli import engine_log, models
from hybridmem.cli.common import (
    MAX_CAP,
    MAX_KV_BLOCKS,
    MAX_MODEL_LEN,
    MAX_REQUESTS,
    TOTAL_HELP,
    attention_fraction,
    count,
    real,
)
from hybridmem.cli.common import out_path as path_arg
from hybridmem.cli.common import seed as seed_arg
from hybridmem.cli.summary_text import format_summary
from hybridmem.errors import HybridMemError
from hybridmem.inputs import read_input_text

# the names of hybridmem.vllm_plugin.faults.FAULTS, spelled here so `--help` does not import the
# plugin (and torch with it); a test keeps the two equal
FAULT_NAMES = ("stale-checkpoint", "skip-invalidate", "swap-members")

DEFAULT_ORG = models.DEFAULT_ORG  # the organization-backed path; --org vllm: vLLM's own manager
DEFAULT_BUDGET = models.default_budget(models.TINY)  # b40: 110 pages of 64 tokens; forces reclaim

HELP = ("serve a Poisson workload on vLLM (in-process, or through `vllm serve` over HTTP with "
        "--server) and write results.parquet + summary.json")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help=HELP, description=HELP)
    p.add_argument("--model", default="tiny", metavar="M",
                   help="'tiny' (the embedded model, built if missing) or a model directory "
                   "with weights (the shipped architecture-only names are for plan and sim)")
    p.add_argument("--requests", type=count(1, MAX_REQUESTS), default=20, metavar="N",
                   help=f"requests (default 20, at most {MAX_REQUESTS:,})")
    p.add_argument("--rate", type=real(0, 1e6, lo_open=True), default=3.0, metavar="R",
                   help="Poisson arrival rate in requests/s (default 3)")
    p.add_argument("--share", type=real(0, 1), default=0.5, metavar="Q",
                   help="shared-prefix fraction q of each prompt, in [0, 1] (default 0.5)")
    p.add_argument("--seed", type=seed_arg(), default=0, metavar="S",
                   help="workload and engine seed, in [0, 2**32 - 1]")
    p.add_argument("--cap", type=count(1, MAX_CAP), default=None, metavar="C",
                   help="running-sequence cap (vLLM max_num_seqs; default 8 for the tiny model, "
                   "63 for others)")
    p.add_argument("--isolate", action="store_true",
                   help="per-request cache_salt: no cross-request prefix reuse")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--trace", type=path_arg(), default=None, metavar="DIR",
                   help="write the event trace into DIR (default: OUT/trace)")
    g.add_argument("--no-trace", action="store_true", help="run without tracing hooks")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument("--max-model-len", type=count(64, MAX_MODEL_LEN), default=1024, metavar="T",
                   help="model limit the workload is scaled to (default 1024)")
    p.add_argument("--kv-blocks", type=count(2, MAX_KV_BLOCKS), default=None, metavar="B",
                   help="KV-cache blocks (default: sized from 256 MiB)")
    p.add_argument("--max-num-batched-tokens", type=count(16, 1 << 20), default=None,
                   metavar="T", dest="chunk_tokens",
                   help="tokens per engine step, i.e. the longest prefill chunk (vLLM "
                   "max_num_batched_tokens; default: vLLM's)")
    p.add_argument("--out", type=path_arg(), required=True, metavar="DIR",
                   help="output directory")
    p.add_argument("--server", action="store_true",
                   help="run vLLM's OpenAI-compatible server as a subprocess on 127.0.0.1 (a free "
                   "port) with the same settings and replay the workload over HTTP, streaming "
                   "/v1/completions; writes OUT/server.log too")
    p.add_argument("--server-timeout", type=real(0, 1e6, lo_open=True), default=300.0,
                   metavar="S",
                   help="with --server: seconds to wait for the server's /health (default 300)")
    p.add_argument("--request-timeout", type=real(0, 1e6, lo_open=True), default=600.0,
                   metavar="S",
                   help="with --server: seconds one request may take, stream included "
                   "(default 600); a request past it counts as failed")
    o = p.add_argument_group("memory organization")
    o.add_argument("--org", default=DEFAULT_ORG, metavar="ORG",
                   help="S0, S1, S2 or D0: the organization serves every KV-cache decision "
                   "inside vLLM's scheduler; vllm: vLLM's own manager with tracing hooks "
                   "(default %(default)s)")
    b = o.add_mutually_exclusive_group()
    b.add_argument("--budget", default=None, metavar="B",
                   help="per-layer budget as in `hybridmem plan`: label bN, bytes or a size "
                   f"(org mode; default {DEFAULT_BUDGET} for the tiny model, b63 for others)")
    b.add_argument("--total", default=None, metavar="SIZE",
                   help=TOTAL_HELP + "; with --org vllm it is vLLM's --kv-cache-memory-bytes "
                   "(default 256MiB there)")
    o.add_argument("--headroom", type=real(0, 1, hi_open=True), default=0.0, metavar="F",
                   help="admission headroom f in [0, 1): admit only if need + floor(f B) <= "
                   "available (default 0)")
    o.add_argument("--pin-k", type=count(1, 3), default=None, metavar="K",
                   help="preemption-time pinning threshold K = 1|2|3 distinct requesters "
                   "(default off)")
    o.add_argument("--pin-budget", type=count(1, 1 << 20), default=None, metavar="N",
                   help="most simultaneous pins (with --pin-k; default unlimited)")
    o.add_argument("--retention", action="store_true",
                   help="producer-side retention of checkpoints with demand >= 2")
    o.add_argument("--fault", default=None, metavar="NAME",
                   help="inject a fault: " + ", ".join(FAULT_NAMES))
    o.add_argument("--check-invariants", action="store_true",
                   help="run the App. D.2 invariant checkers after every scheduler step; a "
                   "violation stops the run (exit 1) naming invariant, unit and entry")
    o.add_argument("--attention-fraction", type=attention_fraction(),
                   default=None, metavar="F",
                   help="D0's attention share in (0, 1) (models without a preset)")
    o.add_argument("--poison-vllm-state", action="store_true",
                   help="check mode: fill vLLM's own Mamba state rows with NaN before every "
                   "Mamba forward (outputs must not change: the state lives at the "
                   "organization's addresses)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object on stdout, nothing else there")
    engine_log.add_argument(p)
    p.set_defaults(func=run)


def check_paths(args: argparse.Namespace) -> None:
    """Model and output paths, checked before any engine module is imported."""
    models.served(args.model, "hybridmem run")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HybridMemError(f"--out {args.out!r} exists and is not a directory")
    limit = _max_positions(args.model)
    if limit is not None and args.max_model_len > limit:  # vLLM would refuse after starting
        raise HybridMemError(f"--max-model-len {args.max_model_len:,} is over the model's "
                             f"max_position_embeddings {limit:,}")


def _max_positions(model: str) -> int | None:
    """The model's max_position_embeddings (None when its config does not say)."""
    if model == "tiny":
        from hybridmem.engines.tiny_model import MAX_MODEL_LEN

        return MAX_MODEL_LEN
    try:
        cfg = json.loads(read_input_text(Path(model) / "config.json", "config"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HybridMemError(f"model {model!r}: config.json is not readable JSON "
                             f"({type(exc).__name__})") from None
    v = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def check_values(args: argparse.Namespace) -> None:
    """The fault name and the budget (parsed for the model, as the engine will), checked before
    any engine module is imported. ``--total`` becomes the budget text ``total SIZE`` (org
    mode) or vLLM's cache bytes (``--org vllm``: ``args.kv_cache_bytes``), once it gives the
    organization (vLLM: one unified block, S0's page) a unit of each kind, as `plan` requires."""
    if args.fault is not None and args.fault not in FAULT_NAMES:
        raise HybridMemError(f"--fault {args.fault[:80]!r}: not one of {', '.join(FAULT_NAMES)}")
    args.kv_cache_bytes = None
    if args.total is not None and args.kv_blocks is not None:
        raise HybridMemError("--total and --kv-blocks both size the cache; give one")
    if (args.org != "vllm" and args.budget is not None) or args.total is not None:
        from hybridmem.budget import parse_budget, parse_total, plan_budget

        units = models.units(args.model)
        if args.total is None:
            parse_budget(args.budget, units)
            return
        budget = parse_total(args.total, units)
        plan_budget(units, budget, args.attention_fraction).check_holds(
            ("S0",) if args.org == "vllm" else (args.org,))
        if args.org == "vllm":
            args.kv_cache_bytes = budget.total_bytes
        else:
            args.budget = budget.label


def run(args: argparse.Namespace) -> int:
    args.out = Path(args.out)
    if args.trace is not None:
        args.trace = Path(args.trace)
    check_paths(args)
    check_values(args)
    try:
        from hybridmem.engines.vllm_run import RunConfig, run_serving
        if args.server:
            import httpx  # noqa: F401

            from hybridmem.engines.http_run import run_serving_http
    except ImportError as exc:
        raise HybridMemError(f"{exc.name} is not installed; install hybridmem[vllm] "
                             "(see hybridmem/engines/README.md)") from None
    trace_dir = None if args.no_trace else (args.trace or args.out / "trace")
    org = args.org
    budget = args.budget
    if org != "vllm" and budget is None:
        budget = models.default_budget(args.model)
    if args.cap is None:
        args.cap = models.default_cap(args.model)
    cfg = RunConfig(
        model=args.model, requests=args.requests, rate=args.rate, share=args.share,
        seed=args.seed, cap=args.cap, isolate=args.isolate, trace_dir=trace_dir, out=args.out,
        prefix_caching=not args.no_prefix_caching, max_model_len=args.max_model_len,
        kv_blocks=args.kv_blocks, chunk_tokens=args.chunk_tokens, org=org, budget=budget,
        **({} if args.kv_cache_bytes is None else {"kv_cache_bytes": args.kv_cache_bytes}),
        headroom=args.headroom,
        pin_k=args.pin_k, pin_budget=args.pin_budget, retention=args.retention,
        fault=args.fault, check_invariants=args.check_invariants,
        attention_fraction=args.attention_fraction,
        poison_vllm_state=args.poison_vllm_state,
    )
    try:
        for name in ("headroom", "attention_fraction"):
            value = getattr(args, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"--{name.replace('_', '-')} must be finite, got {value}")
        cfg.check()
        for name in ("server_timeout", "request_timeout"):
            value = getattr(args, name)
            if not value > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 s, got {value}")
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    log = None
    if not args.server:  # the server's own output goes to OUT/server.log
        log = engine_log.route_engine_logs(args.out, args.engine_log_level)
    if args.server:
        result = run_serving_http(cfg, progress=not args.quiet,
                                  start_timeout=args.server_timeout,
                                  request_timeout=args.request_timeout)
    else:
        result = run_serving(cfg, progress=not args.quiet)
    s = result.summary
    keys = ("seed", "trace", "organization", "budget", "budget_bytes", "fault",
            "poison_vllm_state",
            "invariant_checks", "requests", "completed", "throughput_tok_s",
            "throughput_ledger_tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99",
            "preemptions", "prefix_hit_tokens", "trace_path", "trace_verdict")
    if args.json:
        print(json.dumps({k: s.get(k) for k in keys}, indent=2))
    else:
        print(format_summary(s))
    notes = sys.stderr if args.json else sys.stdout
    print(f"wrote {result.results_path}, {result.summary_path}, {result.manifest_path}",
          file=notes)
    if log is not None:
        print(f"vLLM's log: {log} (--engine-log-level {args.engine_log_level})", file=notes)
    if args.server:
        print(f"server log: {s['server_log']} (exit code {s['server_exit_code']})", file=notes)
    if str(s.get("invariant_checks", "")).startswith("violated"):
        print(f"hybridmem run: invariant {s['invariant_checks']}", file=sys.stderr)
        return 1
    return 0

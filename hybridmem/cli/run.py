"""``hybridmem run``: a timed serving run on vLLM (in-process), traced or not."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hybridmem.cli.common import MAX_CAP, MAX_KV_BLOCKS, MAX_MODEL_LEN, MAX_REQUESTS, count, real
from hybridmem.cli.common import out_path as path_arg
from hybridmem.cli.common import seed as seed_arg
from hybridmem.errors import HybridMemError

HELP = ("serve a Poisson workload on vLLM (in-process, or through `vllm serve` over HTTP with "
        "--server) and write results.parquet + summary.json")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help=HELP, description=HELP)
    p.add_argument("--model", default="tiny", metavar="M",
                   help="'tiny' (the embedded model, built if missing) or a model directory")
    p.add_argument("--requests", type=count(1, MAX_REQUESTS), default=20, metavar="N",
                   help=f"requests (default 20, at most {MAX_REQUESTS:,})")
    p.add_argument("--rate", type=real(0, 1e6, lo_open=True), default=3.0, metavar="R",
                   help="Poisson arrival rate in requests/s (default 3)")
    p.add_argument("--share", type=real(0, 1), default=0.5, metavar="Q",
                   help="shared-prefix fraction q of each prompt, in [0, 1] (default 0.5)")
    p.add_argument("--seed", type=seed_arg(), default=0, metavar="S",
                   help="workload and engine seed, in [0, 2**32 - 1]")
    p.add_argument("--cap", type=count(1, MAX_CAP), default=8, metavar="C",
                   help="running-sequence cap (vLLM max_num_seqs, default 8)")
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def check_paths(args: argparse.Namespace) -> None:
    """Model and output paths, checked before any engine module is imported."""
    if args.model != "tiny" and not (Path(args.model) / "config.json").is_file():
        raise HybridMemError(f"model {args.model!r}: no config.json there "
                             "(use 'tiny' or a model directory)")
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
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HybridMemError(f"model {model!r}: config.json is not readable JSON "
                             f"({type(exc).__name__})") from None
    v = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def run(args: argparse.Namespace) -> int:
    args.out = Path(args.out)
    if args.trace is not None:
        args.trace = Path(args.trace)
    check_paths(args)
    try:
        from hybridmem.engines.vllm_run import RunConfig, run_serving
        if args.server:
            import httpx  # noqa: F401

            from hybridmem.engines.http_run import run_serving_http
    except ImportError as exc:
        raise HybridMemError(f"{exc.name} is not installed; install hybridmem[vllm] "
                             "(see hybridmem/engines/README.md)") from None
    trace_dir = None if args.no_trace else (args.trace or args.out / "trace")
    cfg = RunConfig(
        model=args.model, requests=args.requests, rate=args.rate, share=args.share,
        seed=args.seed, cap=args.cap, isolate=args.isolate, trace_dir=trace_dir, out=args.out,
        prefix_caching=not args.no_prefix_caching, max_model_len=args.max_model_len,
        kv_blocks=args.kv_blocks,
    )
    try:
        cfg.check()
        for name in ("server_timeout", "request_timeout"):
            value = getattr(args, name)
            if not value > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 s, got {value}")
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    if args.server:
        result = run_serving_http(cfg, progress=not args.quiet,
                                  start_timeout=args.server_timeout,
                                  request_timeout=args.request_timeout)
    else:
        result = run_serving(cfg, progress=not args.quiet)
    s = result.summary
    keys = ("seed", "trace", "requests", "completed", "throughput_tok_s",
            "throughput_ledger_tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99",
            "preemptions", "prefix_hit_tokens", "trace_path", "trace_verdict")
    print(json.dumps({k: s[k] for k in keys}, indent=2))
    print(f"wrote {result.results_path}, {result.summary_path}, {result.manifest_path}")
    if args.server:
        print(f"server log: {s['server_log']} (exit code {s['server_exit_code']})")
    return 0

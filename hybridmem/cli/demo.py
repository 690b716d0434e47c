"""``hybridmem demo``: the main job of ``make demo``.

1. The Falcon-H1-7B budget plans at b63, b83 and b108 side by side (Table B-2).
2. A short traced serving run on vLLM (CPU) with the embedded tiny Falcon-H1 (built if missing),
   served by S2 (``hybridmem run --org S2``: vLLM's scheduler, S2's pages and conv lines, the
   Mamba state at S2's addresses on the model's 64-token grid): Poisson arrivals over eight
   shared contexts at a small budget, so that allocation pressure reclaims cached prefixes.
3. The trace's verdict, the run summary, and the lineage report of S2's own trace (entry versus
   adopted joint depth per episode, loss attribution, SQL versus scalar replay), with plots
   (lineage classes and depths, pool occupancy over engine steps, latency).
4. S0, S1, S2 and D0 side by side on one short workload at one small budget: completed requests,
   throughput, preemptions, prefix-hit tokens, losses by cause, mean J_adopt over INITIAL
   episodes (a table and a plot).

Both serving parts submit requests by engine step (the Poisson schedule at ``STEP_S`` seconds per
step), not by wall clock, so what the engine meets in each step, and every count that follows
(episodes, reuse, losses, preemptions, prefix hits), is the same on a quiet or a loaded machine.
Times (throughput, TTFT, E2E) are this CPU's wall clock: the side-by-side table is a CPU
wall-clock illustration of the organizations, not a measurement of them (``hybridmem sim`` and
``hybridmem campaign`` compare them in simulated GPU time). Every figure printed is measured by
this command.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hybridmem.budget import parse_budget, plan_budget
from hybridmem.cli import engine_log
from hybridmem.cli.common import MAX_REQUESTS, count, real
from hybridmem.cli.common import out_path as path_arg
from hybridmem.cli.common import seed as seed_arg
from hybridmem.cli.plan import format_plans
from hybridmem.cli.summary_text import format_summary
from hybridmem.errors import HybridMemError
from hybridmem.geometry import load_geometry
from hybridmem.units import derive_units

STEP_S = 0.02  # seconds of the Poisson schedule per engine step (arrivals by step)

HELP = ("budget plans for Falcon-H1-7B, then a short traced vLLM run with its trace verdict, "
        "summary and lineage report")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help=HELP, description=HELP)
    p.add_argument("--out", type=path_arg(), default="out/demo", metavar="DIR",
                   help="output directory (default out/demo)")
    p.add_argument("--requests", type=count(1, MAX_REQUESTS), default=150, metavar="N",
                   help="requests (150)")
    p.add_argument("--rate", type=real(0, 1e6, lo_open=True), default=10.0, metavar="R",
                   help="requests/s (10)")
    p.add_argument("--share", type=real(0, 1), default=0.8, metavar="Q",
                   help="shared fraction (0.8)")
    p.add_argument("--budget", default="b40", metavar="B",
                   help="per-layer budget of the S2 run (b40: 110 pages of 64 tokens for the "
                   "tiny model, so requests compete)")
    p.add_argument("--compare-requests", type=count(0, 1000), default=24, metavar="N",
                   help="requests of the S0/S1/S2/D0 side-by-side runs (24; 0 skips them)")
    p.add_argument("--compare-budget", default="b32", metavar="B",
                   help="budget of the side-by-side runs (b32: 88 pages under S1/S2, 33 under "
                   "S0, the smallest at which S0 admits every request of the workload under "
                   "the whole-sequence gate)")
    p.add_argument("--seed", type=seed_arg(), default=1, metavar="S")
    p.add_argument("--plan-only", action="store_true", help="print the budget plans and stop")
    engine_log.add_argument(p)
    p.set_defaults(func=run)


def _latency_plot(results: Path, out_png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.parquet as pq

    t = pq.read_table(results).to_pydict()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].scatter(t["arrival_s"], t["ttft_s"], s=10, label="TTFT")
    ax[0].scatter(t["arrival_s"], t["e2e_s"], s=10, label="E2E")
    ax[0].set(xlabel="submission (s, wall clock)", ylabel="seconds (wall clock)",
              title="latency per request")
    ax[0].legend()
    ax[1].scatter(t["input_tokens"], t["cached_tokens"], s=10)
    ax[1].set(xlabel="prompt tokens", ylabel="prefix-hit tokens",
              title="prefix reuse per request")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    units = derive_units(load_geometry("falcon-h1-7b"))
    plans = [plan_budget(units, parse_budget(b, units)) for b in ("b63", "b83", "b108")]
    print("== 1. Falcon-H1-7B budget plans, per layer (paper Table B-2) ==")
    print(format_plans(plans))
    if args.plan_only:
        return 0
    log = engine_log.route_engine_logs(Path(args.out), args.engine_log_level)
    try:
        from hybridmem.engines.vllm_run import RunConfig, run_serving
    except ImportError as exc:
        raise HybridMemError(f"{exc.name} is not installed; `make demo` installs the locked "
                             "CPU vLLM set (see hybridmem/engines/README.md)") from None
    from lineage.occupancy import plot_occupancy
    from lineage.report import analyse, format_text, plot
    from lineage.source import open_run
    from tracer.conditions import describe

    out = Path(args.out)
    cfg = RunConfig(model="tiny", requests=args.requests, rate=args.rate, share=args.share,
                    seed=args.seed, cap=8, trace_dir=out / "trace", out=out, org="S2",
                    budget=args.budget, arrivals="step", step_s=STEP_S)
    try:
        cfg.check()
        if not 0 <= args.compare_requests <= 1000:
            raise ValueError(f"--compare-requests must be 0..1000, got {args.compare_requests}")
        RunConfig(org="S2", budget=args.compare_budget).check()
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    print(f"\n== 2. Traced run served by S2: tiny Falcon-H1, {args.requests} requests at "
          f"{args.rate:g}/s, q={args.share:g}, cap 8, budget {args.budget}; arrivals by engine "
          f"step ({STEP_S * 1000:g} ms of the schedule a step), times on this CPU's wall clock "
          "==", flush=True)
    result = run_serving(cfg, progress=True)
    s: dict[str, Any] = result.summary
    verdict = s["trace_verdict"] or {}
    print(f"trace {s['trace_path']}: {verdict.get('reason')} "
          f"(records {verdict.get('records')}, gaps {verdict.get('gaps')}, "
          f"dropped {verdict.get('dropped')}, write errors {verdict.get('write_errors')})")
    print(format_summary(s))
    st = s.get("state_storage") or {}
    print(f"state storage: {st.get('arena')} arena, {st.get('members')} SSM member pages of "
          f"{st.get('page_bytes')} B, conv {st.get('conv')} ({st.get('slots_per_slab')} per slab)")
    run_ = open_run(s["trace_path"])
    latency_png = out / "latency.png"
    _latency_plot(result.results_path, latency_png, describe(run_.meta.as_json()))

    print("\n== 3. Lineage of S2's trace ==", flush=True)
    report = analyse(run_)
    print(format_text(report))
    lineage_png = out / "lineage.png"
    plot([report], str(lineage_png))
    occupancy_png = out / "occupancy.png"
    plot_occupancy([run_], str(occupancy_png))
    accepted = bool(verdict.get("accepted"))
    written = [result.results_path, result.summary_path, result.manifest_path, latency_png,
               lineage_png, occupancy_png]
    if args.compare_requests:
        from hybridmem.engines.org_compare import compare_orgs

        print(f"\n== 4. S0, S1, S2, D0 side by side: {args.compare_requests} requests at "
              f"{args.rate:g}/s, q={args.share:g}, budget {args.compare_budget}; arrivals by "
              "engine step; a CPU wall-clock illustration (tok/s measures this machine; the "
              "counts repeat on any machine) ==", flush=True)
        ok, png = compare_orgs(out / "compare", args.compare_requests, args.share, args.seed,
                               args.compare_budget, rate=args.rate, arrivals="step")
        accepted = accepted and ok
        written.append(png)
    print("\nwrote " + ", ".join(str(w) for w in written))
    if log is not None:
        print(f"vLLM's log: {log} (--engine-log-level {args.engine_log_level})")
    return 0 if accepted else 1

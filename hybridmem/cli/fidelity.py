"""``hybridmem fidelity``: trace-ON vs trace-OFF throughput check (SPEC §6)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybridmem.cli.common import level as level_arg
from hybridmem.cli.common import out_path, print_json, real
from hybridmem.errors import HybridMemError
from hybridmem.fidelity import BOUND, DEFAULT_METRIC, LEVEL, METRICS, FidelityResult, fidelity
from hybridmem.outputs import atomic_output, check_output

HELP = "does tracing change throughput? paired-t interval of 100 ln(ON/OFF) inside +-3"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fidelity", help=HELP,
        description="Pairs trace-ON and trace-OFF run directories by the seed in their "
        "summary.json and applies SPEC §6: the two-sided 90% paired-t interval (df = n - 1) "
        "of 100 ln(ON/OFF) throughput must lie inside [-3, +3]. Prints the interval and PASS "
        "(exit 0) or FAIL (exit 1); unreadable or unpaired runs exit 2.")
    p.add_argument("--on", nargs="+", required=True, metavar="DIR", help="trace-ON run directories")
    p.add_argument("--off", nargs="+", required=True, metavar="DIR",
                   help="trace-OFF run directories")
    p.add_argument("--metric", default=DEFAULT_METRIC, choices=METRICS,
                   help=f"summary.json throughput key (default {DEFAULT_METRIC}: request span; "
                   "throughput_cpu_tok_s, tokens per CPU second of the run's process, is a "
                   "diagnostic for shared machines, not the SPEC metric)")
    p.add_argument("--level", type=level_arg(), default=LEVEL,
                   help=f"two-sided confidence level (default {LEVEL})")
    p.add_argument("--bound", type=real(0, 1e6, lo_open=True), default=BOUND,
                   help=f"allowed |100 ln(ON/OFF)| in log points (default {BOUND:g})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", type=out_path((".png",)), default=None, metavar="PNG",
                   help="also draw each seed's 100 ln(ON/OFF), the mean, its interval and the "
                   "bounds into this PNG")
    p.set_defaults(func=run)


def format_result(r: FidelityResult) -> str:
    iv = r.interval
    lines = [f"trace fidelity over {iv.n} seed pairs ({r.metric}, tokens/s)"]
    for p in r.pairs:
        lines.append(f"  seed {p.seed}: ON {p.on:.3f}  OFF {p.off:.3f}  "
                     f"100 ln(ON/OFF) = {p.effect:+.3f}")
    lines.append(f"  mean {iv.mean:+.3f}; {100 * iv.level:g}% paired-t interval "
                 f"[{iv.low:+.3f}, {iv.high:+.3f}] (df {iv.n - 1}), must lie in "
                 f"[{-r.bound:g}, +{r.bound:g}]")
    lines.append("PASS" if r.passed else "FAIL")
    return "\n".join(lines)


def _conditions(on_dir: str) -> str:
    """The first ON run's conditions from its summary.json (figure title), or ''."""
    import json

    from tracer.conditions import describe, summary_meta

    try:
        summary = json.loads((Path(on_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(summary, dict):
        return ""
    import re

    # one seed per pair: the x axis names them, the title the rest
    return re.sub(r", seed [^ |,]+", ", seeds on the x axis", describe(summary_meta(summary)))


def plot_result(r: FidelityResult, out_png: Path, conditions: str = "") -> None:
    """Per-seed effects as points, the mean with its interval, the +-bound band; the title
    names ``conditions`` (the runs' organization, budget, requests, clock) when given."""
    try:
        import matplotlib
    except ImportError:
        raise HybridMemError("--plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iv = r.interval
    fig, ax = plt.subplots(figsize=(7, 3.4))
    xs = range(len(r.pairs))
    ax.axhspan(-r.bound, r.bound, color="tab:green", alpha=0.12,
               label=f"allowed [{-r.bound:g}, +{r.bound:g}]")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.scatter(list(xs), [p.effect for p in r.pairs], color="tab:blue", zorder=3,
               label="seed: 100 ln(ON/OFF)")
    ax.axhline(iv.mean, color="tab:red", lw=1.2, label=f"mean {iv.mean:+.2f}")
    ax.axhspan(iv.low, iv.high, color="tab:red", alpha=0.15,
               label=f"{100 * iv.level:g}% interval [{iv.low:+.2f}, {iv.high:+.2f}]")
    ax.set_xticks(list(xs), [str(p.seed) for p in r.pairs])
    ax.set(xlabel="seed", ylabel="log points (~%)",
           title=f"trace probe effect on {r.metric}: {'PASS' if r.passed else 'FAIL'}")
    ax.legend(fontsize=7, loc="best")
    if conditions:
        import textwrap

        fig.suptitle(textwrap.fill(conditions, 110), fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(out_png, dpi=110)
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.plot is not None:
        check_output(args.plot, [*args.on, *args.off], "--plot")
    result = fidelity(args.on, args.off, metric=args.metric, level=args.level, bound=args.bound)
    if args.json:
        print_json(result.as_dict())
    else:
        print(format_result(result))
    if args.plot is not None:
        with atomic_output(args.plot, [*args.on, *args.off], "--plot") as tmp:
            plot_result(result, tmp, _conditions(args.on[0]))
        if not args.json:
            print(f"plot: {args.plot}")
    return 0 if result.passed else 1

"""``hybridmem campaign``: a grid of simulated runs, its paired statistics and figures.

    hybridmem campaign SPEC.toml --out DIR [--workers N] [--ray ADDRESS] [--stats-only]
    hybridmem campaign report DIR... [--out FILE.md] [--html FILE.html] [--spec SPEC.toml]...

Writes DIR/cells/<cell>/ (each a ``hybridmem sim`` run), DIR/runs.parquet (one row per cell),
DIR/stats.json + stats.csv (seed-paired contrasts, Holm over the spec's family) and
DIR/figures/*.png. Finished cells are never rerun. Spec format: hybridmem/sim/campaign_spec.py;
the paper's grids: campaigns/*.toml.

``report``: for each campaign directory, the paper's figures (the spec's ``[[paper]]`` entries)
beside the simulated figure, its interval and a verdict (reproduces / direction only /
contradicts / inconclusive / not modelled), preemptions beside the throughput effects, what the
simulator cannot model per question, and figures in the style of the paper's Figs. 2-7 (in
``FILE_figures/``). Markdown on stdout unless --out names a file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from hybridmem.errors import HybridMemError

HELP = ("run a grid of simulated runs (orgs x budgets x rates x caps x headroom x pin-k x "
        "retention x share x seeds) on local workers or Ray; paired stats and figures; "
        "`campaign report DIR...`: the paper's figures beside the simulated ones")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("campaign", help=HELP, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", type=Path, nargs="+", metavar="SPEC.toml",
                   help="campaign spec (or: report DIR...)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="campaign directory (report: the Markdown file)")
    p.add_argument("--html", type=Path, default=None, metavar="FILE.html",
                   help="report: also write the table as HTML")
    p.add_argument("--spec", dest="paper_specs", type=Path, action="append", default=[],
                   metavar="SPEC.toml",
                   help="report: read the paper's figures from this spec for the campaign "
                        "directory of the same name (repeatable; for campaigns run before "
                        "their spec named them)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="cells at a time: local worker processes (default 1), or the CPUs of "
                        "the Ray instance --ray local starts (default: all cores)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run cells as Ray tasks on the cluster at ADDRESS ('local': start one)")
    p.add_argument("--stats-only", action="store_true",
                   help="run nothing: statistics and figures over DIR/runs.parquet")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.set_defaults(func=run)


# 'local' (start one), 'auto' (Ray's own lookup), HOST:PORT or ray://HOST:PORT (Ray Client)
RAY_ADDRESS = re.compile(r"(?:ray://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?"
                         r"|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def check_ray_address(address: str) -> None:
    """Refuse a --ray value that is no address, before any worker or Ray starts."""
    if address in ("local", "auto"):
        return
    m = RAY_ADDRESS.fullmatch(address)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise HybridMemError(f"--ray {address[:80]!r}: expected 'local', 'auto', HOST:PORT or "
                             "ray://HOST:PORT (port 1-65535)")


def run(args: argparse.Namespace) -> int:
    if str(args.spec[0]) == "report":
        return _report(args)
    if len(args.spec) != 1:
        raise HybridMemError(f"one campaign spec at a time, got {len(args.spec)}")
    if args.out is None:
        raise HybridMemError("--out DIR is required (the campaign directory)")
    if args.html is not None or args.paper_specs:
        raise HybridMemError("--html and --spec are options of `hybridmem campaign report`")
    args.spec = args.spec[0]
    from hybridmem.sim.campaign_spec import load_spec

    if args.workers is not None and not 1 <= args.workers <= 256:
        raise HybridMemError(f"--workers must lie in [1, 256], got {args.workers}")
    if args.ray is not None:
        check_ray_address(args.ray)
    if args.out.exists() and not args.out.is_dir():
        raise HybridMemError(f"--out {str(args.out)!r} exists and is not a directory")
    if args.out.resolve() == args.spec.resolve():
        raise HybridMemError("--out must not be the spec file")
    spec = load_spec(args.spec)
    from hybridmem.sim.campaign_run import RUNS_FILE, run_campaign
    from hybridmem.sim.campaign_stats import analyse, format_tests, load_runs, write_stats

    if args.stats_only:
        runs = args.out / RUNS_FILE
        if not runs.is_file():
            raise HybridMemError(f"--stats-only: no {str(runs)!r}; run the campaign first")
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        runs = run_campaign(spec, args.out, workers=args.workers or 1, ray_address=args.ray,
                            ray_cpus=args.workers)
    rows = load_runs(runs)
    failures = args.out / "failures.json"
    failed = json.loads(failures.read_text()) if failures.is_file() else {}
    tests = analyse(rows, spec.contrasts, spec.metrics, spec.level, common_seeds=bool(failed))
    js, cs = write_stats(tests, args.out)
    if tests:
        print(format_tests(tests))
    print(f"wrote {runs} ({len(rows)} runs), {js}, {cs}", file=sys.stderr)
    if not args.no_plots:
        from hybridmem.sim.campaign_plots import plot_all
        from hybridmem.sim.campaign_report import conditions

        meta = json.loads((args.out / "campaign.json").read_text()) \
            if (args.out / "campaign.json").is_file() else {}
        for path in plot_all(rows, args.out / "figures", conditions(meta, rows)):
            print(f"figure: {path}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} cell(s) failed; statistics pair the seeds both arms have "
              "(dropped_seeds in stats.json): not a complete campaign", file=sys.stderr)
        return 1
    return 0


def _report(args: argparse.Namespace) -> int:
    from hybridmem.sim.campaign_report import write_report

    dirs = list(args.spec[1:])
    if not dirs:
        raise HybridMemError("campaign report needs at least one campaign directory")
    if args.workers is not None or args.ray is not None or args.stats_only:
        raise HybridMemError("campaign report takes DIR... [--out FILE.md] [--html FILE.html]")
    text, figures = write_report(dirs, args.out, args.html, plots=not args.no_plots,
                                 specs=args.paper_specs)
    if args.out is None:
        print(text, end="")
    for f in figures:
        print(f"figure: {f}", file=sys.stderr)
    for target in (args.out, args.html):
        if target is not None:
            print(f"wrote {target}", file=sys.stderr)
    return 0

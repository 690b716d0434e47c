"""``hybridmem stats``: seed-paired contrasts and Holm adjustment (§4.1, App. B.5, G.4)."""

from __future__ import annotations

import argparse

from hybridmem.cli.common import level as level_arg
from hybridmem.cli.common import print_json, real
from hybridmem.stats import (
    TEST_SCALES,
    PairedContrast,
    StatsError,
    arm,
    check_level,
    contrast,
    holm,
    load_long,
    two_look,
)

HELP = "seed-paired contrasts (log ratios, paired-t, sign-flip) and Holm adjustment"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help=HELP, description=HELP + ".")
    verbs = p.add_subparsers(dest="stats_command", metavar="VERB")
    verbs.required = True

    c = verbs.add_parser(
        "contrast", help="paired contrast of two arms, or an interaction of two contrasts",
        description="Per seed d = ln(NUM/DEN) (minus ln(MINUS_NUM/MINUS_DEN) for an "
        "interaction). Prints n, the mean of seedwise relative effects (percent, or "
        "percentage points for an interaction), 100(exp(mean d) - 1), its paired-t interval in "
        "log space (df = n - 1) and the exact two-sided sign-flip p over all 2^n sign "
        "assignments. Every arm must hold the same seeds.")
    c.add_argument("file", metavar="FILE|CAMPAIGN",
                   help="long-format CSV or Parquet (.parquet/.pq) with columns seed,arm,value; "
                   "or a campaign's --out folder (its runs.parquet) with --metric")
    c.add_argument("--metric", default=None, metavar="COLUMN",
                   help="read a campaign: the runs.parquet column to compare (throughput_tok_s, "
                   "e2e_p99, ...); each ARM is then an organization (S2) or grid settings "
                   "(org=S2,budget=b63) selecting one cell per seed")
    c.add_argument("--num", required=True, metavar="ARM", help="numerator arm")
    c.add_argument("--den", required=True, metavar="ARM", help="denominator arm")
    c.add_argument("--minus-num", metavar="ARM",
                   help="numerator of the contrast subtracted in log space (interaction)")
    c.add_argument("--minus-den", metavar="ARM",
                   help="denominator of the contrast subtracted in log space (interaction)")
    c.add_argument("--level", type=level_arg(), default=0.95,
                   help="two-sided confidence level of the paired-t interval (default 0.95)")
    c.add_argument("--test-scale", choices=TEST_SCALES, default="log",
                   help="scale of the sign-flip test: 'log' ratios (the 22-test extension family, "
                   "default) or 'relative' percentages 100(num/den - 1), the original five "
                   "comparisons (App. B.5; log ratios are their sensitivity)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=run_contrast)

    t = verbs.add_parser(
        "two-look", help="sequential p of a contrast looked at twice: min(1, 2 min(p6, p9))",
        description="The two-look rule of the original five comparisons (App. B.5, eq. B1): "
        "p_seq = min(1, 2 min(p6, p9)); give '-' for a look not taken (it counts p = 1).")
    t.add_argument("p6", type=_maybe_p, metavar="P6", help="p at the first look, or '-'")
    t.add_argument("p9", type=_maybe_p, metavar="P9", help="p at the second look, or '-'")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=run_two_look)

    h = verbs.add_parser("holm", help="Holm step-down adjusted p-values of one family",
                         description="Holm-adjusted p-values, in the order given.")
    h.add_argument("pvalues", nargs="+", type=real(0, 1), metavar="P",
                   help="raw p-values in [0, 1]")
    h.add_argument("--json", action="store_true", help="print one JSON object")
    h.set_defaults(func=run_holm)


def _maybe_p(text: str) -> float | None:
    return None if text.strip() in ("-", "none") else real(0, 1)(text)


def run_two_look(args: argparse.Namespace) -> int:
    p = two_look(args.p6, args.p9)
    if args.json:
        print_json({"p6": args.p6, "p9": args.p9, "p_seq": p})
    else:
        show = ["-" if v is None else f"{v:.8g}" for v in (args.p6, args.p9)]
        print(f"p_seq = min(1, 2 min(p6 = {show[0]}, p9 = {show[1]})) = {p:.8g}")
    return 0


def run(args: argparse.Namespace) -> int:
    return int(args.func(args))


def _name(args: argparse.Namespace) -> str:
    base = f"{args.num} / {args.den}"
    if args.minus_num is not None:
        base = f"({base}) / ({args.minus_num} / {args.minus_den})"
    return base if args.metric is None else f"{base} of {args.metric}"


def format_contrast(name: str, r: PairedContrast, interaction: bool) -> str:
    unit = "pp" if interaction else "%"
    pct = round(100 * r.level, 6)
    rows = [
        ("mean of seedwise relative effects", f"{r.mean_relative_pct:+.4f} {unit}"),
        ("effect 100(exp(mean d) - 1)", f"{r.effect_pct:+.4f} %"),
        (f"{pct:g}% paired-t interval (df {r.n - 1})",
         f"[{r.ci_pct[0]:+.4f}, {r.ci_pct[1]:+.4f}] %"),
        (f"exact sign-flip p, {r.test_scale} scale (2^{r.n})", f"{r.sign_flip_p:.8g}"),
    ]
    return "\n".join([f"contrast {name}: n = {r.n} paired seeds"]
                     + [f"  {label:<44}{value}" for label, value in rows])


def run_contrast(args: argparse.Namespace) -> int:
    level = check_level(args.level)
    if (args.minus_num is None) != (args.minus_den is None):
        raise StatsError("--minus-num and --minus-den must be given together")
    table = _campaign_arms(args) if _is_campaign(args) else load_long(args.file)
    interaction = args.minus_num is not None
    result = contrast(
        arm(table, args.num), arm(table, args.den),
        minus_num=arm(table, args.minus_num) if interaction else None,
        minus_den=arm(table, args.minus_den) if interaction else None,
        level=level, test_scale=args.test_scale,
    )
    if args.json:
        print_json({"contrast": _name(args), **result.as_dict()})
    else:
        print(format_contrast(_name(args), result, interaction))
    return 0


def _is_campaign(args: argparse.Namespace) -> bool:
    from pathlib import Path

    if Path(args.file).is_dir() and args.metric is None:
        raise StatsError(f"{args.file!r} is a folder: a campaign needs --metric COLUMN")
    return args.metric is not None


def _campaign_arms(args: argparse.Namespace) -> dict[str, dict[int, float]]:
    """The named arms of a campaign's runs table, in the long table's shape."""
    from pathlib import Path

    from hybridmem.sim.campaign_stats import arm_values, campaign_runs

    _, rows = campaign_runs(Path(args.file))
    names = [a for a in (args.num, args.den, args.minus_num, args.minus_den) if a is not None]
    return {a: arm_values(rows, args.metric, a) for a in dict.fromkeys(names)}


def run_holm(args: argparse.Namespace) -> int:
    adjusted = holm(args.pvalues)
    if args.json:
        print_json({"p": list(args.pvalues), "holm_p": adjusted})
    else:
        print(f"Holm adjustment over a family of {len(adjusted)} test(s)")
        for raw, adj in zip(args.pvalues, adjusted, strict=True):
            print(f"  p = {raw:<12.8g} holm p = {adj:.8f}")
    return 0

"""``hybridmem plan``: a budget turned into each organization's integer units.

A budget is per layer (a label bN, bytes or a size) or a whole-cache total (``--total``, the
number vLLM's ``--kv-cache-memory-bytes`` takes); :mod:`hybridmem.budget` says how a total is
split per layer and how whole-model bytes count attention and Mamba layers.
"""

from __future__ import annotations

import argparse
import textwrap

from hybridmem.budget import Plan, parse_budget, parse_total, plan_budget
from hybridmem.cli import models
from hybridmem.cli.common import (
    TOTAL_HELP,
    add_model_args,
    attention_fraction,
    model_units,
    print_json,
)
from hybridmem.errors import HybridMemError

HELP = "integer allocation of a budget under S0, S1, S2 and D0 (App. B.3)"
ORGS = ("S0", "S1", "S2", "D0")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=HELP + ".\n\n" + textwrap.fill(
            "Unit counts and 'bytes' are per layer; 'whole model' counts a shared pool "
            "(S0/S1/S2) in every layer holding state, D0's attention pool in the attention "
            "layers and its recurrent pool in the Mamba layers.", 79)
        + "\n\nModels:\n" + (models.__doc__ or "").split("\n\n")[1])
    add_model_args(p)
    b = p.add_mutually_exclusive_group(required=True)
    b.add_argument("--budget", metavar="BUDGET",
                   help="per-layer budget: label bN (N uniform units), a byte count, or a size "
                   "such as 96MiB")
    b.add_argument("--total", metavar="SIZE", help=TOTAL_HELP)
    p.add_argument("--attention-fraction", type=attention_fraction(),
                   default=None, metavar="F",
                   help="D0's per-layer attention share in [0.001, 0.999]; defaults to the model "
                   "preset's")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def format_plans(plans: list[Plan]) -> str:
    """Side-by-side table of one or more plans of the same model."""
    head = ["organization / unit (per layer)"] + [p.budget.label for p in plans]
    rows: list[list[str]] = [["nominal bytes"] + [f"{p.budget.nominal_bytes:,} B" for p in plans]]
    for name in ("S0", "S1", "S2"):
        rows.append([f"{name} pages"] + [f"{p.org(name).pages:,}" for p in plans])  # type: ignore[union-attr]
        rows.append([f"{name} bytes"] + [f"{p.org(name).bytes:,} B" for p in plans])  # type: ignore[union-attr]
    if all(p.d0 is not None for p in plans):
        d0s = [p.d0 for p in plans if p.d0 is not None]
        rows.append(["D0 attention units (16 tok)"] + [f"{d.attention_units:,}" for d in d0s])
        rows.append(["D0 attention bytes"] + [f"{d.attention_bytes:,} B" for d in d0s])
        rows.append(["D0 recurrent composites"] + [f"{d.recurrent_units:,}" for d in d0s])
        rows.append(["D0 recurrent bytes"] + [f"{d.recurrent_bytes:,} B" for d in d0s])
        rows.append(["D0 bytes"] + [f"{d.bytes:,} B" for d in d0s])
    names = [n for n in ORGS if all(p.org(n) is not None for p in plans)]
    for name in names:
        rows.append([f"{name} whole-model bytes"] + [_mib(p.model_bytes(name)) for p in plans])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in [head, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    u = plans[0].units
    geo = u.geometry
    notes = [
        f"model {geo.model} ({geo.layout}): {geo.layers} layers, {geo.n_attention_layers} with "
        f"attention KV, {geo.n_mamba_layers} with Mamba state, {geo.n_state_layers} with any; "
        f"grid {u.grid_tokens} tokens",
        f"units: S0 page {u.s0_page_bytes:,} B, S1/S2 page {u.page_bytes:,} B, "
        f"D0 {u.d0_attn_unit_bytes:,} B attention / {u.d0_recurrent_unit_bytes:,} B recurrent",
        f"whole model: S0/S1/S2 bytes x {geo.n_state_layers} layers; D0 attention bytes x "
        f"{geo.n_attention_layers} + recurrent bytes x {geo.n_mamba_layers}",
    ]
    totals = [p for p in plans if p.budget.total_bytes is not None]
    for p in totals:
        notes.append(f"{p.budget.label}: {p.budget.total_bytes:,} B whole cache, split "
                     f"{p.budget.nominal_bytes:,} B per state-holding layer for S0/S1/S2 "
                     "(rounded down to whole pages); D0 per layer B = T / (f x attention "
                     "layers + (1 - f) x Mamba layers)")
    if plans[0].d0 is not None:
        notes.append(f"D0 attention fraction {plans[0].d0.attention_fraction} (per layer)")
    else:
        notes.append("D0 omitted: no attention fraction for this model (--attention-fraction)")
    return "\n".join(lines + [""] + notes)


def run(args: argparse.Namespace) -> int:
    _, units = model_units(args)
    if args.total is not None:
        budget = parse_total(args.total, units)
    else:
        budget = parse_budget(args.budget, units)
    plan = plan_budget(units, budget, args.attention_fraction).check_holds()
    if plan.budget.total_bytes is not None:
        over = [n for n in ORGS if plan.org(n) is not None
                and plan.model_bytes(n) > plan.budget.total_bytes]
        if over:  # an internal error: the split rounds down
            raise HybridMemError(f"internal error: {over} exceed the total; this is a bug")
    if args.json:
        print_json(plan.as_dict())
    else:
        print(format_plans([plan]))
    return 0

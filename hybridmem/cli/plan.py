"""``hybridmem plan``: a nominal budget turned into each organization's integer units."""

from __future__ import annotations

import argparse

from hybridmem.budget import Plan, parse_budget, plan_budget
from hybridmem.cli.common import add_model_args, model_units, print_json, real

HELP = "integer allocation of a nominal budget under S0, S1, S2 and D0 (App. B.3)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help=HELP, description=HELP + ". Byte counts are per layer; "
                       "model_bytes multiplies by the layer count.")
    add_model_args(p)
    p.add_argument("--budget", required=True, metavar="BUDGET",
                   help="label bN (N x uniform unit), a byte count, or a size such as 96MiB")
    p.add_argument("--attention-fraction", type=real(0, 1, lo_open=True, hi_open=True),
                   default=None, metavar="F",
                   help="D0 attention share in (0,1); defaults to the model preset's")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def format_plans(plans: list[Plan]) -> str:
    """Side-by-side table of one or more plans of the same model."""
    head = ["organization / unit"] + [p.budget.label for p in plans]
    rows: list[list[str]] = [["nominal bytes"] + [f"{p.budget.nominal_bytes:,}" for p in plans]]
    for name in ("S0", "S1", "S2"):
        rows.append([f"{name} pages"] + [f"{p.org(name).pages:,}" for p in plans])  # type: ignore[union-attr]
        rows.append([f"{name} bytes"] + [f"{p.org(name).bytes:,}" for p in plans])  # type: ignore[union-attr]
    if all(p.d0 is not None for p in plans):
        d0s = [p.d0 for p in plans if p.d0 is not None]
        rows.append(["D0 attention units (16 tok)"] + [f"{d.attention_units:,}" for d in d0s])
        rows.append(["D0 attention bytes"] + [f"{d.attention_bytes:,}" for d in d0s])
        rows.append(["D0 recurrent composites"] + [f"{d.recurrent_units:,}" for d in d0s])
        rows.append(["D0 recurrent bytes"] + [f"{d.recurrent_bytes:,}" for d in d0s])
        rows.append(["D0 bytes"] + [f"{d.bytes:,}" for d in d0s])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in [head, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    u = plans[0].units
    geo = u.geometry
    notes = [
        f"model {geo.model}: per layer, x{geo.layers} layers for the whole model; "
        f"S0 page {u.s0_page_bytes:,} B, S1/S2 page {u.page_bytes:,} B, "
        f"D0 units {u.d0_attn_unit_bytes:,} B / {u.d0_recurrent_unit_bytes:,} B",
    ]
    if plans[0].d0 is not None:
        notes.append(f"D0 attention fraction {plans[0].d0.attention_fraction}")
    else:
        notes.append("D0 omitted: no attention fraction for this model (--attention-fraction)")
    return "\n".join(lines + [""] + notes)


def run(args: argparse.Namespace) -> int:
    _, units = model_units(args)
    plan = plan_budget(units, parse_budget(args.budget, units), args.attention_fraction)
    if args.json:
        print_json(plan.as_dict())
    else:
        print(format_plans([plan]))
    return 0

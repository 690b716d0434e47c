"""``hybridmem demo``: the main job of ``make demo``.

For now it prints the Falcon-H1-7B plan at b63, b83 and b108 side by side (Table B-2) and the
storage example of Table A-1. Later work grows it into a traced serving run.
"""

from __future__ import annotations

import argparse

from hybridmem.budget import parse_budget, plan_budget
from hybridmem.cli.plan import format_plans
from hybridmem.cli.storage import format_storage
from hybridmem.geometry import load_geometry
from hybridmem.units import derive_units

HELP = "print the Falcon-H1-7B budget plans (b63, b83, b108) and storage examples"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help=HELP, description=HELP)
    p.add_argument("--model", default="falcon-h1-7b", metavar="MODEL")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    units = derive_units(load_geometry(args.model))
    plans = [plan_budget(units, parse_budget(b, units)) for b in ("b63", "b83", "b108")]
    print("== Budget plans (paper Table B-2) ==")
    print(format_plans(plans))
    print()
    print("== Storage of example state sets (paper Table A-1) ==")
    for xa, xr in ((1, 1), (16, 16), (4, 16), (0, 16)):
        print(format_storage(units, xa, xr, None))
    return 0

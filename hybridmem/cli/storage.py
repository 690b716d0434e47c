"""``hybridmem storage``: bytes of a logical state mix, or ideal capacity of a budget (App. A)."""

from __future__ import annotations

import argparse
from math import floor
from typing import Any

from hybridmem.budget import check_fraction, parse_size
from hybridmem.cli.common import add_model_args, count, model_units, print_json
from hybridmem.errors import HybridMemError
from hybridmem.storage_cost import (
    SHARED_ORGS,
    bytes_d0_pools,
    bytes_s0,
    bytes_s1,
    bytes_s2,
    capacity_d0,
    capacity_shared,
    d0_attention_units,
    ideal_slabs,
    model_bytes,
)
from hybridmem.units import Units

MAX_OBJECTS = 1 << 40  # objects or slabs: far past any budget, small enough for exact bytes

HELP = "storage of a state mix under each organization, or ideal capacity of a budget"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "storage", help=HELP,
        description=HELP + ". Give --attention/--recurrent for bytes (per layer, and for the "
        "whole model: attention objects on every attention layer, checkpoints on every Mamba "
        "layer), or --capacity/--mix for eq. (A8)/(D2) capacities of a per-layer budget.",
    )
    add_model_args(p)
    p.add_argument("--attention", type=count(0, MAX_OBJECTS), metavar="XA",
                   help="512-token attention objects (D0 covers the same tokens in 16-token units)")
    p.add_argument("--recurrent", type=count(0, MAX_OBJECTS), metavar="XR",
                   help="recurrent checkpoints")
    p.add_argument("--slabs", type=count(0, MAX_OBJECTS), metavar="M",
                   help="S2 slabs allocated (default: ideal ceil(XR / slots per slab))")
    p.add_argument("--capacity", metavar="SIZE", help="budget for ideal capacity, e.g. 100MiB")
    p.add_argument("--mix", metavar="A,R", help="one mix unit: A attention objects, R checkpoints")
    p.add_argument("--d0-pools", metavar="MA,MR",
                   help="D0 attention and recurrent pool sizes for --capacity (default: split "
                   "SIZE by the model's attention fraction)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def storage_dict(units: Units, xa: int, xr: int, slabs: int | None) -> dict[str, Any]:
    m = ideal_slabs(units, xr) if slabs is None else slabs
    a16 = d0_attention_units(units, xa)
    d0_a, d0_r = bytes_d0_pools(units, a16, xr)
    geo = units.geometry
    orgs: dict[str, dict[str, int]] = {
        "S0": {"bytes": bytes_s0(units, xa, xr)},
        "S1": {"bytes": bytes_s1(units, xa, xr)},
        "S2": {"bytes": bytes_s2(units, xa, xr, m), "slabs": m},
        "D0": {"bytes": d0_a + d0_r, "attention_units": a16, "attention_bytes": d0_a,
               "recurrent_bytes": d0_r},
    }
    for org, v in orgs.items():
        v["model_bytes"] = model_bytes(org, units, xa, xr, m if org == "S2" else None)
    return {"attention": xa, "recurrent": xr, "slabs": m,
            "attention_layers": geo.n_attention_layers, "mamba_layers": geo.n_mamba_layers,
            "orgs": orgs}


def format_storage(units: Units, xa: int, xr: int, slabs: int | None) -> str:
    d = storage_dict(units, xa, xr, slabs)
    parts = [f"{org} {v['bytes'] / 2**20:.6f} MiB" for org, v in d["orgs"].items()]
    return (f"xA={xa:<3} xR={xr:<3} slabs={d['slabs']:<2} " + "  ".join(parts))


def _pair(text: str, flag: str, parse: Any) -> tuple[Any, Any]:
    bits = str(text).split(",")
    if len(bits) != 2:
        raise HybridMemError(f"{flag} expects two comma-separated values, got {text!r}")
    try:
        return parse(bits[0]), parse(bits[1])
    except ValueError as exc:
        raise HybridMemError(f"bad {flag} {text!r}: {exc}") from None


def _count(text: str) -> int:
    raw = text.strip()
    if len(raw) > 15 or not raw.isdigit():
        raise ValueError(f"{raw[:20]!r} is not a count in [0, {MAX_OBJECTS:,}]")
    value = int(raw)
    if value > MAX_OBJECTS:
        raise ValueError(f"{value:,} is over {MAX_OBJECTS:,}")
    return value


def capacity_dict(units: Units, budget: int, mix: tuple[int, int],
                  d0_pools: tuple[int, int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "budget_bytes": budget, "mix": list(mix),
        "capacity": {org: capacity_shared(org, units, budget, mix) for org in SHARED_ORGS},
    }
    if d0_pools is None and units.geometry.attention_fraction is not None:
        f = check_fraction(units.geometry.attention_fraction)
        ma = floor(f * budget)
        d0_pools = (ma, budget - ma)
    if d0_pools is not None:
        out["capacity"]["D0"] = capacity_d0(units, d0_pools[0], d0_pools[1], mix)
        out["d0_pools"] = {"attention_bytes": d0_pools[0], "recurrent_bytes": d0_pools[1]}
    return out


def run(args: argparse.Namespace) -> int:
    _, units = model_units(args)
    if args.capacity is not None:
        if args.mix is None:
            raise HybridMemError("--capacity needs --mix A,R")
        if args.attention is not None or args.recurrent is not None:
            raise HybridMemError("give either --attention/--recurrent or --capacity/--mix")
        mix = _pair(args.mix, "--mix", _count)
        pools = _pair(args.d0_pools, "--d0-pools", parse_size) if args.d0_pools else None
        out = capacity_dict(units, parse_size(args.capacity), mix, pools)
        if args.json:
            print_json(out)
        else:
            caps = "  ".join(f"{k} {v}" for k, v in out["capacity"].items())
            print(f"ideal capacity of {out['budget_bytes']:,} B in mix units {tuple(mix)}: {caps}")
        return 0
    if args.attention is None or args.recurrent is None:
        raise HybridMemError("give --attention XA and --recurrent XR (or --capacity and --mix)")
    for flag, v in (("--attention", args.attention), ("--recurrent", args.recurrent),
                    ("--slabs", args.slabs)):
        if v is not None and v < 0:
            raise HybridMemError(f"{flag} must be >= 0, got {v}")
    if args.json:
        print_json(storage_dict(units, args.attention, args.recurrent, args.slabs))
    else:
        d = storage_dict(units, args.attention, args.recurrent, args.slabs)
        print(f"{'org':<4}{'per layer':>31}  {'whole model':>16}")
        for org, v in d["orgs"].items():
            print(f"{org:<4}{v['bytes']:>14,} B {v['bytes'] / 2**20:>10.6f} MiB  "
                  f"{v['model_bytes'] / 2**20:>12.2f} MiB")
        geo = units.geometry
        print(f"whole model: attention objects x {geo.n_attention_layers} attention layers, "
              f"checkpoints (and S2 slabs) x {geo.n_mamba_layers} Mamba layers "
              f"({geo.model}, {geo.layout})")
    return 0

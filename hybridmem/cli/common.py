"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hybridmem.geometry import PRESETS, Geometry, load_geometry
from hybridmem.units import Units, derive_units


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, metavar="MODEL",
        help=f"preset ({', '.join(sorted(PRESETS))}), a config.json, or a model directory",
    )
    p.add_argument(
        "--ssm-dtype", default=None, metavar="DTYPE",
        help="dtype of the SSM state if it differs from the model dtype (e.g. float32)",
    )


def model_units(args: argparse.Namespace) -> tuple[Geometry, Units]:
    geo = load_geometry(args.model, ssm_dtype=args.ssm_dtype)
    return geo, derive_units(geo)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False))


def fmt_bytes(n: int) -> str:
    """``101,154,816 B (96.47 MiB)``."""
    return f"{n:,} B ({n / 2**20:.2f} MiB)"

"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from hybridmem.cli import models
from hybridmem.geometry import Geometry
from hybridmem.units import Units


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="MODEL", help=models.help_text())
    p.add_argument(
        "--ssm-dtype", default=None, metavar="DTYPE",
        help="dtype of the SSM state if it differs from the model dtype (e.g. float32)",
    )


def model_units(args: argparse.Namespace) -> tuple[Geometry, Units]:
    units = models.units(args.model, ssm_dtype=args.ssm_dtype)
    return units.geometry, units


TOTAL_HELP = ("whole-cache bytes, all layers together, e.g. 12GiB (as vLLM's "
              "--kv-cache-memory-bytes); split per layer so no organization exceeds it")


def total_label(args: argparse.Namespace) -> None:
    """``--total SIZE`` as the budget text ``total SIZE`` in ``args.budget`` (read back by
    :func:`hybridmem.budget.parse_budget`, so a run checks a total where it checks a budget)."""
    if getattr(args, "total", None) is not None:
        from hybridmem.budget import TOTAL_PREFIX

        args.budget = TOTAL_PREFIX + str(args.total).strip()


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False))


def fmt_bytes(n: int) -> str:
    """``101,154,816 B (96.47 MiB)``."""
    return f"{n:,} B ({n / 2**20:.2f} MiB)"


# ---- argument types: type, range, finiteness and size are checked while parsing, so a bad value
# fails (one line, exit 2) before any work or heavy import starts.

MAX_DIGITS = 30  # no count or seed this tool takes needs more digits; longer input is refused
SEED_MAX = 2**32 - 1  # numpy / vLLM seeds are 32-bit unsigned
# Serving-run limits: past these a run grows without bound in memory (1e9 requests built a
# multi-GB workload in seconds) or fails deep inside vLLM after the engine started.
MAX_REQUESTS = 100_000
MAX_CAP = 4096  # vLLM max_num_seqs
MAX_MODEL_LEN = 1 << 20
MAX_KV_BLOCKS = 1 << 16  # 8M tokens at 128 per block


def count(lo: int = 0, hi: int = 2**63 - 1) -> Any:
    """argparse type: an integer in ``[lo, hi]`` (``1e3`` style and 5,000-digit input refused)."""

    def parse(text: str) -> int:
        raw = str(text).strip()
        if len(raw) > MAX_DIGITS:
            raise argparse.ArgumentTypeError(f"{raw[:20]}... ({len(raw)} characters) is not an "
                                             f"integer in [{lo:,}, {hi:,}]")
        try:
            value = int(raw, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo:,}, {hi:,}]")
        return value

    parse.__name__ = "integer"
    return parse


def real(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
         hi_open: bool = False) -> Any:
    """argparse type: a finite float in the interval (open ends where asked)."""

    def parse(text: str) -> float:
        raw = str(text).strip()
        if len(raw) > 64:
            raise argparse.ArgumentTypeError(f"{raw[:20]}... ({len(raw)} characters) is not a "
                                             "number")
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{raw!r} is not finite")
        if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
            left, right = "(" if lo_open else "[", ")" if hi_open else "]"
            raise argparse.ArgumentTypeError(f"{value:g} is outside {left}{lo:g}, {hi:g}{right}")
        return value

    parse.__name__ = "number"
    return parse


# a confidence level below 0.5 or above 0.9999 is a typo (95 for 0.95, 1e-320), not a design
LEVEL_RANGE = (0.5, 0.9999)


def level() -> Any:
    """argparse type: a two-sided confidence level in :data:`LEVEL_RANGE`."""
    return real(*LEVEL_RANGE)


def attention_fraction() -> Any:
    """argparse type: D0's attention share in ``geometry.ATTENTION_FRACTION_RANGE``."""
    from hybridmem.geometry import ATTENTION_FRACTION_RANGE

    return real(*ATTENTION_FRACTION_RANGE)


def seed() -> Any:
    """argparse type: a seed in ``[0, 2**32 - 1]``."""
    return count(0, SEED_MAX)


def out_path(suffixes: tuple[str, ...] = ()) -> Any:
    """argparse type: a non-empty output path, ending in one of ``suffixes`` when given."""

    def parse(text: str) -> str:
        raw = str(text)
        if not raw.strip():
            raise argparse.ArgumentTypeError("an empty path")
        if "\x00" in raw:
            raise argparse.ArgumentTypeError(f"{raw!r} contains a NUL byte")
        if suffixes and not raw.lower().endswith(suffixes):
            raise argparse.ArgumentTypeError(f"{raw!r} must end in {' or '.join(suffixes)}")
        return raw

    parse.__name__ = "path"
    return parse


def path_arg() -> Any:
    """argparse type: a non-empty path as a :class:`~pathlib.Path` (``Path("")`` would be the
    working directory, silently)."""
    check = out_path()

    def parse(text: str) -> Path:
        return Path(check(text))

    parse.__name__ = "path"
    return parse


def in_path() -> Any:
    """argparse type: a non-empty input path."""
    return out_path()

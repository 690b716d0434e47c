"""Run the paper's nine questions (campaigns/q*.toml) as one suite and time it, end to end.

    python benchmarks/nine_questions.py --out out/nine --workers 2 [--only q4 q3 ...]

Cells are content-addressed (``CampaignSpec.cell_id`` hashes every setting), and several
questions share cells: Q4 is Q1 plus D0 (the paper's Q4 reuses Q1's runs), Q3's q = 1 cells are
Q4's b83 cells, Q2's q = 0 control is Q3's q = 0 cells. Before each campaign starts, every cell it
needs that an earlier campaign of the suite finished is hard-linked into its directory, so
``hybridmem campaign`` skips it (it never reruns a cell whose ``summary.json`` exists). Then
``hybridmem campaign report`` over all of them. Prints the wall time per campaign and in all.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ORDER = ("q4_budget", "q3_sharing", "q2_recorded_work", "q1_exp1a", "q1_exp1b_lowload",
         "q5_load", "q6_headroom", "q7_joint_reuse", "q8_retention", "q9_retention_confirm")


def _link_known_cells(spec_path: Path, dest: Path, done: list[Path]) -> int:
    from hybridmem.sim.campaign_spec import load_spec

    spec = load_spec(spec_path)
    linked = 0
    for cell in spec.cells:
        cid = spec.cell_id(cell)
        target = dest / "cells" / cid
        if (target / "summary.json").exists():
            continue
        for prev in done:
            src = prev / "cells" / cid
            if (src / "summary.json").exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-al", str(src), str(target)], check=True)
                linked += 1
                break
    return linked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="spec names (default: all, in order)")
    ap.add_argument("--campaigns", type=Path, default=Path("campaigns"))
    args = ap.parse_args()
    names = [n for n in ORDER if args.only is None or n in args.only]
    exe = Path(sys.executable).with_name("hybridmem")
    done: list[Path] = [args.out / n for n in ORDER if (args.out / n / "cells").exists()]
    t_all = time.monotonic()
    for name in names:
        dest = args.out / name
        linked = _link_known_cells(args.campaigns / f"{name}.toml", dest, done)
        t0 = time.monotonic()
        rc = subprocess.run([str(exe), "campaign", str(args.campaigns / f"{name}.toml"),
                             "--out", str(dest), "--workers", str(args.workers)],
                            env=os.environ).returncode
        print(f"[nine] {name}: rc {rc}, {linked} cells shared, "
              f"{time.monotonic() - t0:,.0f} s wall", flush=True)
        done.append(dest)
    dirs = [str(args.out / n) for n in ORDER if (args.out / n / "campaign.json").exists()]
    subprocess.run([str(exe), "campaign", "report", *dirs, "--out",
                    str(args.out / "report.md"), "--html", str(args.out / "report.html")],
                   check=False)
    print(f"[nine] suite: {time.monotonic() - t_all:,.0f} s wall, {args.workers} workers",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

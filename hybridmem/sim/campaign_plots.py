"""Figures of a campaign in the paper's style (matplotlib, Agg).

* ``fig2_<group>.png``: throughput (a) and mean p99 E2E (b) per budget, one bar per
  organization (arithmetic mean over seeds, seeds as dots), like Fig. 2; one file per group of
  the remaining factors (rate, cap, share, headroom, ...).
* ``fig5_load.png``: throughput versus offered load per organization and budget and, when D0
  and S2 both ran, the seed-paired D0/S2 gap in % versus load, like Fig. 5.
* ``fig6_headroom.png``: throughput versus headroom f per organization and budget, like Fig. 6.

A figure is written only when the grid varies its x factor (more than one budget, rate or f).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ORG_ORDER = ("S0", "S1", "S2", "D0", "vllm")
COLORS = {"S0": "#9e9e9e", "S1": "#64b5f6", "S2": "#1565c0", "D0": "#e65100", "vllm": "#2e7d32"}


def _budget_key(b: str) -> tuple[int, str]:
    return (int(b[1:]) if b[1:].isdigit() else 10**9, b)


def _orgs(rows: list[dict[str, Any]]) -> list[str]:
    present = {r["org"] for r in rows}
    return [o for o in ORG_ORDER if o in present]


def plot_all(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["rate"], r["cap"], r["share"], r["headroom"], r["pin_k"], r["retention"],
                r["isolate"])].append(r)
    for key, grp in groups.items():
        if len({r["budget"] for r in grp}) > 1 or len({r["org"] for r in grp}) > 1:
            written.append(_fig2(grp, key, out))
    if len({r["rate"] for r in rows}) > 1:
        written.append(_fig_x(rows, "rate", "offered load (req/s)", out / "fig5_load.png"))
    if len({r["headroom"] for r in rows}) > 1:
        written.append(_fig_x(rows, "headroom", "headroom f", out / "fig6_headroom.png"))
    return written


def _fig2(rows: list[dict[str, Any]], key: tuple[Any, ...], out: Path) -> Path:
    import matplotlib.pyplot as plt

    budgets = sorted({r["budget"] for r in rows}, key=_budget_key)
    orgs = _orgs(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / max(1, len(orgs))
    for ax, metric, label in ((axes[0], "throughput_tok_s", "output tokens/s"),
                              (axes[1], "e2e_p99", "seconds")):
        for j, org in enumerate(orgs):
            for i, b in enumerate(budgets):
                vals = [r[metric] for r in rows if r["org"] == org and r["budget"] == b
                        and r[metric] == r[metric]]
                if not vals:
                    continue
                x = i + (j - (len(orgs) - 1) / 2) * width
                ax.bar(x, float(np.mean(vals)), width * 0.9, color=COLORS[org],
                       label=org if i == 0 else None)
                ax.plot([x] * len(vals), vals, "k.", ms=3)
        ax.set_xticks(range(len(budgets)), budgets)
        ax.set_ylabel(label)
    axes[0].set_title("(a) Throughput")
    axes[1].set_title("(b) E2E p99")
    axes[0].legend(frameon=False, ncol=len(orgs))
    rate, cap, share, head, pin, ret, iso = key
    fig.suptitle(f"simulated: {rate:g} req/s, cap {cap}, q = {share:g}, f = {head:g}"
                 + (f", K = {pin}" if pin >= 0 else "") + (", retention" if ret else "")
                 + (", isolate" if iso else ""), fontsize=9)
    fig.tight_layout()
    name = f"fig2_r{rate:g}_c{cap}_q{share:g}_f{head:g}_k{pin}{'_ret' if ret else ''}" \
           f"{'_iso' if iso else ''}.png"
    path = out / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fig_x(rows: list[dict[str, Any]], axis: str, xlabel: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    budgets = sorted({r["budget"] for r in rows}, key=_budget_key)
    orgs = _orgs(rows)
    gap = "D0" in orgs and "S2" in orgs
    fig, axes = plt.subplots(2 if gap else 1, len(budgets), figsize=(4 * len(budgets),
                             6 if gap else 3.2), squeeze=False)
    for i, b in enumerate(budgets):
        ax = axes[0][i]
        for org in orgs:
            xs = sorted({r[axis] for r in rows if r["org"] == org and r["budget"] == b})
            ys = [np.mean([r["throughput_tok_s"] for r in rows if r["org"] == org
                           and r["budget"] == b and r[axis] == x]) for x in xs]
            ax.plot(xs, ys, "o-", color=COLORS[org], label=org)
        ax.set_title(f"{b}: throughput")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output tokens/s")
        ax.legend(frameon=False)
        if gap:
            ax2 = axes[1][i]
            xs = sorted({r[axis] for r in rows if r["budget"] == b})
            means = []
            for x in xs:
                d0 = {r["seed"]: r["throughput_tok_s"] for r in rows if r["org"] == "D0"
                      and r["budget"] == b and r[axis] == x}
                s2 = {r["seed"]: r["throughput_tok_s"] for r in rows if r["org"] == "S2"
                      and r["budget"] == b and r[axis] == x}
                common = sorted(set(d0) & set(s2))
                means.append(np.mean([100 * (d0[s] / s2[s] - 1) for s in common])
                             if common else np.nan)
            ax2.axhline(0, color="k", lw=0.5)
            ax2.plot(xs, means, "o-", color=COLORS["D0"])
            ax2.set_title(f"{b}: D0/S2 gap (seed-paired)")
            ax2.set_xlabel(xlabel)
            ax2.set_ylabel("%")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

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


def plot_all(rows: list[dict[str, Any]], out: Path, condition: str = "",
             kinds: tuple[str, ...] = ("fig2", "fig5", "fig6")) -> list[Path]:
    """Figures 2, 5 and 6 of one campaign (those of ``kinds``); ``condition`` (what produced
    the runs: simulated, device preset, calibration, seeds, budgets) titles every figure."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["rate"], r["cap"], r["share"], r["headroom"], r["pin_k"], r["retention"],
                r["isolate"])].append(r)
    for key, grp in groups.items():
        if "fig2" in kinds and (len({r["budget"] for r in grp}) > 1
                                or len({r["org"] for r in grp}) > 1):
            written.append(_fig2(grp, key, out, condition))
    if "fig5" in kinds and len({r["rate"] for r in rows}) > 1:
        written.append(_fig_x(rows, "rate", "offered load (req/s)", out / "fig5_load.png",
                              condition))
    if "fig6" in kinds and len({r["headroom"] for r in rows}) > 1:
        written.append(_fig_x(rows, "headroom", "headroom f", out / "fig6_headroom.png",
                              condition))
    return written


def _fig2(rows: list[dict[str, Any]], key: tuple[Any, ...], out: Path, condition: str = ""
          ) -> Path:
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
    fig.suptitle(_wrap(f"{condition or 'simulated'}; {rate:g} req/s, cap {cap}, q = {share:g}, "
                       f"f = {head:g}" + (f", K = {pin}" if pin >= 0 else "")
                       + (", retention" if ret else "") + (", isolate" if iso else "")),
                 fontsize=8)
    fig.tight_layout()
    name = f"fig2_r{rate:g}_c{cap}_q{share:g}_f{head:g}_k{pin}{'_ret' if ret else ''}" \
           f"{'_iso' if iso else ''}.png"
    path = out / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _wrap(text: str, width: int = 110) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _fig_x(rows: list[dict[str, Any]], axis: str, xlabel: str, path: Path, condition: str = ""
           ) -> Path:
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
    if condition:
        fig.suptitle(_wrap(condition), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# which of the paper's figures each question's campaign is drawn like (Figs. 2-7)
QUESTION_FIGURES = {"Q1": ("fig2",), "Q2": ("fig2",), "Q3": ("fig2",), "Q4": ("fig2",),
                    "Q5": ("fig5",), "Q6": ("fig6",), "Q7": (), "Q8": (), "Q9": ()}
VERDICT_COLORS = {"reproduces": "#2e7d32", "direction only": "#f9a825", "contradicts": "#c62828",
                  "inconclusive": "#757575", "differs": "#6a1b9a"}


def plot_report(rows: list[Any], info: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """The report's figures: each campaign's Figs. 2/5/6 (:func:`plot_all`), the paper's
    Fig. 3-style recorded work (Q2), Fig. 7-style depths (Q7, Q8) and ledger bars (Q9), and one
    paper-beside-simulation chart per question. ``rows``: campaign_report.Row."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, i in info.items():
        runs, cond, q = i["runs"], i["conditions"], i["question"]
        written += plot_all(runs, out / name, cond,
                            QUESTION_FIGURES.get(q, ("fig2", "fig5", "fig6")))
        if q == "Q2":
            written.append(_fig3(runs, out / name / "fig3_recorded_work.png", cond))
        if q in ("Q7", "Q8"):
            p = _fig7_depths(runs, out / name / "fig7_depths.png", cond, q)
            if p is not None:
                written.append(p)
        if q == "Q9":
            written.append(_fig7_ledger(runs, out / name / "fig7c_ledger.png", cond))
    q3 = [r for r in rows if r.question == "Q3" and r.figure.kind == "effect"
          and r.sim is not None and "share" in r.stratum]
    if q3:
        conds = "; ".join(sorted({info[r.campaign]["conditions"] for r in q3}))
        written.append(_fig4(q3, out / "Q3_fig4_sharing.png", conds))
    by_q: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        if r.figure.kind in ("effect", "interaction") and r.sim is not None \
                and r.figure.value is not None:
            by_q[r.question].append(r)
    for q, rs in by_q.items():
        conds = "; ".join(sorted({info[r.campaign]["conditions"] for r in rs}))
        written.append(_paper_vs_sim(rs, out / f"{q}_paper_vs_sim.png", q, conds))
    return written


def _paper_vs_sim(rows: list[Any], path: Path, q: str, condition: str) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.8))
    labels = []
    for y, r in enumerate(rows):
        st = ", ".join(f"{k}={v}" for k, v in r.stratum.items()
                       if k in r.varying or k in r.figure.where)
        labels.append(f"{r.figure.what[:48]} [{st}]" if st else r.figure.what[:60])
        color = VERDICT_COLORS.get(r.verdict, "#000000")
        if r.ci is not None:
            ax.plot(r.ci, [y, y], "-", color=color, lw=2)
        ax.plot(r.sim, y, "o", color=color, label="simulated" if y == 0 else None)
        ax.plot(r.figure.value, y, "kD", ms=5, label="paper" if y == 0 else None)
        if r.figure.interval is not None:
            ax.plot(r.figure.interval, [y - 0.15, y - 0.15], "k:", lw=1)
    ax.axvline(0, color="k", lw=0.5)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% (interactions of kind pct: percentage points)")
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    ax.set_title(_wrap(f"{q}: paper (diamond) beside {condition}", 80), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fig4(rows: list[Any], path: Path, condition: str) -> Path:
    """Like the paper's Fig. 4: mean seedwise throughput effect of each step at each sharing
    level q (bars: simulated with their interval; diamonds: the paper's)."""
    import matplotlib.pyplot as plt

    contrasts = list(dict.fromkeys(r.figure.contrast for r in rows))
    shares = sorted({float(r.stratum["share"]) for r in rows})
    fig, ax = plt.subplots(figsize=(2.5 + 1.8 * len(contrasts), 3.6))
    width = 0.8 / max(1, len(shares))
    shades = ("#bdbdbd", "#64b5f6", "#1565c0", "#0d47a1")
    for i, c in enumerate(contrasts):
        for j, q in enumerate(shares):
            hit = [r for r in rows if r.figure.contrast == c and float(r.stratum["share"]) == q]
            if not hit:
                continue
            r = hit[0]
            x = i + (j - (len(shares) - 1) / 2) * width
            ax.bar(x, r.sim, width * 0.9, color=shades[j % len(shades)],
                   label=f"q = {q:g}" if i == 0 else None)
            if r.ci is not None:
                ax.plot([x, x], r.ci, "k-", lw=1)
            ax.plot(x, r.figure.value, "kD", ms=4, label="paper" if i == 0 and j == 0
                    else None)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(range(len(contrasts)), contrasts)
    ax.set_ylabel("mean seedwise throughput effect (%)")
    ax.legend(frameon=False, fontsize=7)
    ax.set_title(_wrap(f"Q3 sharing levels; {condition}", int(13 * (2.5 + 1.8 * len(contrasts)))),
                 fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fig3(rows: list[dict[str, Any]], path: Path, condition: str) -> Path:
    """Like the paper's Fig. 3(a): recorded initial input C_once (bars) and throughput (hollow
    markers) per organization at each operating point."""
    import matplotlib.pyplot as plt

    points = sorted({(r["budget"], r["rate"], r["cap"], r["share"]) for r in rows},
                    key=lambda k: (_budget_key(k[0]), k[1]))
    orgs = _orgs(rows)
    fig, ax = plt.subplots(figsize=(3 + 2.2 * len(points), 3.6))
    ax2 = ax.twinx()
    width = 0.8 / max(1, len(orgs))
    for i, (b, rate, cap, share) in enumerate(points):
        for j, org in enumerate(orgs):
            sel = [r for r in rows if (r["budget"], r["rate"], r["cap"], r["share"]) ==
                   (b, rate, cap, share) and r["org"] == org]
            if not sel:
                continue
            x = i + (j - (len(orgs) - 1) / 2) * width
            ax.bar(x, np.mean([r.get("recorded_prompt_tokens", np.nan) for r in sel]) / 1e3,
                   width * 0.9, color=COLORS[org], label=org if i == 0 else None)
            ax2.plot(x, np.mean([r["throughput_tok_s"] for r in sel]), "o", mfc="none",
                     mec="k")
    ax.set_xticks(range(len(points)),
                  [f"{b}, {rate:g} req/s\ncap {cap}, q = {share:g}" for b, rate, cap, share
                   in points], fontsize=8)
    ax.set_ylabel("C_once (10^3 tokens/run)")
    ax2.set_ylabel("output tokens/s (hollow)")
    ax.legend(frameon=False, ncol=len(orgs), fontsize=8)
    ax.set_title(_wrap(f"recorded initial input and throughput; {condition}",
                       int(13 * (3 + 2.2 * len(points)))), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fig7_depths(rows: list[dict[str, Any]], path: Path, condition: str, q: str
                 ) -> Path | None:
    """Like the paper's Fig. 7(a,b): per seed, mean J_adopt, R_max (M1) and A_max (M1) over
    INITIAL episodes of each traced arm."""
    import matplotlib.pyplot as plt

    traced = [r for r in rows if r.get("lineage_j_adopt", np.nan) == r.get("lineage_j_adopt")
              and r.get("lineage_j_adopt") is not None]
    if not traced:
        return None
    arms = sorted({(r["org"], r["headroom"], bool(r["retention"])) for r in traced})
    seeds = sorted({int(r["seed"]) for r in traced})
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(seeds), 3.6))
    markers = {"lineage_j_adopt": "o", "lineage_r_max_m1": "^", "lineage_a_max_m1": "s"}
    for k, (org, head, ret) in enumerate(arms):
        for metric, m in markers.items():
            xs, ys = [], []
            for i, s in enumerate(seeds):
                vals = [r[metric] for r in traced if r["org"] == org and r["headroom"] == head
                        and bool(r["retention"]) == ret and int(r["seed"]) == s]
                if vals:
                    xs.append(i + (k - (len(arms) - 1) / 2) * 0.18)
                    ys.append(float(np.mean(vals)))
            label = f"{org}{'+Ret' if ret else ''} f={head:g} {metric[8:]}"
            ax.plot(xs, ys, m, color=COLORS.get(org, "k"), mfc="none" if not ret and head == 0
                    else COLORS.get(org, "k"), label=label, ls="")
    ax.set_xticks(range(len(seeds)), [str(s) for s in seeds])
    ax.set_xlabel("seed")
    ax.set_ylabel("tokens/request (INITIAL episodes)")
    ax.legend(frameon=False, fontsize=6, ncol=2)
    ax.set_title(_wrap(f"{q} state availability (lineage over the simulated trace); "
                       f"{condition}", int(13 * (2.2 + 1.6 * len(seeds)))), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fig7_ledger(rows: list[dict[str, Any]], path: Path, condition: str) -> Path:
    """Like the paper's Fig. 7(c): geometric-mean ledger throughput per policy and reuse mode,
    seeds as dots."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    for i, iso in enumerate((True, False)):
        for j, ret in enumerate((False, True)):
            vals = [r["throughput_ledger_tok_s"] for r in rows if bool(r["isolate"]) == iso
                    and bool(r["retention"]) == ret and r["throughput_ledger_tok_s"] > 0]
            if not vals:
                continue
            x = i + (j - 0.5) * 0.38
            ax.bar(x, float(np.exp(np.mean(np.log(vals)))), 0.34,
                   color="#1565c0" if not ret else "#90caf9",
                   label=("S2+Retention" if ret else "S2") if i == 0 else None)
            ax.plot([x] * len(vals), vals, "k.", ms=3)
    ax.set_xticks([0, 1], ["ISOLATE", "SHARE"])
    ax.set_ylabel("output tokens/s (ledger = simulated span)")
    ax.legend(frameon=False, fontsize=8)
    ax.set_title(_wrap(f"Q9 geometric-mean throughput; {condition}", 65), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

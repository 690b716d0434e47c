"""Per-run lineage report: the SQL views' answer, checked episode by episode against the scalar
replay, as text (Tables C-2 and G-3 style), as JSON, and as a plot.

    rep = analyse(open_run("run.parquet"))
    print(format_text(rep)); json.dumps(to_json(rep))
"""

from __future__ import annotations

import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lineage import views
from lineage.replay import Agreement, compare, episode_requests, replay, sample_requests
from lineage.source import Run

CLASSES = ("zero->zero", "positive-equal", "zero->positive", "deeper", "shallower")

# Requests whose episodes the default replay checks: the replay walks Python objects (~10 us an
# event), so a whole 1M-event run would take longer than its SQL; a deterministic sample of the
# requests (all their episodes, over only the rows those episodes read) keeps it to a fraction
# of a second. ``replay_requests=None`` replays everything.
REPLAY_SAMPLE = 2_000


@dataclass(frozen=True, slots=True)
class RunReport:
    run: Run
    summary: dict[str, Any]
    checks: dict[str, Any]
    classes: dict[str, dict[str, tuple[int, float | None]]]  # scope -> class -> (n, fraction)
    loss_causes: list[dict[str, Any]]
    agreement: Agreement
    replay_scope: str  # "all N requests", "sample of k of N requests ...", or "off"
    replay_requests: tuple[int, int]  # (requests replayed, requests with episodes)
    points: list[tuple[int, int, str]]  # (J_enter, J_adopt, class) of classified episodes
    sql_seconds: float
    replay_seconds: float


def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    cols = rel.columns
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def analyse(run: Run, *, with_replay: bool = True,
            replay_requests: int | None = REPLAY_SAMPLE) -> RunReport:
    """SQL report of ``run`` checked against the scalar replay: of every episode when
    ``replay_requests`` is None or at least the run's request count, else of the episodes of a
    deterministic sample of that many requests (:func:`lineage.replay.sample_requests`)."""
    if replay_requests is not None and replay_requests < 1:
        raise ValueError(f"replay_requests must be >= 1 or None (all), got {replay_requests}")
    t0 = time.perf_counter()
    con = views.connect(run.table, run.meta, source=run.path, materialize=True)
    # Only what is printed or compared leaves DuckDB: the three plotted columns of classified
    # episodes (Arrow, no Python rows), and full rows only for the replayed episodes below.
    pts = con.sql("SELECT j_enter, j_adopt, class FROM episode_lineage "
                  "WHERE class IS NOT NULL").to_arrow_table()
    points = list(zip(pts.column(0).to_pylist(), pts.column(1).to_pylist(),
                      pts.column(2).to_pylist(), strict=True))
    summary = _rows(con, "SELECT * FROM run_summary")[0]
    checks = _rows(con, "SELECT * FROM table_checks")[0]
    classes: dict[str, dict[str, tuple[int, float | None]]] = {}
    for r in _rows(con, "SELECT * FROM class_counts ORDER BY scope, class_order"):
        classes.setdefault(r["scope"], {})[r["class"]] = (int(r["episodes"]), r["fraction"])
    causes = _rows(con, "SELECT * FROM loss_causes ORDER BY losses DESC, cause, state_kind")
    t1 = time.perf_counter()
    scope, counts = "off", (0, 0)
    agreement = Agreement(0, 0, 0, ())
    if with_replay:
        ids = episode_requests(run.table)
        if replay_requests is None or replay_requests >= len(ids):
            rows = _rows(con, "SELECT * FROM episode_lineage")
            sql_s = time.perf_counter() - t1
            agreement = compare(rows, replay(run.table, run.meta, source=run.path))
            scope, counts = f"all {len(ids):,} requests", (len(ids), len(ids))
        else:
            chosen = sample_requests(ids, replay_requests)
            con.register("_replayed", pa.table({"request_id": sorted(chosen)}))
            rows = _rows(con, "SELECT * FROM episode_lineage "
                              "WHERE request_id IN (SELECT request_id FROM _replayed)")
            sql_s = time.perf_counter() - t1
            agreement = compare(rows, replay(run.table, run.meta, source=run.path,
                                             requests=chosen), requests=chosen)
            scope = (f"sample of {len(chosen):,} of {len(ids):,} requests (smallest CRC-32 of "
                     "the id; every episode of each)")
            counts = (len(chosen), len(ids))
        t1 += sql_s  # fetching the compared rows is SQL time
    con.close()
    t2 = time.perf_counter()
    return RunReport(run, summary, checks, classes, causes, agreement, scope, counts, points,
                     t1 - t0, t2 - t1)


def to_json(rep: RunReport) -> dict[str, Any]:
    s = rep.summary
    a = rep.agreement
    return {
        "path": rep.run.path,
        "organization": rep.run.meta.organization,
        "grid": {"attention_tokens": rep.run.meta.attention_grid_tokens,
                 "recurrent_tokens": rep.run.meta.recurrent_grid_tokens},
        "verification": {"verified": rep.run.verified, "reason": rep.run.verdict_reason},
        "episodes": int(s["episodes"]),
        "initial_episodes": int(s["initial_episodes"]),
        "resume_episodes": int(s["resume_episodes"]),
        "classified_episodes": int(s["classified_episodes"]),
        "unadopted_episodes": int(s["unadopted_episodes"]),
        "episodes_without_entry": int(s["episodes_without_entry"]),
        "classes": {c: rep.classes["ALL"][c][0] for c in CLASSES},
        "class_fractions": {c: rep.classes["ALL"][c][1] for c in CLASSES},
        "classes_initial": {c: rep.classes["INITIAL"][c][0] for c in CLASSES},
        "class_fractions_initial": {c: rep.classes["INITIAL"][c][1] for c in CLASSES},
        "means_initial": {
            "episodes": int(s["mean_scope_episodes"]),
            "j_adopt": s["mean_j_adopt"],
            "r_max": {"m0": s["mean_r_max_m0"], "m1": s["mean_r_max_m1"],
                      "exact": s["mean_r_max_exact"]},
            "a_max": {"m0": s["mean_a_max_m0"], "m1": s["mean_a_max_m1"],
                      "exact": s["mean_a_max_exact"]},
        },
        "attribution": {"shallower": int(s["shallower_episodes"]),
                        "with_other_request_loss": int(s["shallower_with_other_request_loss"])},
        "supply": {"publications": int(s["publications"]), "losses": int(s["losses"]),
                   "depth_increasing_publications": int(s["depth_increasing_publications"]),
                   "depth_decreasing_losses": int(s["depth_decreasing_losses"])},
        "loss_causes": rep.loss_causes,
        "table_checks": rep.checks,
        "replay_agreement": {"scope": rep.replay_scope,
                             "requests_replayed": rep.replay_requests[0],
                             "requests": rep.replay_requests[1],
                             "episodes": a.episodes, "agree": a.agree,
                             "details_agree": a.details_agree,
                             "disagreements": [list(d) for d in a.disagreements]},
        "seconds": {"sql": round(rep.sql_seconds, 3), "replay": round(rep.replay_seconds, 3)},
    }


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


# printed under every text report, so its words need no other page
GLOSSARY = (
    "  glossary: J = joint reuse depth in tokens (attention state and a complete checkpoint",
    "    both valid); J_enter when the request began waiting, J_adopt what the scheduler adopted.",
    "    R_max = deepest complete checkpoint, A_max = deepest boundary the valid attention prefix",
    "    covers, at the lookup: M0 = before the lookup's step, M1 = M0 plus other requests'",
    "    publications in that step, exact = at the lookup's place in trace order.",
)


def format_text(rep: RunReport) -> str:
    s, m = rep.summary, rep.run.meta
    out = [f"run {rep.run.path}: {m.organization}, grid {m.attention_grid_tokens}/"
           f"{m.recurrent_grid_tokens} tokens, trace {rep.run.verification}",
           f"  episodes {s['episodes']:,} (INITIAL {s['initial_episodes']:,}, RESUME "
           f"{s['resume_episodes']:,}); classified {s['classified_episodes']:,}, never adopted "
           f"{s['unadopted_episodes']:,}, adopted without entry {s['episodes_without_entry']:,}"]
    out.append("  class            " + "".join(f"{sc:>18}" for sc in ("ALL", "INITIAL", "RESUME")))
    for c in CLASSES:
        cells = []
        for sc in ("ALL", "INITIAL", "RESUME"):
            n, frac = rep.classes[sc][c]
            cells.append(f"{n:>9,} {_f(frac, 3):>7} ")
        out.append(f"  {c:<16} " + "".join(cells))
    out.append(f"  means over {s['mean_scope_episodes']:,} INITIAL episodes (tokens/request): "
               f"J_adopt {_f(s['mean_j_adopt'])}")
    out.append(f"    R_max  M0 {_f(s['mean_r_max_m0'])}  M1 {_f(s['mean_r_max_m1'])}  "
               f"exact {_f(s['mean_r_max_exact'])}")
    out.append(f"    A_max  M0 {_f(s['mean_a_max_m0'])}  M1 {_f(s['mean_a_max_m1'])}  "
               f"exact {_f(s['mean_a_max_exact'])}")
    out.append(f"  attribution: {s['shallower_with_other_request_loss']}/{s['shallower_episodes']}"
               " shallower episodes include another request's allocation loss")
    out.append(f"  supply: {s['publications']:,} publications "
               f"({s['depth_increasing_publications']:,} depth-increasing), {s['losses']:,} losses "
               f"({s['depth_decreasing_losses']:,} depth-decreasing)")
    if rep.loss_causes:
        out.append("  losses by cause: " + ", ".join(
            f"{r['cause']}/{r['state_kind']} {r['losses']:,}" for r in rep.loss_causes))
    ck = rep.checks
    out.append(f"  table: {ck['events']:,} events, seq {ck['first_seq']}..{ck['last_seq']}, "
               f"gaps {ck['seq_gaps']}, duplicate seqs {ck['duplicate_seqs']}, end records "
               f"{ck['end_records']}, supply step regressions {ck['supply_step_regressions']}")
    a = rep.agreement
    if rep.replay_scope == "off":
        out.append("  SQL vs replay: not checked (replay off)")
    else:
        line = (f"  SQL vs replay: {a.agree}/{a.episodes} episodes agree on J_enter and "
                f"J_adopt; {a.details_agree}/{a.episodes} on every field "
                f"[replay scope: {rep.replay_scope}]")
        out.append(line + ("" if a.complete else "  <-- DISAGREEMENT"))
    for d in a.disagreements:
        out.append(f"    {d[0]} #{d[1]} {d[2]}: sql {d[3]!r} replay {d[4]!r}")
    out.append(f"  time: SQL {rep.sql_seconds:.2f} s, replay {rep.replay_seconds:.2f} s")
    out.extend(GLOSSARY)
    return "\n".join(out)


# marker area per episode in the J_enter vs J_adopt scatter (points^2): area = MARKER_AREA * n
MARKER_AREA = 12.0


def plot(reports: Sequence[RunReport], out_png: str) -> None:
    """Class bars per run (INITIAL and RESUME stacked per class) and a J_enter vs J_adopt
    scatter of every classified episode, coloured by class, marker area proportional to the
    episodes at that point; titled with the runs' conditions (:mod:`tracer.conditions`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from tracer.conditions import describe_runs

    colours = dict(zip(CLASSES, ("#9e9e9e", "#2e7d32", "#1565c0", "#6a1b9a", "#c62828"),
                       strict=True))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.6))
    width = 0.8 / max(1, len(reports))
    tallest = 0
    for i, rep in enumerate(reports):
        xs = [k + i * width for k in range(len(CLASSES))]
        ini = [rep.classes["INITIAL"][c][0] for c in CLASSES]
        res = [rep.classes["RESUME"][c][0] for c in CLASSES]
        tallest = max([tallest, *(a + b for a, b in zip(ini, res, strict=True))])
        label = f"{rep.run.meta.organization}: {rep.run.path.rsplit('/', 1)[-1]}"
        bars = ax1.bar(xs, ini, width, label=f"{label} INITIAL")
        ax1.bar(xs, res, width, bottom=ini, color=bars.patches[0].get_facecolor(), alpha=0.45,
                hatch="//", label=f"{label} RESUME")
    ax1.set_xticks([k + width * (len(reports) - 1) / 2 for k in range(len(CLASSES))])
    ax1.set_xticklabels(CLASSES, rotation=15)
    # head room above the tallest stack, so neither it nor the legend above it is cut
    ax1.set_ylim(0, max(1, tallest) * (1.12 + 0.06 * len(reports)))
    ax1.set_ylabel("episodes")
    ax1.set_title("depth classes per run (INITIAL solid, RESUME hatched on top)", fontsize=9)
    ax1.legend(fontsize=7, loc="upper right")
    top, biggest = 1, 1
    for c in CLASSES:
        pts = Counter((e, a) for rep in reports for e, a, k in rep.points if k == c)
        if pts:
            top = max(top, max(max(p) for p in pts))
            biggest = max(biggest, max(pts.values()))
            # depths sit on the grid, so episodes coincide: the marker area counts them
            ax2.scatter([p[0] for p in pts], [p[1] for p in pts],
                        s=[MARKER_AREA * n for n in pts.values()], alpha=0.55,
                        color=colours[c], label=f"{c} ({sum(pts.values())} episodes)")
    ax2.plot([0, top], [0, top], color="black", lw=0.8, ls="--")
    ax2.margins(0.08)
    ax2.set_xlabel("J_enter (tokens)")
    ax2.set_ylabel("J_adopt (tokens)")
    ax2.set_title("entry versus adopted joint depth; marker area proportional to episodes",
                  fontsize=9)
    sizes = sorted({1, max(1, biggest // 2), biggest})
    keys = [Line2D([], [], ls="", marker="o", color="grey", alpha=0.55,
                   markersize=(MARKER_AREA * n) ** 0.5, label=f"{n} episode{'s' * (n > 1)}")
            for n in sizes]
    # class entries at one size (colour says the class), then the size key
    handles = [Line2D([], [], ls="", marker="o", color=h.get_facecolor()[0], alpha=0.55,
                      markersize=6, label=lab)
               for h, lab in zip(*ax2.get_legend_handles_labels(), strict=True)]
    ax2.legend(handles=[*handles, *keys], fontsize=7, loc="upper left", labelspacing=1.2)
    fig.suptitle(textwrap.fill(describe_runs([rep.run.meta.as_json() for rep in reports]), 140),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)

"""``hybridmem campaign report``: the paper's figures beside the simulated ones, per question.

For every campaign directory (``runs.parquet`` + ``campaign.json``, which carries the spec's
``[[paper]]`` entries, :mod:`hybridmem.sim.campaign_paper`) and every paper entry, one row per
stratum it selects::

    question | paper ref | what | paper | simulated | interval | n | verdict |
    preemptions (paper; simulated num / den) | stratum

The simulated figure is computed from the seed-paired cells exactly as the entry's kind says
(effect, difference, interaction, value, within); the interval is the paired-t interval at the
campaign's ``[stats] level``. Below the table: what the simulator cannot model, per question
(the entries of kind ``not_modelled`` and the limits every simulated run shares), and the
figures (matplotlib PNG, each titled with the run's conditions).
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.sim.campaign_paper import PaperFigure, verdict
from hybridmem.sim.campaign_spec import AXES, Contrast
from hybridmem.sim.campaign_stats import factor, load_runs, matches

# limits every simulated figure shares (hybridmem/sim/README.md, "What the simulation models")
SHARED_LIMITS = (
    "cost model uncalibrated unless the campaign names cost overrides: step times come from a "
    "roofline over a device preset with chosen, not measured, efficiencies",
    "workload: the paper's token ids and arrival vectors were not published; the generator has "
    "the published properties, so seed s here is not the paper's stream s",
    "outputs run to their target (no EOS); no API server, tokenizer, HTTP streaming or "
    "benchmark orchestration",
)


@dataclass(frozen=True)
class Row:
    question: str
    campaign: str
    figure: PaperFigure
    stratum: dict[str, Any]
    sim: float | None
    ci: tuple[float, float] | None
    n: int
    verdict: str
    preempt_num: float | None
    preempt_den: float | None
    note: str = ""
    varying: tuple[str, ...] = ()   # the grid factors with more than one value in the campaign


def load_campaign(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    meta_path = path / "campaign.json"
    runs = path / "runs.parquet"
    if not meta_path.is_file() or not runs.is_file():
        raise HybridMemError(f"{str(path)!r} is not a campaign directory (needs campaign.json "
                             "and runs.parquet: run `hybridmem campaign SPEC --out DIR` first)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HybridMemError(f"cannot read {str(meta_path)!r}: {exc}") from None
    return meta, load_runs(runs)


def _figures(meta: dict[str, Any]) -> list[PaperFigure]:
    out = []
    for e in meta.get("paper", []):
        e = dict(e)
        if e.get("interval") is not None:
            e["interval"] = tuple(e["interval"])
        if e.get("across") is not None:
            e["across"] = tuple(e["across"])
        out.append(PaperFigure(**e))
    return out


def _contrasts(meta: dict[str, Any]) -> dict[str, Contrast]:
    return {c["name"]: Contrast(c["name"], dict(c["num"]), dict(c["den"]))
            for c in meta.get("contrasts", [])}


def _t(values: list[float], level: float) -> tuple[float, tuple[float, float] | None]:
    """Mean and its t interval (None below two values)."""
    from hybridmem.stats import paired_t_interval

    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    ti = paired_t_interval(values, level)
    return ti.mean, (ti.low, ti.high)


def _pct_of_log(mean: float, ci: tuple[float, float] | None
                ) -> tuple[float, tuple[float, float] | None]:
    return (100 * math.expm1(mean),
            None if ci is None else (100 * math.expm1(ci[0]), 100 * math.expm1(ci[1])))


def _arm(rows: list[dict[str, Any]], sel: dict[str, Any], metric: str) -> dict[int, float]:
    return {int(r["seed"]): float(r[metric]) for r in rows
            if matches(r, sel) and metric in r and r[metric] == r[metric]}


def _strata(rows: list[dict[str, Any]], c: Contrast, where: dict[str, Any],
            fixed: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    free = [a for a in AXES if a not in c.num and a not in fixed]
    seen: dict[tuple[Any, ...], None] = {}
    for r in rows:
        if matches(r, where) and (matches(r, c.num) or matches(r, c.den)):
            seen[tuple(factor(r, a) for a in free)] = None
    return [dict(zip(free, key, strict=True)) for key in seen]


def _mean_of(rows: list[dict[str, Any]], sel: dict[str, Any], metric: str) -> float | None:
    vals = [float(r[metric]) for r in rows if matches(r, sel) and metric in r
            and r[metric] == r[metric]]
    return sum(vals) / len(vals) if vals else None


def evaluate(fig: PaperFigure, rows: list[dict[str, Any]], contrasts: dict[str, Contrast],
             level: float, question: str = "", campaign: str = "") -> list[Row]:
    """The simulated figure(s) for one paper entry: one Row per stratum it selects."""
    def row(stratum: dict[str, Any], sim: float | None, ci: tuple[float, float] | None, n: int,
            pn: float | None = None, pd: float | None = None, note: str = "") -> Row:
        return Row(question, campaign, fig, stratum, sim, ci, n,
                   verdict(fig.kind, fig.value, sim, ci, fig.tolerance, fig.interval), pn, pd,
                   note)
    if fig.kind == "not_modelled":
        return [row(dict(fig.where), None, None, 0, note=fig.reason)]
    if fig.kind == "value":
        vals = [float(r[fig.metric]) for r in rows if matches(r, fig.where)
                and fig.metric in r and r[fig.metric] == r[fig.metric]]
        if not vals:
            return [row(dict(fig.where), None, None, 0, note="no cells")]
        pre = _mean_of(rows, fig.where, "preemptions")
        if fig.scale == "log":
            if any(v <= 0 for v in vals):
                return [row(dict(fig.where), None, None, len(vals),
                            note="geometric mean of non-positive values")]
            mean, ci = _t([math.log(v) for v in vals], level)
            return [row(dict(fig.where), math.exp(mean),
                        None if ci is None else (math.exp(ci[0]), math.exp(ci[1])), len(vals),
                        pre)]
        mean, ci = _t(vals, level)
        return [row(dict(fig.where), mean, ci, len(vals), pre)]
    c = contrasts.get(fig.contrast or "")
    if c is None:
        return [row(dict(fig.where), None, None, 0, note=f"contrast {fig.contrast!r} absent")]
    out = []
    fixed = (fig.across[0],) if fig.across is not None else ()
    for stratum in _strata(rows, c, fig.where, fixed):
        num_sel, den_sel = {**stratum, **c.num}, {**stratum, **c.den}
        pn = _mean_of(rows, num_sel, "preemptions")
        pd = _mean_of(rows, den_sel, "preemptions")
        if fig.kind == "interaction":
            assert fig.across is not None
            ax, hi, lo = fig.across
            arms = [_arm(rows, {**sel, ax: lvl}, fig.metric)
                    for lvl in (hi, lo) for sel in (num_sel, den_sel)]
            seeds = sorted(set.intersection(*(set(a) for a in arms)))
            if not seeds:
                out.append(row(stratum, None, None, 0, pn, pd, "no paired seeds"))
                continue
            nh, dh, nl, dl = arms
            if fig.scale == "log":
                z = [math.log(nh[s] / dh[s]) - math.log(nl[s] / dl[s]) for s in seeds]
                sim, ci = _pct_of_log(*_t(z, level))
            else:
                z = [100 * (nh[s] / dh[s] - nl[s] / dl[s]) for s in seeds]
                sim, ci = _t(z, level)
            out.append(row(stratum, sim, ci, len(seeds), pn, pd))
            continue
        num, den = _arm(rows, num_sel, fig.metric), _arm(rows, den_sel, fig.metric)
        seeds = sorted(set(num) & set(den))
        if not seeds and fig.kind == "simulated":
            continue  # an arm the campaign did not run (no paper figure to miss)
        if not seeds:
            out.append(row(stratum, None, None, 0, pn, pd, "no paired seeds"))
            continue
        if fig.kind == "difference":
            sim, ci = _t([num[s] - den[s] for s in seeds], level)
        else:  # effect, within, simulated: the interval is always the log-space paired t
            if any(num[s] <= 0 or den[s] <= 0 for s in seeds):
                out.append(row(stratum, None, None, len(seeds), pn, pd,
                               "a ratio of non-positive values"))
                continue
            logs = [math.log(num[s] / den[s]) for s in seeds]
            mean_log, ci_log = _t(logs, level)
            effect, ci = _pct_of_log(mean_log, ci_log)
            rel = sum(100 * (num[s] / den[s] - 1) for s in seeds) / len(seeds)
            sim = effect if fig.scale == "log" else rel
        out.append(row(stratum, sim, ci, len(seeds), pn, pd))
    if fig.kind == "simulated":
        return out
    return out or [row(dict(fig.where), None, None, 0, note="no cells match")]


def conditions(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """One line naming what produced a campaign's figures (for tables and figure titles)."""
    fixed = meta.get("fixed", {})
    cost = fixed.get("cost") or {}
    calib = ("uncalibrated cost defaults" if not cost else
             "cost " + ", ".join(f"{k}={v:g}" for k, v in sorted(cost.items())))
    seeds = sorted({int(r["seed"]) for r in rows})
    seed_txt = (f"seeds {seeds[0]}-{seeds[-1]}" if seeds and seeds == list(range(seeds[0],
                seeds[-1] + 1)) else f"seeds {', '.join(map(str, seeds))}") + f" (n={len(seeds)})"
    budgets = sorted({str(r["budget"]) for r in rows},
                     key=lambda b: int(b[1:]) if b[1:].isdigit() else 10**9)
    splits = sorted({str(factor(r, "chunking")) for r in rows})
    return (f"simulated: {fixed.get('model', '?')}, {fixed.get('device', '?')} preset, {calib}; "
            f"{fixed.get('requests', '?')} requests; {seed_txt}; budgets {'/'.join(budgets)}; "
            f"chunking {'/'.join(splits)}")


def _fmt(v: float | None, kind: str = "effect") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if kind in ("effect", "interaction", "within", "simulated"):
        return f"{v:+.2f}%"
    return f"{v:,.2f}"


def _cells(r: Row) -> list[str]:
    f = r.figure
    unit = f.kind if f.kind != "interaction" or f.scale == "log" else "points"
    paper = "-" if f.value is None else (_fmt(f.value, unit) if unit != "points"
                                         else f"{f.value:+.3f} pts")
    if f.kind == "within" and f.interval is not None:
        paper = f"within [{f.interval[0]:+g}, {f.interval[1]:+g}]%"
    elif f.interval is not None:
        paper += f" [{f.interval[0]:+g}, {f.interval[1]:+g}]"
    sim = (f"{r.sim:+.3f} pts" if unit == "points" and r.sim is not None
           else _fmt(r.sim, unit))
    ci = "-" if r.ci is None else (f"[{r.ci[0]:+.2f}, {r.ci[1]:+.2f}]"
                                   if unit != "value" and unit != "difference"
                                   else f"[{r.ci[0]:,.2f}, {r.ci[1]:,.2f}]")
    pre_paper = "?" if f.preemptions is None else f"{f.preemptions:g}"
    pre_sim = " / ".join("-" if p is None else f"{p:.1f}" for p in (r.preempt_num, r.preempt_den)
                         ) if f.kind != "value" else ("-" if r.preempt_num is None
                                                      else f"{r.preempt_num:.1f}")
    stratum = ", ".join(f"{k}={v}" for k, v in r.stratum.items()
                        if k in r.varying or k in f.where)
    verdict_txt = r.verdict + (f" ({r.note})" if r.note and r.verdict != "not modelled" else "")
    metric = "" if f.metric == "throughput_tok_s" else f" [{f.metric}]"
    return [r.question, f.ref, f.what + metric, paper, sim, ci, str(r.n) if r.n else "-",
            verdict_txt, f"{pre_paper}; {pre_sim}", stratum]


HEADER = ["Q", "paper ref", "what", "paper", "simulated", "interval", "n", "verdict",
          "preemptions/run (paper; sim num / den)", "stratum"]


def _with_specs(meta: dict[str, Any], specs: dict[str, Any]) -> dict[str, Any]:
    """A campaign's metadata with the question, contrasts and ``[[paper]]`` entries of the spec
    of the same name, when one was given (a campaign run before its spec named them)."""
    from dataclasses import asdict

    spec = specs.get(str(meta.get("name")))
    if spec is None:
        return meta
    names = {c["name"] for c in meta.get("contrasts", [])}
    extra = [asdict(c) for c in spec.contrasts if c.name not in names]
    return {**meta, "question": spec.question, "paper": [asdict(f) for f in spec.paper],
            "contrasts": [*meta.get("contrasts", []), *extra]}


def build(dirs: list[Path], specs: Sequence[Path] = ()
          ) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    """Rows of every campaign directory, and per campaign its conditions and rows. ``specs``:
    campaign TOMLs whose paper entries replace those of the directory of the same campaign
    name (for campaigns run before their spec named the paper's figures)."""
    from hybridmem.sim.campaign_spec import load_spec

    by_name = {}
    for p in specs:
        spec = load_spec(p)
        by_name[spec.name] = spec
    all_rows: list[Row] = []
    info: dict[str, dict[str, Any]] = {}
    seen = set()
    for d in dirs:
        meta, runs = load_campaign(d)
        meta = _with_specs(meta, by_name)
        seen.add(str(meta.get("name")))
        name = str(meta.get("name", d.name))
        question = str(meta.get("question") or "?")
        level = float(meta.get("level", 0.95))
        contrasts = _contrasts(meta)
        varying = tuple(a for a in AXES if len({factor(r, a) for r in runs}) > 1)
        rows = [replace(r, varying=varying) for fig in _figures(meta)
                for r in evaluate(fig, runs, contrasts, level, question, name)]
        all_rows.extend(rows)
        info[name] = {"dir": d, "question": question, "meta": meta, "runs": runs,
                      "conditions": conditions(meta, runs), "level": level, "rows": rows}
    unused = sorted(set(by_name) - seen)
    if unused:
        raise HybridMemError(f"--spec {unused}: no campaign directory of that name among "
                             f"{sorted(seen)}")
    order = {f"Q{i}": i for i in range(1, 10)}
    all_rows.sort(key=lambda r: order.get(r.question, 99))
    return all_rows, info


def _limits(rows: list[Row]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r.figure.kind == "not_modelled":
            out[r.question].append(f"{r.figure.what}: {r.figure.reason}")
    return out


def markdown(rows: list[Row], info: dict[str, dict[str, Any]], figures: list[Path],
             base: Path) -> str:
    lines = ["# The paper's figures beside the simulated ones",
             "", "Paper: arXiv 2610.15755 (Falcon-H1-7B-Instruct, A100-PCIE-40GB, vLLM V1). "
             "Verdicts: reproduces (same sign, and inside the paper's interval or within the "
             "entry's tolerance), direction only (same sign), contradicts (opposite sign, "
             "simulated interval excludes zero), inconclusive (opposite sign, interval includes "
             "zero), differs (a value or a zero outside tolerance), not modelled.", ""]
    lines.append("## Campaigns")
    lines.append("")
    for name, i in info.items():
        lines.append(f"- **{i['question']}** `{name}` ({i['dir']}): {i['conditions']}; "
                     f"intervals at {i['level']:.0%}")
    lines += ["", "## Table", "", "| " + " | ".join(HEADER) + " |",
              "|" + "---|" * len(HEADER)]
    for r in rows:
        if r.figure.kind == "not_modelled":
            continue
        lines.append("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |")
    lines += ["", "## What the simulator cannot model", ""]
    for q, items in sorted(_limits(rows).items()):
        lines.append(f"- **{q}**")
        lines += [f"  - {it}" for it in items]
    lines.append("- **every question**")
    lines += [f"  - {it}" for it in SHARED_LIMITS]
    if figures:
        lines += ["", "## Figures", ""]
        for f in figures:
            rel = _relative(f, base)
            lines.append(f"![{f.stem}]({rel})")
    return "\n".join(lines) + "\n"


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path.resolve())


def html_page(rows: list[Row], info: dict[str, dict[str, Any]], figures: list[Path],
              base: Path) -> str:
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>hybridmem: paper beside "
           "simulation</title><style>body{font-family:sans-serif;font-size:13px}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
           ".reproduces{background:#e8f5e9}.contradicts{background:#ffebee}"
           ".direction{background:#fffde7}</style></head><body>",
           "<h1>The paper's figures beside the simulated ones</h1>",
           "<p>Paper: arXiv 2610.15755.</p><h2>Campaigns</h2><ul>"]
    for name, i in info.items():
        out.append(f"<li><b>{e(i['question'])}</b> <code>{e(name)}</code>: "
                   f"{e(i['conditions'])}; intervals at {i['level']:.0%}</li>")
    out.append("</ul><h2>Table</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADER)
               + "</tr>")
    for r in rows:
        if r.figure.kind == "not_modelled":
            continue
        cls = r.verdict.split()[0]
        out.append(f"<tr class='{e(cls)}'>" + "".join(f"<td>{e(c)}</td>" for c in _cells(r))
                   + "</tr>")
    out.append("</table><h2>What the simulator cannot model</h2><ul>")
    for q, items in sorted(_limits(rows).items()):
        out.append(f"<li><b>{e(q)}</b><ul>" + "".join(f"<li>{e(it)}</li>" for it in items)
                   + "</ul></li>")
    out.append("<li><b>every question</b><ul>" + "".join(f"<li>{e(it)}</li>"
                                                          for it in SHARED_LIMITS)
               + "</ul></li></ul>")
    for f in figures:
        out.append(f"<p><img src='{e(_relative(f, base))}' style='max-width:100%'></p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(dirs: list[Path], out: Path | None, html_out: Path | None,
                 plots: bool = True, specs: Sequence[Path] = ()) -> tuple[str, list[Path]]:
    """Build the report over ``dirs``; write Markdown to ``out`` and HTML to ``html_out`` when
    given (atomically; figures beside them in ``<stem>_figures/``). Returns the Markdown."""
    if not dirs:
        raise HybridMemError("campaign report needs at least one campaign directory")
    inputs = [d / name for d in dirs for name in ("campaign.json", "runs.parquet")]
    from hybridmem.outputs import check_output, write_text_atomic

    for target in (out, html_out):
        if target is not None:
            check_output(target, inputs, what="report")
    rows, info = build(dirs, specs)
    anchor = out or html_out
    figures: list[Path] = []
    if plots and anchor is not None:
        from hybridmem.sim.campaign_plots import plot_report

        fig_dir = anchor.with_name(anchor.stem + "_figures")
        figures = plot_report(rows, info, fig_dir)
    base = (anchor or Path(".")).parent
    text = markdown(rows, info, figures, base)
    if out is not None:
        write_text_atomic(out, text, inputs, what="report")
    if html_out is not None:
        write_text_atomic(html_out, html_page(rows, info, figures, html_out.parent), inputs,
                          what="report")
    return text, figures

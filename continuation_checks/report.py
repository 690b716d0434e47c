"""Outputs of a continuation check: ``cases.parquet``, ``report.json`` and ``continuation.png``.

``report.json`` keys: ``summary`` (count per verdict), ``cases`` (per case: ``case``,
``boundary``, ``adopted_depth``, ``verdict``, ``first_divergence``, ``margin_at_divergence``,
``state_bitwise_equal``, ``state_max_abs_diff``, plus ``reason`` and ``faulted``), ``model``,
``org``, ``dtype``, ``fault``, ``explanation`` (``supported`` / ``ruled_out``: sentences backed
by counts), ``margins`` (logit margins at divergences and over non-divergent positions), and
``timing``. Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from continuation_checks.compare import first_divergence, margin_at, margins
from continuation_checks.run import CaseResult
from continuation_checks.verdict import ALL_RUNS, RETAINED_RUNS, VERDICTS, Verdict

REPORT = "report.json"
TABLE = "cases.parquet"
PLOT = "continuation.png"


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _quantiles(xs: list[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0, "min": None, "p01": None, "p05": None, "median": None}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]

    return {"n": len(s), "min": s[0], "p01": q(0.01), "p05": q(0.05), "median": q(0.5)}


def case_row(r: CaseResult) -> dict[str, Any]:
    d = r.evidence.retained_state.get("retained")
    return {
        "case": r.case.case,
        "boundary": r.case.boundary,
        "prompt_len": r.case.prompt_len,
        "adopted_depth": r.runs["retained"].adopted_depth,
        "verdict": r.decision.verdict.value,
        "reason": r.decision.reason,
        "first_divergence": r.first_divergence,
        "margin_at_divergence": _finite(r.margin_at_divergence),
        "state_bitwise_equal": None if d is None else d.bitwise_equal,
        "state_max_abs_diff": None if d is None else _finite(d.max_abs),
        "faulted": r.faulted,
    }


def explain(results: list[CaseResult]) -> dict[str, list[str]]:
    """Which explanations the evidence supports and which it rules out (sentences with counts)."""
    counts = Counter(r.decision.verdict for r in results)
    treated = [r for r in results if r.decision.verdict is not Verdict.UNTREATED]
    n = len(treated)
    sup: list[str] = []
    out: list[str] = []

    def pairs(a: str, b: str) -> int:
        return sum(first_divergence(r.runs[a].token_ids, r.runs[b].token_ids) is not None
                   for r in treated)

    if counts[Verdict.UNTREATED]:
        sup.append(f"{counts[Verdict.UNTREATED]} case(s) untreated (adoption depth != b or state "
                   "not captured): excluded from every comparison below, not hidden")
    if counts[Verdict.STATE_MISMATCH]:
        sup.append(f"state corruption: {counts[Verdict.STATE_MISMATCH]} of {n} treated case(s) "
                   "continued from checkpoint bytes that differ from the state computed at b")
    elif n:
        held = [d for r in treated for d in r.evidence.retained_state.values() if d is not None]
        worst = max((d.scaled for d in held), default=0.0)
        exact = sum(d.bitwise_equal for d in held)
        out.append(f"state corruption: in all {n} treated cases the adopted checkpoint is "
                   "bitwise the producer's state and within tolerance of the from-scratch state "
                   f"at b ({exact} of {len(held)} retained runs bitwise equal to it; largest "
                   f"scaled difference {worst:.3g})")
    if counts[Verdict.IDENTICAL] == n and n:
        sup.append(f"exact continuation: all {n} treated cases give the recompute arm's tokens")
    div_batch = pairs("retained", "retained-alone") + pairs("split", "split-alone")
    div_split = pairs("recompute", "split")
    div_repeat = pairs("recompute", "recompute-repeat") + pairs("split", "split-repeat")
    for what, k in (("batch-variant numerics (batched vs alone)", div_batch),
                    ("restart-at-b numerics (recompute vs split)", div_split),
                    ("reference instability (an arm vs its repeat)", div_repeat)):
        if k:
            sup.append(f"{what}: token divergence in {k} comparison(s) without any reuse")
        elif n:
            out.append(f"{what}: no token divergence in {n} treated cases")
    if counts[Verdict.NUMERICS]:
        sup.append(f"numerics: {counts[Verdict.NUMERICS]} case(s) diverge with the state intact "
                   "and the divergence reproduced without reuse")
    if counts[Verdict.UNEXPLAINED]:
        sup.append(f"unexplained: {counts[Verdict.UNEXPLAINED]} case(s) diverge with the "
                   "recurrent state intact and stable references: look outside the recurrent "
                   "state (attention KV reuse)")
    faulted = [r for r in results if r.faulted]
    if faulted:
        hit = sum(r.decision.verdict is Verdict.STATE_MISMATCH for r in faulted)
        moved = sum(r.first_divergence is not None for r in faulted)
        sup.append(f"fault control: {hit} of {len(faulted)} faulted case(s) report "
                   f"state-mismatch; the fault changed the greedy tokens against recompute in "
                   f"{moved} of them (0 means the model does not depend on its recurrent state, "
                   "or the fault acts on every arm alike, as swap-members does: token identity "
                   "alone would prove nothing)")
    return {"supported": sup, "ruled_out": out}


def margin_summary(results: list[CaseResult]) -> dict[str, Any]:
    at_div: list[float] = []
    calm: list[float] = []
    for r in results:
        ref = r.runs["recompute"].top2
        i = r.first_divergence
        m = margin_at(ref, i)
        if m is not None and math.isfinite(m):
            at_div.append(m)
        calm += [x for x in margins(ref[: i if i is not None else len(ref)]) if math.isfinite(x)]
    return {"at_divergence": _quantiles(at_div), "non_divergent": _quantiles(calm)}


def build_report(results: list[CaseResult], meta: dict[str, Any],
                 timing: dict[str, Any]) -> dict[str, Any]:
    counts = Counter(r.decision.verdict.value for r in results)
    return {
        "summary": {v: counts.get(v, 0) for v in VERDICTS},
        "cases": [case_row(r) for r in results],
        "model": meta.get("model"),
        "org": meta.get("org"),
        "dtype": meta.get("dtype"),
        "fault": meta.get("fault"),
        "explanation": explain(results),
        "margins": margin_summary(results),
        "timing": timing,
        "meta": {k: v for k, v in meta.items() if k not in ("model", "org", "dtype", "fault")},
    }


def _atomic(path: Path, write: Any) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_table(results: list[CaseResult], path: Path) -> Path:
    """One row per case and arm run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for r in results:
        rec = r.runs["recompute"]
        for run in ALL_RUNS:
            s = r.runs[run]
            if run in RETAINED_RUNS:
                d = r.evidence.retained_state.get(run)
                copy = r.evidence.copy.get(run)
            else:
                d = None
                copy = None
                if run in ("split-repeat", "split-alone") and s.state is not None \
                        and r.runs["split"].state is not None:
                    from continuation_checks.compare import state_diff
                    d = state_diff(s.state, r.runs["split"].state)
            div = first_divergence(s.token_ids, rec.token_ids)
            rows.append({
                "case": r.case.case, "family": r.case.family, "boundary": r.case.boundary,
                "prompt_len": r.case.prompt_len, "run": run, "arm": run.split("-")[0],
                "repeat": run.endswith("-repeat"), "batched": not run.endswith("-alone"),
                "engine_request_id": s.engine_id,
                "adopted_depth": s.adopted_depth, "adopted_block": s.adopted_block,
                "state_block": s.state_block,
                "output_token_ids": list(s.token_ids),
                "first_divergence": div,
                "margin_at_divergence": _finite(margin_at(rec.top2, div)),
                "state_bitwise_equal": None if d is None else d.bitwise_equal,
                "state_max_abs_diff": None if d is None else _finite(d.max_abs),
                "state_max_rel_diff": None if d is None else _finite(d.max_rel),
                "state_scaled_diff": None if d is None else _finite(d.scaled),
                "copy_bitwise_equal": None if copy is None else copy.bitwise_equal,
                "verdict": r.decision.verdict.value, "faulted": r.faulted,
            })
    cols = {k: [row[k] for row in rows] for k in rows[0]} if rows else {}
    if cols:
        cols["output_token_ids"] = pa.array(cols["output_token_ids"], type=pa.list_(pa.int32()))
    return _atomic(path, lambda tmp: pq.write_table(pa.table(cols), tmp))


def plot_title(meta: dict[str, Any], cases: int) -> str:
    """The check's conditions: organization, budget, model, dtype, cases, seed, fault."""
    model = str(meta.get("model") or "?").rstrip("/").rsplit("/", 1)[-1]
    budget = meta.get("budget")
    return (f"{meta.get('org', '?')}{f', budget {budget}' if budget else ''}, model {model}, "
            f"{meta.get('dtype', '?')}, {cases} cases, seed {meta.get('seed', '?')}, fault "
            f"{meta.get('fault') or 'none'} | greedy tokens of a retained checkpoint against "
            "recompute")


def write_plot(results: list[CaseResult], path: Path, title: str = "") -> Path:
    """Divergence index and logit margin by verdict (left), margins where nothing diverged
    (right); ``title`` names the check's conditions (:func:`plot_title`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"identical": "tab:green", "untreated": "tab:gray", "reference-unstable": "tab:orange",
              "numerics": "tab:blue", "state-mismatch": "tab:red", "unexplained": "tab:purple"}
    any_div = False
    for v in VERDICTS:
        pts = [(r.first_divergence, r.margin_at_divergence) for r in results
               if r.decision.verdict.value == v and r.first_divergence is not None
               and r.margin_at_divergence is not None]
        n = sum(r.decision.verdict.value == v for r in results)
        if pts:
            any_div = True
            ax1.scatter([p[0] for p in pts], [p[1] for p in pts], c=colors[v], s=18, alpha=0.6,
                        label=f"{v} ({n} cases)")
        elif n:
            ax1.scatter([], [], c=colors[v], label=f"{v} ({n} cases, no divergence)")
    if not any_div:
        ax1.text(0.5, 0.5, f"no token divergence in {len(results)} cases",
                 ha="center", va="center", transform=ax1.transAxes)
        ax1.set_xlim(0, max((r.case.max_tokens for r in results), default=1))
        ax1.set_ylim(0, 1)
    ax1.set_xlabel("first divergent output position (retained vs recompute)")
    ax1.set_ylabel("recompute's top-1 - top-2 logit margin there")
    ax1.legend(fontsize=7, loc="best", framealpha=0.5)
    ax1.set_title("divergences by verdict")
    calm = margin_summary(results)
    allm = [x for r in results for x in margins(r.runs["recompute"].top2) if math.isfinite(x)]
    if allm:
        ax2.hist(allm, bins=40, color="tab:green", alpha=0.7)
    ax2.set_xlabel("top-1 - top-2 logit margin, every recompute position")
    ax2.set_ylabel("positions")
    med = calm["non_divergent"]["median"]
    ax2.set_title(f"margins (non-divergent median {med:.3g})" if med is not None else "margins")
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, dpi=110, format="png")

    try:
        return _atomic(path, save)
    finally:
        plt.close(fig)


def write_outputs(out: Path, results: list[CaseResult], meta: dict[str, Any],
                  timing: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(results, meta, timing)
    write_table(results, out / TABLE)
    write_plot(results, out / PLOT, plot_title(meta, len(results)))
    text = json.dumps(report, indent=2) + "\n"
    _atomic(out / REPORT, lambda tmp: tmp.write_text(text))
    return report


def write_stopped(out: Path, meta: dict[str, Any], timing: dict[str, Any],
                  line: str) -> dict[str, Any]:
    """report.json of a check the engine stopped before any case was classified: an
    organization invariant broke (``InvariantStop``), e.g. under ``--fault skip-invalidate``."""
    out.mkdir(parents=True, exist_ok=True)
    report = build_report([], meta, timing)
    report["stopped"] = line
    report["explanation"] = {
        "supported": [f"the engine stopped on an organization invariant before any case was "
                      f"classified: {line}"],
        "ruled_out": []}
    text = json.dumps(report, indent=2) + "\n"
    _atomic(out / REPORT, lambda tmp: tmp.write_text(text))
    return report

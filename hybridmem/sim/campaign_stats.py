"""Paired statistics over ``runs.parquet`` with :mod:`hybridmem.stats` (SPEC §8).

For each declared contrast (``num`` / ``den`` grid settings), each metric and each *stratum* (a
combination of the grid factors the contrast does not set, seed excluded)::

    arms     num_s, den_s = the metric of the num / den cell of seed s in that stratum
    effects  hybridmem.stats.contrast(num, den): mean seedwise relative effect
             mean_s 100 (num_s / den_s - 1), log-space effect, paired-t interval of
             d(s) = ln(num_s / den_s) at the spec's level, exact sign-flip p over 2^n
    Holm     over every test of the campaign (contrast x stratum x metric): the declared family

A stratum where either arm lacks a seed of the other is an error (nothing is dropped); a stratum
with a single paired seed has no interval and gives no test.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.sim.campaign_spec import AXES, LATE_AXES, Contrast
from hybridmem.stats import contrast as paired_contrast
from hybridmem.stats import holm
from hybridmem.stats.errors import StatsError


def load_runs(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:
        raise HybridMemError(f"cannot read runs table {str(path)!r}: {exc}") from None


def factor(row: dict[str, Any], k: str) -> Any:
    """A row's grid factor; a runs table written before a late axis existed holds its default
    (chunking "default", trace false)."""
    if k in row:
        return row[k]
    if k == "chunking":
        return "default"
    return LATE_AXES[k]


def matches(row: dict[str, Any], sel: dict[str, Any]) -> bool:
    """Does ``row`` have every grid factor ``sel`` sets (pin_k "off" = -1, floats to 1e-12)?"""
    for k, v in sel.items():
        rv = factor(row, k)
        if k == "pin_k":
            v = -1 if v in (None, "off") else v
        if k == "chunking" and v is None:
            v = "default"
        if isinstance(rv, float) or isinstance(v, float):
            if not math.isclose(float(rv), float(v), rel_tol=0, abs_tol=1e-12):
                return False
        elif rv != v:
            return False
    return True


def analyse(rows: list[dict[str, Any]], contrasts: tuple[Contrast, ...] | list[Contrast],
            metrics: tuple[str, ...], level: float, common_seeds: bool = False
            ) -> list[dict[str, Any]]:
    """One dict per test, Holm-adjusted over all of them (in the order produced).

    ``common_seeds``: pair over the seeds both arms have and list the others in
    ``dropped_seeds`` (for a campaign with failed cells); otherwise an unpaired seed is an
    error."""
    tests: list[dict[str, Any]] = []
    for c in contrasts:
        free = [a for a in AXES if a not in c.num]
        strata: dict[tuple[Any, ...], None] = {}
        for r in rows:
            if matches(r, c.num) or matches(r, c.den):
                strata[tuple(factor(r, a) for a in free)] = None
        for key in strata:
            sel = dict(zip(free, key, strict=True))
            for m in metrics:
                num = {int(r["seed"]): float(r[m]) for r in rows
                       if matches(r, {**sel, **c.num})}
                den = {int(r["seed"]): float(r[m]) for r in rows
                       if matches(r, {**sel, **c.den})}
                if not num or not den:
                    continue
                dropped = sorted(set(num) ^ set(den))
                if common_seeds and dropped:
                    num = {k: v for k, v in num.items() if k in den}
                    den = {k: v for k, v in den.items() if k in num}
                    if len(num) < 2:
                        continue
                if not dropped and len(num) < 2:
                    continue  # one paired seed (a smoke run): no interval, no test
                try:
                    pc = paired_contrast(num, den, level=level)
                except StatsError as exc:
                    raise HybridMemError(f"contrast {c.name!r} {sel} {m}: {exc}") from None
                tests.append({"contrast": c.name, "metric": m,
                              "stratum": {k: v for k, v in sel.items()},
                              "n": pc.n, "mean_relative_pct": pc.mean_relative_pct,
                              "effect_pct": pc.effect_pct, "ci_low_pct": pc.ci_pct[0],
                              "ci_high_pct": pc.ci_pct[1], "level": pc.level,
                              "sign_flip_p": pc.sign_flip_p,
                              "positive_seeds": sum(1 for d in pc.log_effects if d > 0),
                              "dropped_seeds": dropped if common_seeds else []})
    if tests:
        for t, p in zip(tests, holm([t["sign_flip_p"] for t in tests]), strict=True):
            t["holm_p"] = p
            t["family_size"] = len(tests)
    return tests


def write_stats(tests: list[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    js, cs = out / "stats.json", out / "stats.csv"
    js.write_text(json.dumps(tests, indent=2, default=str) + "\n")
    cols = ["contrast", "metric", "stratum", "n", "mean_relative_pct", "effect_pct",
            "ci_low_pct", "ci_high_pct", "level", "sign_flip_p", "holm_p", "family_size",
            "positive_seeds"]
    with open(cs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for t in tests:
            w.writerow([json.dumps(t[c], sort_keys=True) if c == "stratum" else t.get(c)
                        for c in cols])
    return js, cs


def format_tests(tests: list[dict[str, Any]]) -> str:
    lines = [f"{'contrast':<10} {'metric':<16} {'stratum':<34} {'n':>3} {'mean rel %':>11} "
             f"{'CI %':>21} {'p':>9} {'Holm p':>9}"]
    for t in tests:
        st = " ".join(f"{k}={v}" for k, v in t["stratum"].items()
                      if k in ("budget", "rate", "headroom", "share", "cap", "org")
                      or (k in ("retention", "isolate", "trace") and v is True)
                      or (k == "chunking" and v != "default"))
        lines.append(f"{t['contrast']:<10} {t['metric']:<16} {st:<34} {t['n']:>3} "
                     f"{t['mean_relative_pct']:>+11.2f} "
                     f"[{t['ci_low_pct']:+8.2f},{t['ci_high_pct']:+8.2f}] "
                     f"{t['sign_flip_p']:>9.5f} {t['holm_p']:>9.5f}")
    return "\n".join(lines)


# -- one arm of a campaign as the seed -> value map `hybridmem stats contrast` pairs ---------------
def parse_selector(text: str) -> dict[str, Any]:
    """``S2`` (an organization) or ``org=S2,budget=b63``: the grid factors an arm fixes. Values
    are read as the runs table types them (integers, reals, true/false, else text)."""
    text = text.strip()
    if not text:
        raise HybridMemError("an empty arm; give an organization (S2) or axis=value,...")
    if "=" not in text:
        return {"org": text}
    sel: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, raw = (s.strip() for s in part.partition("="))
        if not sep or not key or not raw:
            raise HybridMemError(f"arm {text!r}: {part!r} is not axis=value")
        if key not in AXES:
            raise HybridMemError(f"arm {text!r}: no axis {key!r}; axes are {', '.join(AXES)}")
        if key in sel:
            raise HybridMemError(f"arm {text!r}: axis {key!r} given twice")
        sel[key] = _typed(raw)
    return sel


def _typed(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def campaign_runs(path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The runs table of a campaign folder (``DIR/runs.parquet``) or the table itself."""
    runs = path / "runs.parquet" if path.is_dir() else path
    if not runs.is_file():
        raise HybridMemError(f"no campaign runs table at {str(runs)!r} (a campaign's --out "
                             "folder holds runs.parquet)")
    return runs, load_runs(runs)


def arm_values(rows: list[dict[str, Any]], metric: str, arm: str) -> dict[int, float]:
    """``{seed: metric}`` of the cells ``arm`` selects: exactly one cell per seed, else an error
    naming the axes that still vary (add them to the arm); a missing metric value is an error."""
    if rows and metric not in rows[0]:
        numeric = [k for k, v in rows[0].items() if isinstance(v, float) and k not in AXES]
        raise HybridMemError(f"no metric {metric!r} in the runs table; metrics are "
                             f"{', '.join(numeric)}")
    sel = parse_selector(arm)
    chosen = [r for r in rows if matches(r, sel)]
    if not chosen:
        raise HybridMemError(f"arm {arm!r} selects no cell of the campaign")
    by_seed: dict[int, dict[str, Any]] = {}
    for r in chosen:
        seed = int(r["seed"])
        if seed in by_seed:
            varying = [a for a in AXES
                       if len({repr(factor(x, a)) for x in chosen if int(x["seed"]) == seed}) > 1]
            raise HybridMemError(f"arm {arm!r} selects several cells of seed {seed} (they differ "
                                 f"in {', '.join(varying)}); fix them, e.g. "
                                 f"'{arm if '=' in arm else 'org=' + arm},{varying[0]}=...'")
        by_seed[seed] = r
    out: dict[int, float] = {}
    for seed, r in sorted(by_seed.items()):
        v = r[metric]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            raise HybridMemError(f"arm {arm!r} seed {seed}: no {metric} in cell "
                                 f"{r.get('cell_id')!r}")
        out[seed] = float(v)
    return out

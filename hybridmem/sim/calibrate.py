"""Fit the cost model's constants to measured step times (least squares).

A timing file (CSV or Parquet) has one row per engine step with the columns of
:class:`~hybridmem.sim.cost.StepFeatures` and the measured duration::

    tokens, seqs, kv_tokens, attn_pairs, checkpoints, seconds

(``hybridmem sim --step-log`` writes exactly these columns for a simulated run, so a simulated
run doubles as a synthetic timing file; a GPU run needs a per-step logger on the worker that
records the same sums, which this project does not ship yet.)

The step time is linear in ``x = (1 / (eta_F peak), 1 / (eta_B BW), t_0, t_seq)`` once each part
``p`` of a step is known to be compute- or memory-bound::

    t = t_0 + S t_seq + sum_p [F_p x_0  if compute-bound else B_p x_1]

so the fit alternates: classify every part of every step with the current constants, solve the
linear least-squares problem (``numpy.linalg.lstsq``), reclassify, until the classification no
longer changes (at most 50 rounds). The state-access efficiencies (``member_page_eff``,
``slot_line_eff``) stay as given: they enter the memory terms of one organization only and need
timings of that organization's runs against a contiguous one to be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridmem.errors import HybridMemError
from hybridmem.inputs import check_regular
from hybridmem.sim.cost import CostConstants, CostModel, StepFeatures

COLUMNS = (*StepFeatures._fields, "seconds")
MAX_ROUNDS = 50
MIN_ROWS = 8
MAX_ROWS = 10_000_000
# the largest value a step can plausibly hold in each column: bounded inputs keep the
# least-squares solve finite and fast (a finite 1e308 made it run without end)
LIMITS = {"tokens": 2**31, "seqs": 2**31, "kv_tokens": 2**48, "attn_pairs": 1e20,
          "checkpoints": 2**31, "seconds": 3600.0}


@dataclass(frozen=True)
class Fit:
    constants: CostConstants
    rows: int
    rounds: int
    rmse_s: float
    r2: float
    before_rmse_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"constants": self.constants.as_dict(), "rows": self.rows, "rounds": self.rounds,
                "rmse_s": self.rmse_s, "r2": self.r2, "rmse_before_s": self.before_rmse_s}


def load_timing(path: str | Path) -> dict[str, np.ndarray]:
    """The timing file's columns as float arrays, checked (one-line errors)."""
    p = check_regular(path, "timing file")  # missing, or a device or pipe (endless)
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(p).to_pydict()
        elif p.suffix == ".csv":
            import csv

            with open(p, newline="") as fh:
                rows = list(csv.DictReader(fh))
            table = {k: [r[k] for r in rows] for k in (rows[0] if rows else {})}
        else:
            raise HybridMemError(f"timing file {str(p)!r} must end in .csv or .parquet")
    except HybridMemError:
        raise
    except Exception as exc:
        raise HybridMemError(f"cannot read timing file {str(p)!r}: {exc}") from None
    missing = [c for c in COLUMNS if c not in table]
    if missing:
        raise HybridMemError(f"timing file {str(p)!r} lacks columns {missing}; needs {COLUMNS}")
    out: dict[str, np.ndarray] = {}
    for c in COLUMNS:
        out[c] = _column(str(p), c, table[c], text=p.suffix == ".csv")
    if len(out["seconds"]) < MIN_ROWS:
        raise HybridMemError(f"timing file {str(p)!r} has {len(out['seconds'])} steps; "
                             f"a fit needs at least {MIN_ROWS}")
    return out


def _column(where: str, name: str, values: list[Any], text: bool) -> np.ndarray:
    """One column as a 1-D float array: numbers only (a CSV's text parsed as numbers), finite,
    in ``[0, LIMITS[name]]``, whole numbers where the feature is a count."""
    if not isinstance(values, list) or len(values) > MAX_ROWS:
        raise HybridMemError(f"timing file {where!r}: column {name!r} must hold at most "
                             f"{MAX_ROWS:,} numbers")
    for v in values:
        ok = isinstance(v, str) if text else (isinstance(v, (int, float))
                                              and not isinstance(v, bool))
        if not ok:
            raise HybridMemError(f"timing file {where!r}: column {name!r} holds "
                                 f"{type(v).__name__} {str(v)[:40]!r}, not a number")
    try:
        arr = np.asarray([float(v) for v in values], dtype=float)
    except (TypeError, ValueError, OverflowError):
        raise HybridMemError(f"timing file {where!r}: column {name!r} is not numeric") from None
    hi = LIMITS[name]
    bad = ~np.isfinite(arr) | (arr < 0) | (arr > hi)
    if name != "seconds" and name != "attn_pairs":
        bad |= arr != np.floor(arr)
    if np.any(bad):
        v = arr[np.argmax(bad)]
        kind = "a number" if name in ("seconds", "attn_pairs") else "a whole number"
        raise HybridMemError(f"timing file {where!r}: column {name!r} value {v!r} is not "
                             f"{kind} in [0, {hi:g}]")
    return arr


def _design(model: CostModel, cols: dict[str, np.ndarray], k: CostConstants
            ) -> tuple[np.ndarray, np.ndarray]:
    """Design matrix under the current regime, and the regime mask (True: compute-bound)."""
    n = len(cols["seconds"])
    peak, bw = model.device.peak_bf16_flops, model.device.hbm_bytes_per_s
    a = np.zeros((n, 4))
    a[:, 2] = 1.0
    a[:, 3] = cols["seqs"]
    regimes = np.zeros((n, 4), dtype=bool)
    for i in range(n):
        f = StepFeatures(int(cols["tokens"][i]), int(cols["seqs"][i]), int(cols["kv_tokens"][i]),
                         float(cols["attn_pairs"][i]), int(cols["checkpoints"][i]))
        for j, (fl, b) in enumerate(model.parts(f)):
            compute = fl / (peak * k.mfu) >= b / (bw * k.bw_eff)
            regimes[i, j] = compute
            if compute:
                a[i, 0] += fl / peak
            else:
                a[i, 1] += b / bw
    return a, regimes


def fit(model: CostModel, cols: dict[str, np.ndarray]) -> Fit:
    """Least-squares constants for ``model`` (its device, shape, org) from measured steps."""
    y = cols["seconds"]
    k = model.k
    before = _rmse(model, cols, k)
    regimes = None
    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 - rounds is reported
        a, new = _design(model, cols, k)
        x, *_ = np.linalg.lstsq(a, y, rcond=None)
        mfu = 1.0 / x[0] if x[0] > 0 else 1.0
        bw = 1.0 / x[1] if x[1] > 0 else 1.0
        k = k.with_values(mfu=float(min(max(mfu, 1e-3), 1.0)),
                          bw_eff=float(min(max(bw, 1e-3), 1.0)),
                          step_overhead_s=float(min(max(x[2], 0.0), 9.99)),
                          per_seq_overhead_s=float(min(max(x[3], 0.0), 9.99)))
        if regimes is not None and np.array_equal(new, regimes):
            break
        regimes = new
    rmse = _rmse(model, cols, k)
    var = float(np.var(y))
    r2 = 1.0 - rmse**2 / var if var > 0 else 1.0
    return Fit(k, len(y), rounds, rmse, r2, before)


def _rmse(model: CostModel, cols: dict[str, np.ndarray], k: CostConstants) -> float:
    m = CostModel(model.shape, model.device, model.org, model.grid, k)
    pred = np.array([m.time(StepFeatures(int(t), int(s), int(kv), float(ap), int(c))).seconds
                     for t, s, kv, ap, c in zip(cols["tokens"], cols["seqs"], cols["kv_tokens"],
                                                cols["attn_pairs"], cols["checkpoints"],
                                                strict=True)])
    return float(np.sqrt(np.mean((pred - cols["seconds"]) ** 2)))

"""Pool occupancy over time, one panel per pool of each run (``hybridmem lineage PATH...
--occupancy OUT.png``): units in use and units available (free or cached) at every successful
allocation attempt, from :mod:`tracer.occupancy`, against the engine step.

The x axis is the scheduler's step index in both kinds of run: a simulated run's virtual clock
advances by the cost model's time per step, a served run's by the machine's wall clock, so the
step is the axis the two share (the title says which clock the run had). Each panel's stack
equals the pool's size at every point (checked before drawing).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from lineage.source import Run
from tracer.conditions import describe
from tracer.occupancy import PoolSeries, occupancy


def run_occupancy(run: Run) -> list[PoolSeries]:
    """Every pool's checked series of ``run`` (an :class:`tracer.occupancy.OccupancyError`
    when the run names no pool size or an event falls outside its pool)."""
    return occupancy(run.table, run.meta.as_json())


def plot_occupancy(runs: Sequence[Run], out_png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(run, s) for run in runs for s in run_occupancy(run)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.6 + 2.2 * len(panels)),
                             squeeze=False)
    for ax, (run, s) in zip(axes[:, 0], panels, strict=True):
        if s.step:
            ax.stackplot(s.step, s.in_use, s.available, step="post",
                         labels=["in use", "available (free or cached)"],
                         colors=["#c62828", "#90caf9"], alpha=0.85)
            # what was observed; the pool is held level between observations
            ax.plot(s.step, s.in_use, ".", ms=2.5, color="black",
                    label="observed (allocation attempt)")
        else:
            ax.text(0.5, 0.5, "no successful allocation in this run", ha="center",
                    transform=ax.transAxes)
        ax.axhline(s.size, color="black", lw=0.8, ls="--", label=f"pool size {s.size}")
        ax.set_ylim(0, s.size * 1.08)
        ax.set_ylabel(f"{s.pool} (units)")
        ax.set_title(textwrap.fill(f"{s.pool} pool of {run.path}: "
                                   f"{describe(run.meta.as_json())}", 130), fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("engine step (points: successful allocation attempts)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)

"""Figure titles name the run's conditions (tracer/conditions.py); the lineage plot uses them."""

from __future__ import annotations

import pytest

from tracer.conditions import describe, describe_runs, summary_meta

pytestmark = pytest.mark.writer_paths("default")  # reader side: one writer path

SIM = {"organization": "S2", "budget": "b63", "seed": 0, "simulated": True,
       "device": "a100-40gb", "cost_constants": {}, "workload": {"requests": 20}}
SERVED = {"organization": "D0", "budget": "b32", "seed": 1, "device": "cpu",
          "arrivals": "engine step (20 ms of the Poisson schedule per step)",
          "workload": {"requests": 24}}


def test_simulated_uncalibrated_and_calibrated():
    assert describe(SIM) == ("S2, budget b63, 20 requests, seed 0 | simulated a100-40gb, "
                             "cost model uncalibrated (preset constants), virtual time")
    cal = describe({**SIM, "cost_constants": {"mfu": 0.41}})
    assert "cost model calibrated (constants mfu=0.41)" in cal
    assert "calibration not recorded" in describe({k: v for k, v in SIM.items()
                                                   if k != "cost_constants"})


def test_served_and_several_runs():
    assert describe(SERVED) == ("D0, budget b32, 24 requests, seed 1 | served by vLLM on CPU, "
                                "wall clock; arrivals by engine step (20 ms of the Poisson "
                                "schedule per step)")
    both = describe_runs([SIM, {**SIM, "organization": "D0", "seed": 3}])
    assert both.startswith("S2, D0, budget b63, 20 requests, seed 0/3 | simulated")
    assert describe({"organization": "vllm", "num_blocks": 63}).startswith(
        "vllm, 63 KV blocks, ? requests, seed ?")


def test_summary_meta_of_a_sim_summary():
    s = {"driver": "sim", "device": "h200", "requests": 5, "seed": 2, "budget": "b40",
         "config": {"org": "S1", "constants": {}}}
    assert describe(summary_meta(s)).startswith("S1, budget b40, 5 requests, seed 2 | "
                                                "simulated h200, cost model uncalibrated")


def test_the_lineage_plot_is_titled(tmp_path, monkeypatch: pytest.MonkeyPatch):
    import matplotlib.figure
    import pyarrow.parquet as pq

    from lineage.report import analyse, plot
    from lineage.source import open_run
    from lineage.table import events_to_table
    from tests.lineage.helpers import adopt, enter, pub

    path = tmp_path / "run.parquet"
    meta = {**SIM, "attention_grid_tokens": 512, "recurrent_grid_tokens": 512}
    pq.write_table(events_to_table([pub(1, 1), pub(2, 1, rec=True), enter("a", 2, [1], [2]),
                                    adopt("a", 4, 512)], meta), path)
    titles: list[str] = []
    real = matplotlib.figure.Figure.savefig

    def grab(self, *a, **k):  # type: ignore[no-untyped-def]
        titles.append(self._suptitle.get_text() if self._suptitle else "")
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", grab)
    plot([analyse(open_run(str(path)))], str(tmp_path / "p.png"))
    assert titles and "S2, budget b63, 20 requests, seed 0" in titles[0].replace("\n", " ")
    assert "simulated a100-40gb" in titles[0].replace("\n", " ")

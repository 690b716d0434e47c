"""``import hybridmem``'s notebook entry points: cheap to import, and the CLI's own answers."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hybridmem
from hybridmem.budget import parse_budget, plan_budget
from hybridmem.errors import HybridMemError
from hybridmem.units import derive_units


def test_import_pulls_in_nothing_until_an_entry_point_is_used() -> None:
    code = ("import sys, hybridmem; before = sorted(m for m in sys.modules if m.startswith("
            "('hybridmem.', 'lineage', 'duckdb', 'torch'))); hybridmem.plan; after = "
            "'hybridmem.memory.organization' in sys.modules or 'hybridmem.budget' in sys.modules;"
            " print(before, after)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[] False", out  # reading the attribute loads only hybridmem.api


def test_plan_is_the_cli_plan() -> None:
    from hybridmem.cli import models

    u = derive_units(models.geometry("falcon-h1-7b"))
    want = plan_budget(u, parse_budget("b63", u), 0.5)
    got = hybridmem.plan("falcon-h1-7b", "b63", attention_fraction=0.5)
    assert got == want
    assert hybridmem.plan("falcon-h1-7b", "b83", attention_fraction=0.5) != want  # control


def test_organizations_are_sized_by_the_plan_at_their_own_grid() -> None:
    p = hybridmem.plan("falcon-h1-7b", "b63", attention_fraction=0.5)
    s2 = hybridmem.organization("S2", "falcon-h1-7b", "b63")
    assert s2.available().attention == p.org("S2").pages  # type: ignore[union-attr]
    assert (s2.attention_grid, s2.recurrent_grid) == (512, 512)
    d0 = hybridmem.organization("D0", "falcon-h1-7b", "b63")
    assert d0.available() == (p.d0.attention_units, p.d0.recurrent_units)  # type: ignore[union-attr]
    assert (d0.attention_grid, d0.recurrent_grid) == (16, 1792)  # native geometry, Table B-2


@pytest.mark.parametrize("kwargs", [{"budget": "63"}, {"budget": None},
                                    {"budget": "b63", "total": "12GiB"}])
def test_bad_budgets_fail_with_the_cli_message(kwargs: dict[str, str | None]) -> None:
    with pytest.raises(HybridMemError):
        hybridmem.plan("falcon-h1-7b", **kwargs)  # type: ignore[arg-type]


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        hybridmem.no_such_entry_point  # noqa: B018


@pytest.mark.vllm
def test_open_lineage_one_run_and_several(sim_traces: dict[str, str]) -> None:
    one = hybridmem.open_lineage(sim_traces["S2"])
    n_events = hybridmem.trace_events(sim_traces["S2"]).num_rows
    assert one.sql("SELECT count(*) FROM events").fetchall() == [(n_events,)]
    both = hybridmem.open_lineage(sim_traces["S2"], sim_traces["D0"])
    rows = dict(both.sql("SELECT organization, count(*) FROM events GROUP BY 1").fetchall())
    assert rows["S2"] == n_events and set(rows) == {"S2", "D0"}
    assert rows["D0"] != rows["S2"]  # control: the runs are told apart, not duplicated


def test_a_total_is_planned_as_plan_total_plans_it() -> None:
    from hybridmem.budget import parse_total, plan_total

    u = hybridmem.model_units("falcon-h1-7b")
    want = plan_total(u, parse_total("12GiB", u), 0.5)
    assert hybridmem.plan("falcon-h1-7b", total="12GiB", attention_fraction=0.5) == want
    assert hybridmem.plan("falcon-h1-7b", total="8GiB", attention_fraction=0.5) != want  # control

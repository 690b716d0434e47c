"""Budget planner: Table B-2 (three budgets, four organizations, every byte count)."""

import pytest

from hybridmem.budget import parse_budget, parse_size, plan_budget
from hybridmem.errors import BudgetError
from hybridmem.geometry import PRESETS
from hybridmem.units import derive_units

U = derive_units(PRESETS["falcon-h1-7b"])

# Table B-2: budget, nominal, overrides D0/S0/S1/S2, D0 attention, D0 recurrent, D0 total,
# S0 bytes, S1/S2 bytes.
TABLE_B2 = [
    ("b63", 101_154_816, (63, 63, 193, 193), 53_346_304, 46_236_672, 99_582_976,
     100_445_184, 101_187_584),
    ("b83", 133_267_456, (83, 84, 254, 254), 70_270_976, 62_180_352, 132_451_328,
     133_926_912, 133_169_152),
    ("b108", 173_408_256, (108, 109, 331, 331), 91_439_104, 81_312_768, 172_751_872,
     173_786_112, 173_539_328),
]


@pytest.mark.parametrize("row", TABLE_B2, ids=[r[0] for r in TABLE_B2])
def test_table_b2(row):
    label, nominal, (d0_n, s0_p, s1_p, s2_p), d0_a, d0_r, d0_t, s0_b, s12_b = row
    plan = plan_budget(U, parse_budget(label, U))
    assert plan.budget.nominal_bytes == nominal
    assert nominal == d0_n * 1_605_632  # D0's override is the label itself
    assert (plan.s0.pages, plan.s1.pages, plan.s2.pages) == (s0_p, s1_p, s2_p)
    assert plan.d0 is not None
    assert (plan.d0.attention_bytes, plan.d0.recurrent_bytes, plan.d0.bytes) == (d0_a, d0_r, d0_t)
    assert (plan.s0.bytes, plan.s1.bytes, plan.s2.bytes) == (s0_b, s12_b, s12_b)


def test_whole_model_bytes_multiply_by_layers():
    d = plan_budget(U, parse_budget("b63", U)).as_dict()
    assert d["orgs"]["S0"]["model_bytes"] == 100_445_184 * 44


def test_sizes_and_labels():
    assert parse_size("96MiB") == 96 * 2**20
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("100MB") == 100_000_000
    assert parse_budget("101154816", U).nominal_bytes == 101_154_816
    for bad in ("b0", "b-3", "bx", "0", "-5", "12XB", "", "0.5"):
        with pytest.raises(BudgetError):
            parse_budget(bad, U)


def test_fraction_outside_unit_interval():
    for frac in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(BudgetError, match="attention fraction"):
            plan_budget(U, parse_budget("b63", U), frac)


def test_model_without_fraction_omits_d0():
    geo = PRESETS["falcon-h1-7b"]
    from dataclasses import replace
    u = derive_units(replace(geo, attention_fraction=None))
    plan = plan_budget(u, parse_budget("b63", u))
    assert plan.d0 is None and "D0" not in plan.as_dict()["orgs"]
    assert plan_budget(u, parse_budget("b63", u), 0.527383).d0 is not None

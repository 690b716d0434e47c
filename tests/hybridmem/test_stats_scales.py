"""SPEC §8: the original five comparisons test relative percentages (log ratios as a
sensitivity) and combine two looks as p_seq = min(1, 2 min(p6, p9)); paper Table E-5 values."""

import json

import pytest

from hybridmem.cli.main import main
from hybridmem.stats import StatsError, contrast, holm, two_look


def test_two_look_reproduces_table_e5():
    # comparison 1: six seeds only (5 positive, 1 negative), p6 = 4/64, no second look
    # comparisons 2, 3: p6 = 2/64 (6/6 negative), p9 = 2/512 (9/9 negative)
    # comparison 4: p_seq 0.5469 = 280/512; comparison 5: 0.1484 = 76/512
    p_seq = [two_look(4 / 64, None), two_look(2 / 64, 2 / 512), two_look(2 / 64, 2 / 512),
             two_look(None, 140 / 512), two_look(None, 38 / 512)]
    assert [round(p, 4) for p in p_seq] == [0.1250, 0.0078, 0.0078, 0.5469, 0.1484]
    assert [round(p, 4) for p in holm(p_seq)] == [0.3750, 0.0391, 0.0391, 0.5469, 0.3750]
    assert two_look(0.6, 0.9) == 1.0 and two_look(None, None) == 1.0
    with pytest.raises(StatsError):
        two_look(float("nan"), 0.5)


def test_relative_and_log_scales_differ_where_they_should():
    """Flipping a relative percentage is not swapping the arms: seeds at 3x, 3x, 2x and 0.5x
    have log ratios 1.10, 1.10, 0.69, -0.69 but relative effects +200, +200, +100, -50."""
    num = {1: 3.0, 2: 3.0, 3: 2.0, 4: 0.5}
    den = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    log = contrast(num, den, test_scale="log")
    rel = contrast(num, den, test_scale="relative")
    assert rel.test_scale == "relative" and log.test_scale == "log"
    assert (log.sign_flip_p, rel.sign_flip_p) == (0.375, 0.25)
    assert rel.effect_pct == log.effect_pct and rel.ci_pct == log.ci_pct  # only the test moves
    # all seeds one way: the exact p is the same on either scale (2 / 2^n)
    up = {s: 1.0 + 0.01 * s for s in range(1, 7)}
    one = {s: 1.0 for s in range(1, 7)}
    assert contrast(up, one, test_scale="relative").sign_flip_p == 2 / 64
    with pytest.raises(StatsError):
        contrast(up, one, test_scale="ranks")


def test_cli_test_scale_and_two_look(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text("seed,arm,value\n1,a,3\n1,b,1\n2,a,3\n2,b,1\n3,a,2\n3,b,1\n4,a,0.5\n4,b,1\n")
    assert main(["stats", "contrast", str(f), "--num", "a", "--den", "b", "--test-scale",
                 "relative", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["test_scale"] == "relative" and d["sign_flip_p"] == 0.25
    assert main(["stats", "two-look", "0.03125", "0.00390625", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["p_seq"] == 0.0078125
    assert main(["stats", "two-look", "0.0625", "-"]) == 0
    assert "= 0.125" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["stats", "two-look", "nan", "-"])

"""`hybridmem stats contrast CAMPAIGN --metric M`: a campaign's wide runs.parquet read directly,
checked against the same contrast computed by hand from the table."""

import csv
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from hybridmem.stats import contrast

CAMPAIGN = Path(__file__).resolve().parents[2] / "campaigns" / "results" / "q4_budget"


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def by_hand(metric, num, den):
    rows = pq.read_table(CAMPAIGN / "runs.parquet").to_pylist()
    pick = {k: {int(r["seed"]): r[metric] for r in rows if (r["org"], r["budget"]) == k}
            for k in (num, den)}
    return pick[num], pick[den]


def test_campaign_contrast_equals_the_one_by_hand(capsys, tmp_path):
    num, den = by_hand("throughput_tok_s", ("S2", "b63"), ("D0", "b63"))
    want = contrast(num, den).as_dict()
    code, out, err = run_cli(capsys, "stats", "contrast", CAMPAIGN, "--metric",
                             "throughput_tok_s", "--num", "org=S2,budget=b63",
                             "--den", "org=D0,budget=b63", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["n"] == 12
    for key in ("effect_pct", "mean_relative_pct", "sign_flip_p", "ci_pct"):
        assert got[key] == want[key], key
    # the same contrast through the long format the command always read
    long = tmp_path / "long.csv"
    with long.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["seed", "arm", "value"])
        for arm, vals in (("S2", num), ("D0", den)):
            w.writerows((s, arm, repr(v)) for s, v in vals.items())
    code, out2, err = run_cli(capsys, "stats", "contrast", long, "--num", "S2", "--den", "D0",
                              "--json")
    assert code == 0, err
    assert {k: v for k, v in json.loads(out2).items() if k != "contrast"} == \
        {k: v for k, v in got.items() if k != "contrast"}
    # negative control: one seed's value moved, and the hand contrast no longer matches
    seed = min(num)
    bent = contrast({**num, seed: num[seed] * 1.01}, den).as_dict()
    assert not math.isclose(bent["effect_pct"], got["effect_pct"], rel_tol=1e-9)


def test_campaign_arm_selects_one_cell_per_seed(capsys):
    code, _, err = run_cli(capsys, "stats", "contrast", CAMPAIGN, "--metric", "throughput_tok_s",
                           "--num", "S2", "--den", "D0")
    assert code == 2
    assert "several cells of seed" in err and "budget" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv,needle", [
    (["--num", "S2"], "needs --metric"),
    (["--metric", "nope", "--num", "S2"], "no metric 'nope'"),
    (["--metric", "throughput_tok_s", "--num", "org=S9"], "selects no cell"),
    (["--metric", "throughput_tok_s", "--num", "colour=red"], "no axis 'colour'"),
])
def test_campaign_refusals_are_one_line(capsys, argv, needle):
    if "--metric" not in argv:
        argv = [*argv, "--den", "D0"]
    else:
        argv = [*argv, "--den", "org=D0,budget=b63"]
    code, _, err = run_cli(capsys, "stats", "contrast", CAMPAIGN, *argv)
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err

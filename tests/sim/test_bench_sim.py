"""benchmarks/bench_sim.py: one process, many cells; its digests tell equal outcomes apart."""

import re

import pytest

from benchmarks.bench_sim import main

pytestmark = pytest.mark.vllm  # vLLM's scheduler in this process


def test_digests_repeat_for_the_same_cell_and_differ_for_another(capsys):
    assert main(["--org", "S2", "--requests", "6", "--seed", "7,8", "--runs", "2",
                 "--trace"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("run ")]
    assert len(lines) == 4  # two cells x two runs
    digests = [re.search(r"digest (\w+) events (\w+/\d+)", ln).groups() for ln in lines]
    assert digests[0] == digests[1] and digests[2] == digests[3]  # same cell: same outcome
    # negative control: another seed is another workload, so both digests differ
    assert digests[0][0] != digests[2][0] and digests[0][1] != digests[2][1]
    assert all(float(re.search(r"cpu_s ([\d.]+)", ln).group(1)) >= 0 for ln in lines)


def test_bad_seed_list_exits_2(capsys):
    assert main(["--seed", "x"]) == 2
    assert "seed must be a comma list" in capsys.readouterr().err

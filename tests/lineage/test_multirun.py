"""``lineage query RUN1 RUN2 ... --sql``: one statement over several runs, each row led by its
run and organization."""

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from lineage.table import events_to_table

from .helpers import D0, S2, adopt, enter, pub


def q(capsys, *argv):
    code = main(["lineage", "query", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def rows(out):
    lines = out.splitlines()
    head = lines[0].split("\t")
    return [dict(zip(head, ln.split("\t"), strict=True)) for ln in lines[1:]]


@pytest.mark.vllm
def test_two_simulated_runs_of_different_organizations(sim_traces, capsys):
    s2, d0 = sim_traces["S2"], sim_traces["D0"]
    sql = ("SELECT organization, run, count(*) AS episodes, sum(j_adopt) AS adopted "
           "FROM episode_lineage GROUP BY ALL ORDER BY organization")
    code, out, err = q(capsys, s2, d0, "--sql", sql)
    assert code == 0, err
    got = rows(out)
    assert [(r["organization"], r["run"]) for r in got] == [("D0", d0), ("S2", s2)]
    # each run's rows equal the same statement over that run alone (no source columns there)
    for r, path in ((got[0], d0), (got[1], s2)):
        code, one, err = q(capsys, path, "--sql", "SELECT count(*) AS episodes, "
                           "sum(j_adopt) AS adopted FROM episode_lineage")
        assert code == 0, err
        alone = rows(one)[0]
        assert (r["episodes"], r["adopted"]) == (alone["episodes"], alone["adopted"])
    # events carry the columns too
    code, out, err = q(capsys, s2, d0, "--sql", "SELECT organization, count(*) AS n FROM events "
                       "WHERE kind = 'end' GROUP BY organization ORDER BY organization")
    assert code == 0, err
    assert [(r["organization"], r["n"]) for r in rows(out)] == [("D0", "1"), ("S2", "1")]


def test_runs_are_told_apart_and_a_fault_shows(tmp_path, capsys):
    events = [pub(1, 1), pub(2, 1, rec=True), enter("a", 2, [1], [2]), adopt("a", 4, 512)]
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(events_to_table(events, S2), a)
    # negative control: the second run adopts nothing; the per-run sums must differ
    pq.write_table(events_to_table([*events[:3], adopt("a", 4, 0)], D0), b)
    sql = ("SELECT organization, sum(depth) AS adopted FROM events WHERE kind = 'adoption' "
           "GROUP BY organization ORDER BY organization")
    code, out, err = q(capsys, a, b, "--sql", sql)
    assert code == 0, err
    assert [(r["organization"], r["adopted"]) for r in rows(out)] == [("D0", "0"), ("S2", "512")]


def test_the_same_run_twice_is_refused(tmp_path, capsys):
    a = tmp_path / "a.parquet"
    pq.write_table(events_to_table([pub(1, 1)], S2), a)
    code, _, err = q(capsys, a, a, "--sql", "SELECT 1")
    assert code == 2 and "given twice" in err and len(err.splitlines()) == 1

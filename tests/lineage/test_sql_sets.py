"""The current lineage SQL (lineage/sql) and the reference set (lineage/sql/reference, the first
ASOF-join formulation, frozen) give the same rows in every public view, on varied simulated and
random traces, including step regressions and supply rows of unknown step; a corrupted event
changes the answer (negative control)."""


import pyarrow as pa
import pyarrow.compute as pc
import pytest

from hybridmem.events import Cause
from lineage import views
from lineage.synth import D0_SYNTH, SynthConfig, synthesize
from lineage.table import events_to_table

from .helpers import S2, adopt, enter, loss, pub, regressed
from .test_agreement import _random_events

PUBLIC = ("episodes", "episode_lineage", "depth_changes", "class_counts", "run_summary",
          "loss_causes", "table_checks")


def _canon(value):
    return round(value, 9) if isinstance(value, float) else value


def answers(table: pa.Table, sql: str) -> dict[str, list[tuple]]:
    """Every public view's rows (sorted, floats rounded) computed by the SQL set ``sql``."""
    con = views.connect(table, materialize=True, threads=1, sql=sql)
    out = {}
    for name in PUBLIC:
        rows = [tuple(_canon(v) for v in r) for r in con.sql(f"SELECT * FROM {name}").fetchall()]
        out[name] = sorted(rows, key=repr)
    con.close()
    return out


def assert_same(table: pa.Table) -> dict[str, list[tuple]]:
    cur, ref = answers(table, "current"), answers(table, "reference")
    for name in PUBLIC:
        assert cur[name] == ref[name], f"{name}: current and reference SQL differ"
    return cur


SYNTH = [
    ("S2", dict(requests=250, seed=5, arrival_rate=1.0)),
    ("S2-tight", dict(requests=200, seed=11, arrival_rate=1.6, pool_units=160, contexts=3)),
    ("D0", dict(requests=100, seed=5, arrival_rate=1.0, **D0_SYNTH)),
]


@pytest.mark.parametrize("name,kw", SYNTH, ids=[s[0] for s in SYNTH])
def test_current_sql_equals_reference_on_simulated_runs(name, kw):
    table = synthesize(SynthConfig(**kw))
    cur = assert_same(table)
    classes = {r[8] for r in cur["episode_lineage"]}
    assert {"zero->zero", "positive-equal", "shallower"} <= classes, classes
    assert cur["depth_changes"], "the run should move some waiting episode's J"


@pytest.mark.parametrize("seed", range(12), ids=lambda s: f"seed{s}")
def test_current_sql_equals_reference_on_random_traces(seed):
    assert_same(events_to_table(_random_events(seed, S2), S2))


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"seed{s}")
def test_current_sql_equals_reference_with_step_regressions(seed):
    """Supply rows whose step goes back, is -1 or (odd seeds) NULL: the fast lookup must step
    aside (supply_ordered) and the general one give the reference's answer."""
    table = regressed(events_to_table(_random_events(seed, S2), S2), seed)
    cur = assert_same(table)
    assert cur["table_checks"][0][-1] >= 0


def test_regressions_are_counted_alike():
    # steps by seq among supply rows: 1 1 2 1 3 0 -> the 4th (1 after 2) and the 6th regress
    events = [pub(1, 1), pub(2, 1), pub(3, 2), loss(1, 1), pub(4, 3), loss(2, 0),
              enter("a", 3, [1, 2], [7]), pub(7, 3, rec=True), adopt("a", 4, 0)]
    cur = assert_same(events_to_table(events, S2))
    checks = dict(zip(["events", "first_seq", "last_seq", "seq_gaps", "duplicate_seqs",
                       "end_records", "supply_step_regressions"], cur["table_checks"][0],
                      strict=True))
    assert checks["supply_step_regressions"] == 2


def _seq_checks(seqs: list[int | None]) -> tuple[int, int, int]:
    """(distinct seqs, seq_gaps, duplicate_seqs) of table_checks over ``seqs``, both sets
    agreeing; the distinct count is read back from the gaps."""
    events = [pub(h, 0) for h in range(len(seqs))]
    table = events_to_table(events, S2)
    table = table.set_column(table.column_names.index("seq"), "seq", pa.array(seqs, pa.int64()))
    cur = assert_same(table)
    events_n, first, last, gaps, dups = cur["table_checks"][0][:5]
    return events_n - dups, gaps, dups


# dense (one 65,536-bit slice per seq >> 16, across slice edges and negative seqs) and sparse
# (a hash of every seq) distinct counts; duplicates, gaps and NULL seqs
SEQ_CASES = {
    "dense": [0, 1, 1, 2, 5, 65535, 65536, 65536, 70000, None],
    "dense-negative": [-70000, -65537, -65536, -1, -1, 0, 3],
    "sparse": [0, 1, 1, 1 << 40, (1 << 40) + 7, 1 << 50, 1 << 50],
}


@pytest.mark.parametrize("name", SEQ_CASES)
def test_distinct_seqs_are_counted_in_dense_and_sparse_ranges(name):
    seqs = SEQ_CASES[name]
    known = [s for s in seqs if s is not None]
    distinct = len(set(known))
    assert _seq_checks(seqs) == (distinct, max(known) - min(known) + 1 - distinct,
                                 len(seqs) - distinct)
    # negative control: one duplicate made distinct changes the count
    first_dup = next(i for i, s in enumerate(seqs) if s is not None and seqs.index(s) < i)
    fixed = list(seqs)
    fixed[first_dup] = max(known) + 1
    assert _seq_checks(fixed)[2] == len(seqs) - distinct - 1


def test_a_corrupted_event_changes_the_answer():
    """Negative control: turning one depth-decreasing loss into an unrelated record changes
    the current SQL's answer, so the equalities above are not vacuous; both sets still agree on
    the corrupted table."""
    table = synthesize(SynthConfig(requests=250, seed=5, arrival_rate=1.0))
    good = answers(table, "current")
    con = views.connect(table, materialize=True, threads=1)
    seq = con.sql("SELECT min(seq) FROM depth_changes WHERE kind = 'loss'").fetchall()[0][0]
    con.close()
    assert seq is not None
    kinds = pc.if_else(pc.equal(table.column("seq"), seq), "allocation", table.column("kind"))
    bad_table = table.set_column(table.column_names.index("kind"), "kind", kinds)
    bad = assert_same(bad_table)
    assert bad["depth_changes"] != good["depth_changes"]
    assert bad["episode_lineage"] != good["episode_lineage"]
    assert bad["loss_causes"] != good["loss_causes"]


def test_unknown_sql_set_is_refused():
    with pytest.raises(ValueError, match="no lineage SQL set 'nope'"):
        views.connect(events_to_table([pub(1, 0)], S2), sql="nope")


def test_eviction_cause_is_kept_by_both():
    events = [pub(1, 0), pub(7, 0, rec=True), enter("a", 1, [1], [7]),
              loss(1, 1, cause=Cause.EVICTION, requester=""), adopt("a", 2, 0)]
    cur = assert_same(events_to_table(events, S2))
    assert [r[0] for r in cur["loss_causes"]] == ["eviction"]


def _public(con) -> dict[str, list[tuple]]:
    out = {}
    for name in PUBLIC:
        rows = [tuple(_canon(v) for v in r) for r in con.sql(f"SELECT * FROM {name}").fetchall()]
        out[name] = sorted(rows, key=repr)
    return out


def test_key_partitions_give_the_same_rows():
    """``_chain_validity`` computed in 3 key partitions (what ``connect_parquet`` does past 10M
    events) gives the same rows in every public view as in one. Negative control: keeping
    only partition 0 of 3 (a harness that skipped the others) changes the answer."""
    import duckdb

    from lineage.table import table_meta

    table = synthesize(SynthConfig(requests=120, seed=11, arrival_rate=1.6, pool_units=160,
                                   contexts=3))
    answer = {}
    for parts in (1, 3):
        con = views.connect(table, materialize=True, threads=1, parts=parts)
        answer[parts] = _public(con)
        con.close()
    assert answer[3] == answer[1]
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.register("events", table)

    def skip_parts(name: str) -> None:
        if name == "_chain":  # created just before _chain_validity is materialized
            con.execute("UPDATE _params SET parts = 3, part = 0")

    views.create_views(con, table_meta(table), views.HEAVY, on_view=skip_parts)
    assert _public(con)["episode_lineage"] != answer[1]["episode_lineage"]
    con.close()
    with pytest.raises(ValueError, match="parts > 1 needs"):
        views.connect(table, parts=3)

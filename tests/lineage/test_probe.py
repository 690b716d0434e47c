"""``lineage.probe.probe_rows`` (the NumPy sort-and-search behind the materialized
``_chain_probe``) gives exactly the rows of the view's SQL (its ASOF join), on simulated and
random traces, with step regressions and NULL steps, in key partitions, and on the exact
dense-id path; it steps aside (None, the SQL runs) where the sort would order rows differently
from the view's window. Negative control: a probe that forgets the sentinel after an entry's last
supply row gives different rows."""


import pyarrow as pa
import pytest

from lineage import entry_order, probe, views
from lineage.synth import D0_SYNTH, SynthConfig, synthesize
from lineage.table import events_to_table

from .helpers import S2, adopt, enter, loss, pub, regressed, repeated_seq_table
from .test_agreement import _random_events


def _sorted(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=repr)


def sql_and_fast(table: pa.Table, parts: int = 1, done: dict | None = None
                 ) -> tuple[list[tuple], list[tuple] | None]:
    """(the view's rows by its SQL, the same by ``probe_rows`` part by part, sharing ``done``
    as the harness does; None if it stepped aside)."""
    con = views.connect(table, materialize=True, threads=1, accelerate=False)
    want = _sorted(con.sql("SELECT * FROM _chain_probe").fetchall())
    got: list[tuple] = []
    con.execute("UPDATE _params SET parts = ?", [parts])
    for part in range(parts):
        con.execute("UPDATE _params SET part = ?", [part])
        rows = probe.probe_rows(con, done)
        if rows is None:
            con.close()
            return want, None
        con.register("_fast", rows)
        got += con.sql("SELECT * FROM _fast").fetchall()
        con.unregister("_fast")
    con.close()
    return want, _sorted(got)


def _regressed(seed: int) -> pa.Table:
    return regressed(events_to_table(_random_events(seed, S2), S2), seed)


TABLES = {
    "S2": lambda: synthesize(SynthConfig(requests=250, seed=5, arrival_rate=1.0)),
    "S2-tight": lambda: synthesize(SynthConfig(requests=200, seed=11, arrival_rate=1.6,
                                               pool_units=160, contexts=3)),
    "D0": lambda: synthesize(SynthConfig(requests=100, seed=5, arrival_rate=1.0, **D0_SYNTH)),
    **{f"random{s}": (lambda s=s: events_to_table(_random_events(s, S2), S2))
       for s in range(6)},
    **{f"regressed{s}": (lambda s=s: _regressed(s)) for s in range(4)},
}


@pytest.mark.parametrize("name", TABLES)
def test_probe_rows_equal_the_sql(name):
    want, got = sql_and_fast(TABLES[name]())
    assert got is not None, "the NumPy probe stepped aside"
    assert want, "the trace should have chain positions"
    assert got == want


@pytest.mark.parametrize("parts", [2, 3])
def test_probe_rows_in_key_partitions(parts):
    """Part by part, with and without the chain positions kept across partitions (dropped
    after the last)."""
    done: dict = {}
    want, got = sql_and_fast(TABLES["S2-tight"](), parts, done)
    assert got == want
    assert done == {}
    assert sql_and_fast(TABLES["S2-tight"](), parts)[1] == want


def test_dense_id_path(monkeypatch):
    """With the top-bits key off (as when the seq range leaves too few bits) the dense ids give
    the same rows."""
    monkeypatch.setattr(entry_order, "_TRY_TOP_BITS", False)
    want, got = sql_and_fast(TABLES["S2-tight"]())
    assert got == want


def test_colliding_top_bits_are_sorted_by_the_full_hash():
    """Two entries whose hashes share every top bit the key keeps, their rows interleaved by
    seq: the collision is seen, their block sorted again by the full hash, and both entries
    keep their own state."""
    a, b = 5 << 40, (5 << 40) + 1  # equal above bit 40
    events = [pub(a, 0), pub(b, 0), loss(a, 1), enter("x", 2, [a], []), enter("y", 2, [b], []),
              adopt("x", 3, 0), adopt("y", 3, 0)]
    table = events_to_table(events, S2)
    want, got = sql_and_fast(table)
    assert got == want
    valid = {r[3]: r[8] for r in got}  # hash -> valid_entry
    assert valid == {a: False, b: True}


def test_sentinel_fault_changes_the_rows(monkeypatch):
    """Negative control: a probe that reads an entry whose supply rows all precede the cut as
    "no supply rows" differs from the SQL, and the report differs with it."""
    table = TABLES["S2"]()
    want, _ = sql_and_fast(table)
    monkeypatch.setattr(probe, "_FAULT_NO_SENTINEL", True)
    _, bad = sql_and_fast(table)
    assert bad is not None and bad != want
    con = views.connect(table, materialize=True, threads=1)
    bad_lineage = _sorted(con.sql("SELECT * FROM episode_lineage").fetchall())
    con.close()
    monkeypatch.setattr(probe, "_FAULT_NO_SENTINEL", False)
    con = views.connect(table, materialize=True, threads=1)
    good_lineage = _sorted(con.sql("SELECT * FROM episode_lineage").fetchall())
    con.close()
    assert bad_lineage != good_lineage


def test_repeated_seq_of_one_entry_steps_aside():
    """Two supply rows of one entry at the same seq: the view's window orders them arbitrarily,
    so the probe returns None and the harness runs the SQL."""
    _, got = sql_and_fast(repeated_seq_table())
    assert got is None


def _validity(table: pa.Table, accelerate: bool) -> tuple[list[tuple], set[str]]:
    """``_chain_validity``'s rows, and which views the Python functions computed."""
    used: set[str] = set()
    real = dict(views.ACCELERATED)

    def spy(name):
        def run(con, done):
            rows = real[name](con, done)
            if rows is not None:
                used.add(name)
            return rows
        return run

    try:
        for name in real:
            views.ACCELERATED[name] = spy(name)
        con = views.connect(table, materialize=True, threads=1, accelerate=accelerate)
        rows = _sorted(con.sql("SELECT * FROM _chain_validity").fetchall())
        con.close()
    finally:
        views.ACCELERATED.update(real)
    return rows, used


@pytest.mark.parametrize("name", ["S2-tight", "D0", "random1", "regressed0", "regressed1"])
def test_chain_validity_rows_equal_the_sql(name):
    table = TABLES[name]()
    want, used = _validity(table, accelerate=False)
    got, used = _validity(table, accelerate=True)
    assert used == {"_supply", "_chain_probe", "_chain_validity"}
    assert got == want


def test_skipping_the_general_lookups_changes_the_validity(monkeypatch):
    """Negative control: unsettled positions left with their entry-cut answers differ."""
    table = TABLES["S2-tight"]()
    want, _ = _validity(table, accelerate=False)
    con = views.connect(table, materialize=True, threads=1, accelerate=False)
    (unsettled,), = con.sql("SELECT count(*) FROM _chain_probe WHERE NOT settled").fetchall()
    con.close()
    assert unsettled > 0
    monkeypatch.setattr(probe, "_FAULT_SKIP_REST", True)
    bad, _ = _validity(table, accelerate=True)
    assert bad != want


def test_small_pages_restores_the_huge_page_advice():
    import numpy as np

    setter = np._core.multiarray._set_madvise_hugepage
    before = setter(True)
    try:
        with entry_order.small_pages():
            assert setter(False) is False  # off inside
        assert setter(True) is True  # back on after
    finally:
        setter(before)

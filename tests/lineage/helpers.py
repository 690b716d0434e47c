"""Hand-built event tables for the lineage tests: events in order (seq = position)."""

from __future__ import annotations

import random

import pyarrow as pa

from hybridmem.events import Cause, Event, EventKind, StateKind
from lineage import views
from lineage.replay import compare, replay
from lineage.table import events_to_table

S2 = {"organization": "S2", "attention_grid_tokens": 512, "recurrent_grid_tokens": 512}
D0 = {"organization": "D0", "attention_grid_tokens": 16, "recurrent_grid_tokens": 1792}


def pub(h, step, rec=False, rid="p", depth=0):
    return Event(EventKind.PUBLICATION, step=step, request_id=rid, hash=h, depth=depth,
                 state_kind=StateKind.RECURRENT if rec else StateKind.ATTENTION)


def loss(h, step, rec=False, cause=Cause.ALLOCATION, requester="other"):
    return Event(EventKind.LOSS, step=step, hash=h, cause=cause, requester=requester,
                 state_kind=StateKind.RECURRENT if rec else StateKind.ATTENTION)


def enter(rid, step, chain, rchain, pc=0):
    return Event(EventKind.WAITING_ENTRY, step=step, request_id=rid, preemption_count=pc,
                 chain=tuple(chain), recurrent_chain=tuple(rchain))


def adopt(rid, step, depth, pc=0):
    return Event(EventKind.ADOPTION, step=step, request_id=rid, preemption_count=pc, depth=depth)


class Lineage:
    """SQL rows by (request, count), the replay, their agreement, and the connection."""

    def __init__(self, events, meta=S2, table=None):
        self.table = table if table is not None else events_to_table(events, meta)
        self.con = views.connect(self.table, materialize=True)
        rel = self.con.sql("SELECT * FROM episode_lineage")
        rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
        self.rows = {(r["request_id"], r["preemption_count"]): r for r in rows}
        self.replay = replay(self.table)
        self.agreement = compare(rows, self.replay)

    def __getitem__(self, key):
        return self.rows[key if isinstance(key, tuple) else (key, 0)]

    def query(self, sql, params=None):
        rel = self.con.execute(sql, params or [])
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]

    def assert_agree(self):
        a = self.agreement
        assert a.complete, f"SQL vs replay: {a.agree}/{a.episodes}, details " \
                           f"{a.details_agree}; first differences {a.disagreements}"


def regressed(table: pa.Table, seed: int) -> pa.Table:
    """``table`` with a quarter of its supply rows' steps sent back, set to -1 or (odd seeds)
    NULL."""
    steps = table.column("step").to_pylist()
    kinds = table.column("kind").to_pylist()
    rng = random.Random(seed)
    for i, k in enumerate(kinds):
        if k in ("publication", "loss") and rng.random() < 0.25:
            r = rng.random()
            steps[i] = -1 if r < 0.3 else None if r < 0.4 and seed % 2 else \
                max(0, steps[i] - rng.randint(1, 3))
    return table.set_column(table.column_names.index("step"), "step",
                            pa.array(steps, pa.int64()))


def repeated_seq_table() -> pa.Table:
    """Two supply rows of one entry at the same seq (their window order is arbitrary)."""
    table = events_to_table([pub(1, 0), loss(1, 0), enter("a", 1, [1], []), adopt("a", 2, 0)],
                            S2)
    seqs = table.column("seq").to_pylist()
    seqs[1] = seqs[0]
    return table.set_column(table.column_names.index("seq"), "seq", pa.array(seqs, pa.int64()))

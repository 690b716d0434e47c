"""The rows of the ``_chain_probe`` view (lineage/sql/_chain_probe.sql) without its ASOF join:
one sort of the supply rows by (entry, seq) and a binary search per chain position.

The view asks, per chain position (episode ``ep``, entry ``(is_rec, hash)``, cut
``entry_seq``), for the entry's first supply row at or after the cut (row n+1) and reads its
columns and row n's. Over the supply rows of one ``is_rec`` sorted by ``(hash, seq)``:

    sorted hashes   h:  7 7 7 9 9        lo = first row of the entry = searchsorted(h, hash)
    seqs            s:  3 8 20 5 11      cnt = rows of the entry
    key             k = lo << SH | (s - base)   (increasing: entries are contiguous, seqs
                                                  increase inside one)
    row n+1         i = searchsorted(k, lo << SH | (entry_seq - base));  n = i - lo
                    (n = cnt: none, the view's sentinel after the entry's last row)

``probe_rows`` returns the view's rows for the key partition in ``_params`` (same columns and
types; row order is not part of a view), or None where the packing does not fit or the data
has what the sort would order differently from the view's window (a NULL or repeated seq of one
entry, a NULL cut): the harness then runs the SQL. DuckDB's ASOF join of ~800k positions
against ~790k supply rows costs ~0.75 CPU-s; this, ~0.2 (the history of benchmarks/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lineage.entry_order import as_numpy, entry_order, valid_mask

# the entries and their flattened chain positions, kept in ``done`` across key partitions
_ENTRIES, _POSITIONS = "#probe entries", "#probe chain positions"

# tests set this to check that a wrong probe changes the answer (negative control): the entry's
# state after its last supply row is then taken as "no supply rows" (valid_entry false)
_FAULT_NO_SENTINEL = False
# likewise: chain_validity_rows then keeps the unsettled positions' entry-cut answers
_FAULT_SKIP_REST = False


def chain_positions(entries: pa.Table, ga: int, gr: int) -> dict[str, np.ndarray]:
    """The ``_chain`` view's rows as columns (NULL keys dropped, as the view's
    ``hash % parts = part`` drops them)."""
    rec_len = pc.list_value_length(entries["recurrent_chain"]).combine_chunks()
    rec_len_np = as_numpy(rec_len, np.int64)
    out: dict[str, list[np.ndarray]] = {k: [] for k in
                                        ("row", "is_rec", "pos", "hash", "end", "reach")}
    for is_rec, col in ((False, "chain"), (True, "recurrent_chain")):
        lists = entries[col].combine_chunks()
        if len(lists) == 0:
            continue
        parent = np.asarray(pc.list_parent_indices(lists).to_numpy(), np.int64)
        flat = pc.list_flatten(lists)
        offsets = np.asarray(lists.offsets.to_numpy(), np.int64)
        pos = np.arange(len(flat), dtype=np.int64) + offsets[0] - offsets[parent]
        keep = valid_mask(flat)
        hashes = as_numpy(flat, np.uint64)
        if not keep.all():
            parent, pos, hashes = parent[keep], pos[keep], hashes[keep]
        grid = gr if is_rec else ga
        out["row"].append(parent)
        out["is_rec"].append(np.full(len(pos), is_rec))
        out["pos"].append(pos)
        out["hash"].append(hashes)
        out["end"].append((pos + 1) * grid)
        out["reach"].append(np.ones(len(pos), bool) if is_rec
                            else pos < rec_len_np[parent] * (gr // ga))
    types = {"row": np.int64, "is_rec": bool, "pos": np.int64, "hash": np.uint64,
             "end": np.int64, "reach": bool}
    return {k: np.concatenate(v).astype(types[k], copy=False) if v else np.empty(0, types[k])
            for k, v in out.items()}


def probe_rows(con: duckdb.DuckDBPyConnection, done: dict[str, pa.Table] | None = None
               ) -> pa.Table | None:
    """``SELECT * FROM _chain_probe`` for the partition in ``_params``, computed in NumPy
    (None: not applicable, run the SQL).

    The supply rows and the chain positions are sorted together by (entry, seq, supply after
    chain), one ``argsort``; a chain position's row n+1 is then the next supply row in that
    order, and n the supply rows between its entry's first row and it:

        entry 7:   sup(3)  sup(8)  CHAIN(cut 10)  sup(20)     n = 2, row n+1 = sup(20)
    """
    ((ga, gr, parts, part),) = con.execute(
        "SELECT attention_grid_tokens, recurrent_grid_tokens, parts, part FROM _params"
    ).fetchall()
    ((ordered,),) = con.execute("SELECT ordered FROM _supply_ordered").fetchall()
    wanted = ["is_rec", "hash", "seq", "step", "is_pub", "request_id"]
    if done is not None and "_supply" in done:  # computed in Python: read in place
        sup = done["_supply"].select(wanted)
        if parts > 1:
            keep = as_numpy(sup["hash"], np.uint64) % np.uint64(parts) == np.uint64(part)
            keep &= valid_mask(sup["hash"])
            sup = sup.filter(pa.array(keep))
        elif sup["hash"].null_count:
            sup = sup.filter(pc.is_valid(sup["hash"]))
    else:
        sup = con.sql(
            "SELECT s.is_rec, s.hash, s.seq, s.step, s.is_pub, s.request_id FROM _supply AS s "
            "CROSS JOIN _params AS p WHERE s.hash % p.parts = p.part").to_arrow_table()
    if ga <= 0 or gr <= 0 or sup["seq"].null_count or sup["is_rec"].null_count:
        return None
    if done is not None and _ENTRIES in done:  # an earlier partition's
        ent, c_all = done[_ENTRIES], done[_POSITIONS]
        c = {k: as_numpy(c_all[k], bool if k in ("is_rec", "reach") else
                    np.uint64 if k == "hash" else np.int64) for k in c_all.column_names}
    else:
        ent = con.sql(
            "SELECT ep, request_id, entry_seq, chain, recurrent_chain, has_window, adopt_seq, "
            "adopt_step FROM _entries").to_arrow_table()
        if ent["entry_seq"].null_count:
            return None
        c = chain_positions(ent, ga, gr)
        if done is not None and parts > 1:  # kept for the next partitions, then dropped
            done[_ENTRIES] = ent.drop_columns(["chain", "recurrent_chain"])
            done[_POSITIONS] = pa.table(c)
    if done is not None and part == parts - 1:
        done.pop(_ENTRIES, None)
        done.pop(_POSITIONS, None)
    if parts > 1:
        keep = c["hash"] % np.uint64(parts) == np.uint64(part)
        c = {k: v[keep] for k, v in c.items()}
    return probe_table(sup, entry_arrays(ent), c, bool(ordered))


@dataclass(frozen=True, slots=True)
class EntryArrays:
    """The ``_entries`` columns the probe reads, one element per episode row, extracted once
    (a key partition gathers them by its positions' ``row``)."""

    ep: np.ndarray
    entry_seq: np.ndarray
    adopt_seq: np.ndarray
    adopt_seq_ok: np.ndarray  # has a window and an adoption seq
    adopt_step: np.ndarray  # -1 where NULL
    adopt_step_ok: np.ndarray  # has a window and an adoption step >= 0
    request_id: pa.Array


def entry_arrays(ent: pa.Table) -> EntryArrays:
    """From ``_entries``' ``ep, request_id, entry_seq, has_window, adopt_seq, adopt_step``."""
    win = as_numpy(ent["has_window"], bool, 0) & valid_mask(ent["has_window"])
    step = as_numpy(ent["adopt_step"], np.int64, -1)
    return EntryArrays(
        ep=as_numpy(ent["ep"], np.int64), entry_seq=as_numpy(ent["entry_seq"], np.int64),
        adopt_seq=as_numpy(ent["adopt_seq"], np.int64),
        adopt_seq_ok=win & valid_mask(ent["adopt_seq"]), adopt_step=step,
        adopt_step_ok=win & valid_mask(ent["adopt_step"]) & (step >= 0),
        request_id=ent["request_id"].combine_chunks())


def probe_table(sup: pa.Table, ent: EntryArrays, c: dict[str, np.ndarray], ordered: bool
                ) -> pa.Table | None:
    """The ``_chain_probe`` rows of the chain positions ``c`` (``chain_positions``' columns;
    ``row`` indexes ``ent``, the ``_entries`` rows' columns) against ``sup``, the
    supply rows (``is_rec, hash, seq, step, is_pub, request_id``; no NULL hash) of every entry
    the positions name. ``ordered``: ``_supply_ordered``. None: the sort would order rows
    differently from the view's window."""
    if sup["seq"].null_count or sup["is_rec"].null_count:
        return None
    row = c["row"]
    nc, m = len(row), sup.num_rows
    s_rec = as_numpy(sup["is_rec"], bool)
    s_hash = as_numpy(sup["hash"], np.uint64)
    s_seq = as_numpy(sup["seq"], np.int64)
    e_seq = ent.entry_seq[row]
    sorted_ = entry_order(np.concatenate([s_rec, c["is_rec"]]),
                          np.concatenate([s_hash, c["hash"]]),
                          np.concatenate([s_seq, e_seq]), m)
    del e_seq
    if sorted_ is None:
        return None
    order, ek_o, same = sorted_
    is_sup = order < m
    before = np.cumsum(is_sup)
    before -= is_sup  # supply rows before each row of the merged order
    new = np.ones(len(order), bool)
    np.logical_not(same, out=new[1:])
    del same
    lo = np.where(new, before, 0)
    np.maximum.accumulate(lo, out=lo)  # its entry's first supply row
    del new
    sup_order = order[is_sup]  # supply rows sorted by (entry, seq)
    sk = ek_o[is_sup]
    if m and np.any((sk[1:] == sk[:-1]) & (np.diff(s_seq[sup_order]) == 0)):
        return None  # a repeated seq of one entry: the view's window order is arbitrary there
    ch = ~is_sup
    ci = order[ch] - m  # chain row of each chain position in merged order
    j = before[ch]  # the next supply row (row n+1) if it is of the same entry
    n_o = j - lo[ch]
    ck = ek_o[ch]
    del order, ek_o, before, lo, is_sup, ch
    # row n+1 exists when the next supply row in sorted order is of the same entry
    has_o = (j < m) & (sk[np.minimum(j, m - 1)] == ck) if m else np.zeros(len(j), bool)
    n = np.empty(nc, np.int64)
    n[ci] = n_o
    has = np.empty(nc, bool)
    has[ci] = has_o
    jj = np.empty(nc, np.int64)
    jj[ci] = j
    s_pub = as_numpy(sup["is_pub"], bool)[sup_order] if m else np.zeros(1, bool)
    s_step = as_numpy(sup["step"], np.int64)[sup_order] if m else np.zeros(1, np.int64)
    s_step_ok = valid_mask(sup["step"])[sup_order] if m else np.zeros(1, bool)
    sk_full = sk if m else np.zeros(1, np.int64)
    j = np.where(has, jj, 0)
    jm = np.where(n > 0, jj - 1, 0)  # row n
    if _FAULT_NO_SENTINEL:
        valid_entry = has & (n > 0) & s_pub[jm]
    else:
        valid_entry = (n > 0) & s_pub[jm]
    a_seq_ok = ent.adopt_seq_ok[row]
    a_seq = ent.adopt_seq[row]
    a_step_raw = ent.adopt_step[row]
    a_step_ok = ent.adopt_step_ok[row]
    s_seq_o = s_seq[sup_order] if m else np.zeros(1, np.int64)
    nx_seq, nx_step, nx_pub = s_seq_o[j], s_step[j], s_pub[j]
    nx_step_ok = s_step_ok[j]
    prev_step, prev_ok = s_step[jm], s_step_ok[jm] & (n > 0)
    jn = np.minimum(j + 1, max(m - 1, 0))
    has_next = has & (j + 1 < m) & (sk_full[jn] == sk_full[j])
    next_step, next_ok = s_step[jn], has_next & s_step_ok[jn]
    # row n+1 published in the lookup step: by a request other than the episode's?
    cand = has & nx_pub & nx_step_ok & a_step_ok & (nx_step == a_step_raw)
    other = np.zeros(nc, bool)
    cj = np.flatnonzero(cand)
    if len(cj):
        sup_req = sup["request_id"].take(pa.array(sup_order[j[cj]]))
        ep_req = ent.request_id.take(pa.array(row[cj]))
        same_req = pc.fill_null(pc.equal(sup_req, ep_req), False)
        other[cj] = ~np.asarray(same_req.to_numpy(zero_copy_only=False), bool)
    npbo = cand & other
    exact_ok = ~a_seq_ok | ~has | (nx_seq >= a_seq)
    step_ok = ~a_step_ok | (
        bool(ordered)
        & (~prev_ok | (prev_step < a_step_raw))
        & (~has | ~nx_step_ok | (nx_step > a_step_raw)
           | (nx_step_ok & (nx_step == a_step_raw)
              & ((nx_pub & other) | ~next_ok | (next_step != a_step_raw)))))
    settled = exact_ok & step_ok
    ep = ent.ep[row]
    return pa.table({
        "ep": pa.array(ep, pa.int64()),
        "is_rec": pa.array(c["is_rec"]),
        "pos": pa.array(c["pos"]),
        "hash": pa.array(c["hash"]),
        "end_tokens": pa.array(c["end"]),
        "in_reach": pa.array(c["reach"]),
        "adopt_seq": pa.array(a_seq, pa.int64(), mask=~a_seq_ok),
        "adopt_step": pa.array(a_step_raw, pa.int64(), mask=~a_step_ok),
        "valid_entry": pa.array(valid_entry),
        "supply_before_entry": pa.array(n),
        "next_published_by_other": pa.array(npbo),
        "settled": pa.array(settled),
    })


def chain_validity_rows(con: duckdb.DuckDBPyConnection, done: dict[str, pa.Table] | None = None
                        ) -> pa.Table | None:
    """``SELECT * FROM _chain_validity`` from the Python-computed ``_chain_probe``: every
    position's row as the view's first branch projects it (in Arrow), the unsettled ones'
    lookup columns then overwritten by ``_chain_rest``'s rows (its SQL; matched on (ep, is_rec,
    pos)). None where the probe was not computed in Python."""
    if done is None or "_chain_probe" not in done:
        return None
    p = done["_chain_probe"]
    cols = validity_columns(p)
    unsettled = np.flatnonzero(~as_numpy(p["settled"], bool))
    if len(unsettled) and not _FAULT_SKIP_REST:
        rest = con.sql("SELECT * FROM _chain_rest").to_arrow_table()
        if rest.num_rows != len(unsettled):
            return None
        ep_all, pos_all = as_numpy(p["ep"], np.int64), as_numpy(p["pos"], np.int64)
        rec_all = as_numpy(p["is_rec"], bool)
        mine = unsettled[np.lexsort((pos_all[unsettled], rec_all[unsettled], ep_all[unsettled]))]
        theirs = np.lexsort((as_numpy(rest["pos"], np.int64), as_numpy(rest["is_rec"], bool),
                             as_numpy(rest["ep"], np.int64)))
        for k, mine_k in (("ep", ep_all), ("is_rec", rec_all), ("pos", pos_all)):
            if not np.array_equal(mine_k[mine], as_numpy(rest[k], mine_k.dtype.type)[theirs]):
                return None
        for name in ("valid_exact", "supply_before_adopt", "valid_m0", "valid_m1"):
            typ = pa.int64() if name == "supply_before_adopt" else pa.bool_()
            full = as_numpy(cols[name], np.int64 if typ == pa.int64() else bool).copy()
            ok = valid_mask(cols[name])
            full[mine] = as_numpy(rest[name], full.dtype.type)[theirs]
            ok[mine] = valid_mask(rest[name])[theirs]
            cols[name] = pa.array(full, typ, mask=~ok)
    return pa.table(cols)


def validity_columns(p: pa.Table) -> dict[str, pa.ChunkedArray | pa.Array]:
    """``_chain_validity``'s columns for the probe rows ``p`` as the view's first branch projects
    them (right for the settled rows; the others are ``_chain_rest``'s)."""
    has_seq = pc.is_valid(p["adopt_seq"])
    has_step = pc.is_valid(p["adopt_step"])
    valid = p["valid_entry"]
    null_bool = pa.scalar(None, pa.bool_())
    return {
        "ep": p["ep"], "is_rec": p["is_rec"], "pos": p["pos"], "hash": p["hash"],
        "end_tokens": p["end_tokens"], "in_reach": p["in_reach"], "has_window": has_seq,
        "valid_entry": valid, "supply_before_entry": p["supply_before_entry"],
        "valid_exact": pc.if_else(has_seq, valid, null_bool),
        "supply_before_adopt": pc.if_else(has_seq, p["supply_before_entry"],
                                          pa.scalar(None, pa.int64())),
        "valid_m0": pc.if_else(has_step, valid, null_bool),
        "valid_m1": pc.if_else(has_step, pc.or_(valid, p["next_published_by_other"]),
                               null_bool),
    }

"""Pool occupancy over a run, read from its ALLOCATION events.

Every allocation attempt records ``free``: the units of its pool that an allocation may obtain
(free plus cached-but-reclaimable units, the pool's ``num_available``; vLLM's
``get_num_free_blocks()``, which counts its evictable cached blocks too). With the pool's size
from the run metadata, each attempt gives an exact two-way split of the pool::

    in use     = size - free     units an active request (or a pin) holds
    available  = free            free or cached (reclaimable) units

Under an organization only successful attempts (outcome ok) are read: an admission the adapter
refuses records the availability net of the cached units the request's own hit would adopt (D0:
both pools summed), which is not the pool's state. Under vLLM's own manager every attempt is.
Which available units still back a discoverable entry (cached) and which back nothing (free) is
not recorded: the trace holds the pool's reference transitions only per entry, not per unit, so
the split is left out rather than estimated. Between attempts the pool is not observed (a
release shows at the next attempt). Pools and sizes (metadata keys, ``tracer/FORMAT.md``)::

    S0, S1, S2   one shared pool, ``capacity.pages``       allocation state_kind none
    D0           ``capacity.attention_units``              allocation state_kind attention
                 ``capacity.recurrent_units``              allocation state_kind recurrent
    vllm         ``num_blocks`` - 1 (vLLM's null block)    allocation state_kind none
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridmem.errors import HybridMemError

# allocation state_kind -> (capacity key, pool label)
_D0_POOLS = {"attention": ("attention_units", "attention"),
             "recurrent": ("recurrent_units", "recurrent")}


class OccupancyError(HybridMemError):
    """A run whose allocation events do not fit its pools (or that names no pool size)."""


@dataclass(frozen=True, slots=True)
class PoolSeries:
    """One pool's occupancy at each allocation attempt, in trace order."""

    pool: str
    size: int
    seq: list[int]
    step: list[int]
    ts_ns: list[int]
    available: list[int]

    @property
    def in_use(self) -> list[int]:
        return [self.size - a for a in self.available]


def pool_sizes(meta: Mapping[str, Any]) -> dict[str, int]:
    """``{allocation state_kind: size}`` and the pool labels, from the run metadata; an
    :class:`OccupancyError` when the metadata names no pool size."""
    cap = meta.get("capacity")
    if isinstance(cap, Mapping) and "attention_units" in cap:
        return {kind: int(cap[key]) for kind, (key, _) in _D0_POOLS.items()}
    if isinstance(cap, Mapping) and "pages" in cap:
        return {"none": int(cap["pages"])}
    if meta.get("organization") == "vllm" and isinstance(meta.get("num_blocks"), int):
        return {"none": int(meta["num_blocks"]) - 1}
    raise OccupancyError(f"run of {meta.get('organization')!r}: its metadata names no pool size "
                         "(capacity or num_blocks), so occupancy cannot be read")


def successful_only(meta: Mapping[str, Any]) -> bool:
    """Whether only successful allocations give a pool's state: an organization's refused
    admission records a net figure (available minus what its hit would take); vLLM's stock
    manager records the pool as it is on every attempt."""
    return meta.get("organization") != "vllm"


def pool_label(meta: Mapping[str, Any], kind: str) -> str:
    if kind in _D0_POOLS:
        return _D0_POOLS[kind][1]
    return "blocks" if meta.get("organization") == "vllm" else "pages"


def occupancy(table: Any, meta: Mapping[str, Any]) -> list[PoolSeries]:
    """Each pool's series from an event table (``tracer/schema.py`` columns ``seq``, ``step``,
    ``ts_ns``, ``kind``, ``state_kind``, ``free``, ``outcome``); checked by :func:`check_series`."""
    import pyarrow.compute as pc

    sizes = pool_sizes(meta)
    rows = table.filter(pc.equal(table.column("kind"), "allocation"))
    if successful_only(meta):
        rows = rows.filter(pc.equal(rows.column("outcome"), "ok"))
    cols = {c: rows.column(c).to_pylist() for c in ("seq", "step", "ts_ns", "state_kind", "free")}
    out = []
    for kind, size in sizes.items():
        idx = [i for i, k in enumerate(cols["state_kind"]) if k == kind]
        out.append(PoolSeries(pool_label(meta, kind), size, *(
            [cols[c][i] for i in idx] for c in ("seq", "step", "ts_ns", "free"))))
    stray = sorted(set(cols["state_kind"]) - set(sizes))
    if stray:
        raise OccupancyError(f"allocation events of state kind {stray} match no pool of this "
                             f"run ({', '.join(s.pool for s in out)})")
    for s in out:
        check_series(s)
    return out


def check_series(s: PoolSeries) -> None:
    """Every point partitions the pool: ``0 <= available <= size`` and ``in use + available
    == size``; an :class:`OccupancyError` naming the first event that does not."""
    for seq, avail, used in zip(s.seq, s.available, s.in_use, strict=True):
        if not 0 <= avail <= s.size or used + avail != s.size or used < 0:
            raise OccupancyError(f"pool {s.pool} ({s.size} units): allocation event seq {seq} "
                                 f"reports {avail} available, outside the pool")

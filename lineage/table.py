"""Event tables in memory: build one from :class:`hybridmem.events.Event` objects, read its run
metadata, and check that a table has the shared columns (``tracer/schema.py``).

Sequence numbers are the events' positions (plus ``first_seq``): the order of the list *is* the
run's total order, which is what the lineage SQL and the replay both rely on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from hybridmem.errors import HybridMemError
from hybridmem.events import Event
from tracer.schema import EVENT_COLUMNS, META_KEY, arrow_schema


class EventTableError(HybridMemError):
    """An event table that lacks a column, its run metadata, or a usable grid."""


@dataclass(frozen=True, slots=True)
class RunMeta:
    """The run metadata the lineage needs (the rest of the JSON travels in ``extra``)."""

    organization: str
    attention_grid_tokens: int
    recurrent_grid_tokens: int
    extra: Mapping[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {**self.extra, "organization": self.organization,
                "attention_grid_tokens": self.attention_grid_tokens,
                "recurrent_grid_tokens": self.recurrent_grid_tokens}


def check_grid(attention_grid_tokens: int, recurrent_grid_tokens: int) -> None:
    """Both grids positive and the recurrent grid a whole number of attention blocks.

    The joint depth ``J`` is a recurrent boundary ``b`` whose attention prefix ``[0, b)`` is
    covered by whole blocks; that needs ``b / attention_grid`` to be an integer::

        D0 at Falcon-H1-7B: 1,792 = 112 x 16   ok
        S0-S2:                512 =   1 x 512 ok
    """
    ga, gr = attention_grid_tokens, recurrent_grid_tokens
    if ga <= 0 or gr <= 0:
        raise EventTableError(f"grids must be positive tokens, got attention {ga}, recurrent {gr}")
    if gr % ga:
        raise EventTableError(f"recurrent grid {gr} is not a multiple of the attention grid {ga} "
                              f"({gr} % {ga} = {gr % ga})")


MAX_GRID_TOKENS = 1 << 24


def _grid(d: Mapping[str, Any], key: str, source: str) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_GRID_TOKENS:
        raise EventTableError(f"{source}: run metadata {key} must be a whole number of tokens "
                              f"in [1, {MAX_GRID_TOKENS:,}], got {v!r:.60}")
    return v


def meta_from_json(raw: bytes | str | Mapping[str, Any], source: str = "table") -> RunMeta:
    try:
        d = dict(raw) if isinstance(raw, Mapping) else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventTableError(f"{source}: run metadata {META_KEY.decode()} is not JSON "
                              f"({exc})") from None
    except RecursionError:
        raise EventTableError(f"{source}: run metadata {META_KEY.decode()} is nested too "
                              "deeply") from None
    if not isinstance(d, dict):
        raise EventTableError(f"{source}: run metadata {META_KEY.decode()} is "
                              f"{type(d).__name__}, not an object")
    missing = [k for k in ("organization", "attention_grid_tokens", "recurrent_grid_tokens")
               if k not in d]
    if missing:
        raise EventTableError(f"{source}: run metadata {META_KEY.decode()} lacks {missing}")
    ga, gr = _grid(d, "attention_grid_tokens", source), _grid(d, "recurrent_grid_tokens", source)
    check_grid(ga, gr)
    extra = {k: v for k, v in d.items()
             if k not in ("organization", "attention_grid_tokens", "recurrent_grid_tokens")}
    return RunMeta(str(d["organization"]), ga, gr, extra)


def table_meta(table: pa.Table, source: str = "table") -> RunMeta:
    md = table.schema.metadata or {}
    if META_KEY not in md:
        raise EventTableError(f"{source}: no run metadata under schema key {META_KEY.decode()!r} "
                              "(organization and grids are needed)")
    return meta_from_json(md[META_KEY], source)


# The columns the lineage SQL and the replay read (the other shared columns, ts_ns, page, line,
# need, free and outcome, are never looked at): a report reads only these from a Parquet file.
LINEAGE_COLUMNS = ("seq", "kind", "step", "request_id", "preemption_count", "hash", "depth",
                   "state_kind", "cause", "requester", "chain", "recurrent_chain")


def check_columns(table: pa.Table, source: str = "table",
                  columns: Iterable[str] | None = None) -> None:
    """Every shared column (or, given ``columns``, each of those) present with its type; extra
    columns are allowed and ignored."""
    wanted = [c for c in EVENT_COLUMNS if columns is None or c[0] in set(columns)]
    missing = [name for name, _, _ in wanted if name not in table.column_names]
    if missing:
        raise EventTableError(f"{source}: event table lacks columns {missing}")
    import pyarrow.types as pt

    kinds = {"int64": pt.is_integer, "int32": pt.is_integer, "uint64": pt.is_integer,
             "string": lambda t: pt.is_string(t) or pt.is_large_string(t),
             "list<uint64>": lambda t: (pt.is_null(t) or (pt.is_list(t) or pt.is_large_list(t))
                                        and pt.is_integer(t.value_type))}
    for name, want, _ in wanted:
        got = table.schema.field(name).type
        if not kinds[want](got):
            raise EventTableError(f"{source}: column {name!r} has type {got}, expected {want}")


def _name(v: Any) -> str:
    return v.name.lower() if hasattr(v, "name") else str(v)


def events_to_table(events: Iterable[Event], meta: Mapping[str, Any], *,
                    first_seq: int = 0, ts_step_ns: int = 1_000) -> pa.Table:
    """An event table from events in emission order (seq = position + ``first_seq``).

    ``meta`` is the run metadata JSON object (organization, grids, ...); it is stored under
    :data:`tracer.schema.META_KEY` so the table carries its own grid.
    """
    cols: dict[str, list[Any]] = {name: [] for name, _, _ in EVENT_COLUMNS}
    for i, e in enumerate(events):
        seq = first_seq + i
        cols["seq"].append(seq)
        cols["ts_ns"].append(seq * ts_step_ns)
        cols["kind"].append(_name(e.kind))
        cols["step"].append(e.step)
        cols["request_id"].append(e.request_id)
        cols["preemption_count"].append(e.preemption_count)
        cols["hash"].append(e.hash)
        cols["depth"].append(e.depth)
        cols["state_kind"].append(_name(e.state_kind))
        cols["page"].append(e.page)
        cols["line"].append(e.line)
        cols["cause"].append(_name(e.cause))
        cols["requester"].append(e.requester)
        cols["need"].append(e.need)
        cols["free"].append(e.free)
        cols["outcome"].append(_name(e.outcome))
        cols["chain"].append(list(e.chain) if e.chain else None)
        cols["recurrent_chain"].append(list(e.recurrent_chain) if e.recurrent_chain else None)
    meta_from_json(meta)  # validate before attaching
    schema = arrow_schema().with_metadata({META_KEY: json.dumps(dict(meta)).encode()})
    return pa.Table.from_pydict(cols, schema=schema)

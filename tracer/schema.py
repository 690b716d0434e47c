"""Column schema of the exported event table (Arrow / Parquet), shared by the tracer's exporter,
the lineage SQL and outside users. ``tracer/FORMAT.md`` documents it; keep the two in step.

Enum-valued columns hold the lowercase member names of :mod:`hybridmem.events` (``"publication"``,
``"recurrent"``, ``"allocation"``, ``"ok"``) so SQL reads without lookup tables.

Run metadata travels as the Parquet/Arrow schema metadata key ``hybridmem.meta`` (JSON): at least
``organization`` ("S0".."D0" or an engine name), ``attention_grid_tokens`` and
``recurrent_grid_tokens`` (512/512 for S0-S2; 16/1792 for D0 at Falcon-H1-7B), ``seed``,
``engine``, plus the trace verdict when exported from a binary trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridmem.names import TABLE_META_KEY

if TYPE_CHECKING:
    import pyarrow as pa

# (column, arrow type name, meaning). Order is the table's column order.
EVENT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("seq", "int64", "record sequence number; total order of events within the run"),
    ("ts_ns", "int64", "monotonic timestamp, ns"),
    ("kind", "string", "event kind: waiting_entry, publication, loss, adoption, allocation, "
     "release, preemption, resume, finish, pin, unpin, retention, end"),
    ("step", "int64", "scheduler step (-1 when unknown)"),
    ("request_id", "string", "request the event is about ('' when none)"),
    ("preemption_count", "int32", "episode key with request_id: 0 INITIAL, >=1 RESUME"),
    ("hash", "uint64", "64-bit cache key of the block or checkpoint (0 when none)"),
    ("depth", "int64", "tokens: entry boundary (publication/loss), adopted joint depth "
     "(adoption), prompt length (waiting_entry)"),
    ("state_kind", "string", "none, attention, recurrent (complete checkpoint), conv"),
    ("page", "int64", "physical page/block id (-1 none)"),
    ("line", "int64", "conv slot line id 16p+s (-1 sentinel: none)"),
    ("cause", "string", "loss/release cause: none, allocation, slab_reclaim, eviction, "
     "invalidation, preemption, finish"),
    ("requester", "string", "request whose allocation caused the loss or made the attempt"),
    ("need", "int64", "blocks needed at an allocation attempt"),
    ("free", "int64", "blocks free (incl. reclaimable cached) at an allocation attempt"),
    ("outcome", "string", "none, ok, rejected, cap, below_threshold, skipped"),
    ("chain", "list<uint64>", "waiting_entry: attention boundary hash chain, one per block"),
    ("recurrent_chain", "list<uint64>", "waiting_entry: recurrent checkpoint keys, one per "
     "recurrent boundary"),
)

META_KEY = TABLE_META_KEY


def arrow_schema() -> pa.Schema:
    """The event table schema as a ``pyarrow.Schema`` (imports pyarrow lazily)."""
    import pyarrow as pa

    types = {
        "int64": pa.int64(), "int32": pa.int32(), "uint64": pa.uint64(), "string": pa.string(),
        "list<uint64>": pa.list_(pa.uint64()),
    }
    return pa.schema([pa.field(name, types[t]) for name, t, _ in EVENT_COLUMNS])

"""Import a stock vLLM KV-event stream into the event table, so publication/loss lineage runs on
engines without the hybridmem tracer.

vLLM (``vllm/distributed/kv_events.py``) publishes one ``KVEventBatch`` per scheduler step as
msgpack (msgspec), over ZMQ frames ``(topic, seq, payload)``. A file here is the payloads
written back to back (what a subscriber appends), or any iterable of payload bytes. Two
encodings exist across vLLM versions and both are read:

    array form (older, array_like=True):  [ts, [event, ...], dp_rank?]
        event = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
                 lora_id, medium, lora_name?, extra_keys?, group_idx?, spec_kind?, window?]
              | ["BlockRemoved", block_hashes, medium, group_idx?]
              | ["AllBlocksCleared"]
    map form (newer):  {"ts": .., "events": [{"type": "BlockStored", "block_hashes": ..}, ..]}

Mapping (one table row per block):

    BlockStored       -> publication, depth = parent depth + (i+1) * block_size
    BlockRemoved      -> loss, cause eviction (vLLM does not say for whom)
    AllBlocksCleared  -> a loss (cause invalidation) of every block stored and not yet removed
    step              =  the batch's position in the stream; ts_ns from the batch's ts

``state_kind`` is recurrent for groups whose ``kv_cache_spec_kind`` names a Mamba spec
(learned from BlockStored and applied to later BlockRemoved of that ``group_idx``), else
attention. Hashes (int or bytes) become 64-bit keys with :func:`hybridmem.events.hash64`.
vLLM streams carry no waiting entries or adoptions, so the lineage sees supply only: episodes
are empty and the publication/loss totals, causes and table checks are what it reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa

from hybridmem.errors import HybridMemError
from hybridmem.events import Cause, Event, EventKind, StateKind, hash64
from lineage.table import EventTableError, events_to_table

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                  "kv_cache_spec_sliding_window")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class VllmEventError(HybridMemError):
    """A payload that is not a vLLM KVEventBatch."""


@dataclass(frozen=True, slots=True)
class _Batch:
    ts: float
    events: list[tuple[str, dict[str, Any]]]


def _event(raw: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = {k: v for k, v in raw.items() if k != "type"}
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag = raw[0]
        if tag not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
            raise VllmEventError(f"unknown KV cache event type {tag!r}")
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(tag, ())
        if len(raw) - 1 > len(names):
            raise VllmEventError(f"{tag} has {len(raw) - 1} fields, expected <= {len(names)}")
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise VllmEventError(f"not a tagged KV cache event: {raw!r:.80}")
    if tag not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        raise VllmEventError(f"unknown KV cache event type {tag!r}")
    return str(tag), fields


MAX_BLOCK_SIZE = 1 << 20
MAX_STREAM_BYTES = 256 << 20  # a file past this is refused before reading (no unbounded read)
# one BlockStored/BlockRemoved covers one request's new blocks: 65,536 of them is a 1M-token
# prompt at 16 tokens per block; the event total bounds memory (a 256 MiB stream of one-byte
# hashes would otherwise become 268M events, tens of GB)
MAX_HASHES_PER_EVENT = 1 << 16
MAX_EVENTS = 5_000_000
# msgpack's own limits, so an oversized array fails while decoding, before it is built (an
# array past them is refused with ValueError, reported as a malformed stream)
UNPACK_LIMITS = {"max_array_len": 1 << 20, "max_map_len": 1 << 16, "max_str_len": 1 << 20,
                 "max_bin_len": 1 << 20}
MAX_TS = 9e9  # seconds: timestamps become int64 nanoseconds (< 9.2e18)


def _ts(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not -MAX_TS <= raw <= MAX_TS:
        raise VllmEventError(f"batch timestamp must be a finite number of seconds, got "
                             f"{raw!r:.60}")
    return float(raw)


def _int(f: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = f.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise VllmEventError(f"{key} must be an integer in [{lo:,}, {hi:,}], got {v!r:.60}")
    return v


def _hashes(f: dict[str, Any]) -> list[Any]:
    v = f.get("block_hashes")
    if isinstance(v, list | tuple) and len(v) > MAX_HASHES_PER_EVENT:
        raise VllmEventError(f"one event holds {len(v):,} block hashes, over the "
                             f"{MAX_HASHES_PER_EVENT:,} a request's blocks can be")
    if not isinstance(v, list | tuple) or not all(
            isinstance(h, bytes) or (isinstance(h, int) and not isinstance(h, bool))
            for h in v):
        raise VllmEventError(f"block_hashes must be a list of int or bytes hashes, got "
                             f"{v!r:.60}")
    return list(v)


def _batch(raw: Any) -> _Batch:
    if isinstance(raw, dict) and "events" in raw:
        if not isinstance(raw["events"], list | tuple):
            raise VllmEventError(f"KVEventBatch events must be a list, got {raw['events']!r:.60}")
        return _Batch(_ts(raw.get("ts", 0.0)), [_event(e) for e in raw["events"]])
    if isinstance(raw, list | tuple) and len(raw) >= 2 and isinstance(raw[1], list | tuple):
        return _Batch(_ts(raw[0]), [_event(e) for e in raw[1]])
    raise VllmEventError(f"not a KVEventBatch: {raw!r:.80}")


def decode_payloads(payloads: Iterable[bytes]) -> Iterator[_Batch]:
    for i, p in enumerate(payloads):
        try:
            raw = msgpack.unpackb(p, raw=False, strict_map_key=False, **UNPACK_LIMITS)
        except (msgpack.UnpackException, ValueError) as exc:
            raise VllmEventError(f"payload {i}: not msgpack ({exc})") from None
        yield _batch(raw)


def decode_stream(data: bytes) -> Iterator[_Batch]:
    """Batches from payloads written back to back."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, **UNPACK_LIMITS)
    unpacker.feed(data)
    try:
        for raw in unpacker:
            yield _batch(raw)
    except (msgpack.UnpackException, ValueError) as exc:
        raise VllmEventError(f"stream is not a sequence of msgpack KVEventBatch ({exc})") from None


def _kind_of_spec(spec: Any) -> StateKind:
    return StateKind.RECURRENT if spec and "mamba" in str(spec).lower() else StateKind.ATTENTION


def batches_to_table(batches: Iterable[_Batch], *, block_size: int | None = None,
                     medium: str | None = "GPU", organization: str = "vllm") -> pa.Table:
    """The event table of a decoded stream (see the module docstring for the mapping).

    ``medium``: keep events of this medium (vLLM's GPU tier) and those without one; None keeps
    every medium. ``block_size`` fills in grids when the stream holds no BlockStored.
    """
    events: list[Event] = []
    ts: list[float] = []
    group_kind: dict[int, StateKind] = {}
    depth_of: dict[tuple[StateKind, int], int] = {}
    stored: dict[tuple[StateKind, int], None] = {}  # insertion-ordered set of live blocks
    grid: dict[StateKind, int] = {}
    for step, b in enumerate(batches):
        for tag, f in b.events:
            if medium is not None and f.get("medium") not in (None, medium):
                continue
            if tag == "BlockStored":
                sk = _kind_of_spec(f.get("kv_cache_spec_kind"))
                if f.get("group_idx") is not None:
                    gi = _int(f, "group_idx", 0, 1 << 16)
                    if f.get("kv_cache_spec_kind") is None:
                        sk = group_kind.get(gi, sk)
                    group_kind[gi] = sk
                size = _int(f, "block_size", 1, MAX_BLOCK_SIZE)
                grid.setdefault(sk, size)
                parent = f.get("parent_block_hash")
                base = depth_of.get((sk, hash64(parent)), 0) if parent is not None else 0
                for i, h in enumerate(_hashes(f)):
                    key = (sk, hash64(h))
                    depth_of[key] = base + (i + 1) * size
                    stored[key] = None
                    events.append(Event(EventKind.PUBLICATION, step=step, hash=key[1],
                                        depth=depth_of[key], state_kind=sk))
                    ts.append(b.ts)
            elif tag == "BlockRemoved":
                g = f.get("group_idx")
                sk = group_kind.get(_int(f, "group_idx", 0, 1 << 16), StateKind.ATTENTION) \
                    if g is not None else StateKind.ATTENTION
                for h in _hashes(f):
                    key = (sk, hash64(h))
                    stored.pop(key, None)
                    events.append(Event(EventKind.LOSS, step=step, hash=key[1],
                                        depth=depth_of.get(key, 0), state_kind=sk,
                                        cause=Cause.EVICTION))
                    ts.append(b.ts)
            else:  # AllBlocksCleared
                for key in list(stored):
                    events.append(Event(EventKind.LOSS, step=step, hash=key[1],
                                        depth=depth_of.get(key, 0), state_kind=key[0],
                                        cause=Cause.INVALIDATION))
                    ts.append(b.ts)
                stored.clear()
        if len(events) > MAX_EVENTS:
            raise VllmEventError(f"the stream holds over {MAX_EVENTS:,} block events; split it")
    ga = grid.get(StateKind.ATTENTION, block_size)
    gr = grid.get(StateKind.RECURRENT, ga)
    if ga is None or gr is None:
        raise VllmEventError("the stream stores no block, so its block size is unknown; "
                             "give block_size")
    meta = {"organization": organization, "attention_grid_tokens": ga,
            "recurrent_grid_tokens": gr, "engine": "vllm", "source": "vllm kv_events"}
    try:
        table = events_to_table(events, meta)
    except EventTableError as exc:
        raise VllmEventError(f"vLLM stream grids do not nest: {exc}") from None
    ts_ns = pa.array([int(t * 1e9) for t in ts], pa.int64())
    return table.set_column(table.column_names.index("ts_ns"), "ts_ns", ts_ns)


def import_stream(path: str | Path, *, block_size: int | None = None,
                  medium: str | None = "GPU") -> pa.Table:
    """The event table of a file of back-to-back KVEventBatch msgpack payloads."""
    p = Path(path)
    if not p.exists():
        raise HybridMemError(f"{p}: no such file")
    if not p.is_file():
        raise HybridMemError(f"{p}: not a regular file (a device or pipe could be endless)")
    size = p.stat().st_size
    if size > MAX_STREAM_BYTES:
        raise HybridMemError(f"{p}: {size:,} B is over the {MAX_STREAM_BYTES:,} B limit of one "
                             "imported stream; split it")
    if block_size is not None and not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise HybridMemError(f"block_size must lie in [1, {MAX_BLOCK_SIZE:,}], got {block_size}")
    return batches_to_table(decode_stream(p.read_bytes()), block_size=block_size,
                            medium=medium)

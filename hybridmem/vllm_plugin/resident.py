"""Running recurrent state kept in the scratch across steps (write-back residency).

Without it, every step of every Mamba layer reads each row's checkpoint from its pages into a
contiguous scratch row and writes it back after the forward; a decoding request does that at
the same address step after step. With it, a row keeps its scratch slot while its key stays in
the batch::

    key = (block id, StateAddress)          the row's checkpoint, as the StateTable maps it

    step t      keys k_1..k_n -> slots s_1..s_n (slot 0: vLLM padding, never a key)
    step t+1    a key seen at step t keeps its slot       no read, no write
                a new key takes a free slot               read from its pages
                a key gone from the batch                 written back to its pages when the
                                                          table still maps its block id to that
                                                          address, else dropped (released)

Coherence. The scratch holds the newest bytes of every resident key (all keys are dirty). Every
other access to a checkpoint's pages first goes through :meth:`Residency.flush` /
:meth:`Residency.forget` for the addresses it touches:

    align-mode copy src -> dst      flush(src) (written back, no longer resident); forget(dst)
    boundary exports                flush(their targets)
    readers outside the engine      flush_all() (continuation checks, the idle engine, shutdown)

Pages are never written by anything else while their checkpoint is live (the manager drops a
block's address before the storage can be reused, ``state_table``), and a key lives at most one
step past its last batch: the first Mamba forward of the next step writes it back or drops it,
before any read of that step. Every layer sees the same block ids in a step (one Mamba
KV-cache group, ``org_manager``), so one slot map serves all layers; each layer has its own
scratch rows at those slots.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch

from hybridmem.vllm_plugin.layer_store import LayerStore, Tables
from hybridmem.vllm_plugin.state_table import StateAddress, StateTable

Key = tuple[int, StateAddress]


class Step(NamedTuple):
    """One step's rows: ``slots[i]`` holds row i's state; rows ``misses`` must be read."""

    slots: list[int]
    misses: list[int]  # indices into ``slots`` (and the step's keys) of rows not resident


class _Layer(NamedTuple):
    store: LayerStore
    ssm: torch.Tensor  # [capacity, members x member bytes]
    conv: torch.Tensor  # [capacity, conv bytes]


class Residency:
    """The process's slot map and per-layer scratch (see the module docstring)."""

    def __init__(self) -> None:
        self.table: StateTable | None = None
        self.slots: dict[Key, int] = {}
        self.capacity = 0
        self.layers: dict[str, _Layer] = {}
        self.reads = 0  # rows read from pages / written back, all layers counted once
        self.writes = 0

    # -- lifecycle --------------------------------------------------------------------------
    def bind(self, table: StateTable) -> None:
        """Serve ``table``; a different table starts empty (its engine's stores are new)."""
        if table is not self.table:
            self.table = table
            self.slots.clear()
            self.layers.clear()
            self.capacity = 0

    def scratch(self, prefix: str, store: LayerStore) -> _Layer:
        """The layer's scratch at the current capacity (allocated on first use)."""
        held = self.layers.get(prefix)
        if held is None or held.store is not store or held.ssm.shape[0] != self.capacity:
            # a new layer, or the capacity grew: begin_step wrote every earlier row back
            # first, so every key this step holds is a miss, read after this
            ssm, conv = store.new_rows(self.capacity)
            held = self.layers[prefix] = _Layer(store, ssm, conv)
        return held

    # -- a step -----------------------------------------------------------------------------
    def begin_step(self, keys: list[Key], fresh: frozenset[int] = frozenset()) -> Step:
        """Slots for this step's ``keys`` (distinct); departed keys written back or dropped.
        A new key whose block id is in ``fresh`` (its state is never read: a prefill with no
        initial state) gets a slot but is not a miss."""
        want = set(keys)
        gone = [k for k in self.slots if k not in want]
        if gone:
            self._write_back(gone)
        if len(keys) + 1 > self.capacity:
            self.flush_all()
            self.capacity = max(8, 2 * (len(keys) + 1))
        used = set(self.slots.values())
        free = (s for s in range(1, self.capacity) if s not in used)
        slots: list[int] = []
        misses: list[int] = []
        for i, key in enumerate(keys):
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = next(free)
                if key[0] not in fresh:
                    misses.append(i)
            slots.append(slot)
        self.reads += len(misses)  # per row; every layer reads it
        return Step(slots, misses)

    def read(self, layer: _Layer, slots: list[int], tables: Tables) -> None:
        """Rows at ``slots`` of ``layer``'s scratch <- the checkpoints at ``tables`` (from
        ``LayerStore.tables``: every layer has the same layout, so one set serves a step)."""
        lo = slots[0]
        if slots == list(range(lo, lo + len(slots))):
            layer.store.read_rows(tables, layer.ssm[lo:lo + len(slots)],
                                  layer.conv[lo:lo + len(slots)])
        else:
            ssm, conv = layer.store.new_rows(len(slots))
            layer.store.read_rows(tables, ssm, conv)
            at = torch.tensor(slots, dtype=torch.int64, device=layer.ssm.device)
            layer.ssm.index_copy_(0, at, ssm)
            layer.conv.index_copy_(0, at, conv)

    # -- coherence --------------------------------------------------------------------------
    def flush(self, addresses: Iterable[StateAddress]) -> None:
        """Write back (when still mapped) and release every resident key at ``addresses``."""
        if not self.slots:
            return
        targets = set(addresses)
        gone = [k for k in self.slots if k[1] in targets]
        if gone:
            self._write_back(gone)

    def forget(self, addresses: Iterable[StateAddress]) -> None:
        """Release, without writing back, every resident key at ``addresses`` (their pages are
        about to be overwritten whole)."""
        if not self.slots:
            return
        targets = set(addresses)
        for k in [k for k in self.slots if k[1] in targets]:
            del self.slots[k]

    def flush_all(self) -> None:
        """Every resident key written back (or dropped) and released: the pages are current."""
        if self.slots:
            self._write_back(list(self.slots))

    def _write_back(self, keys: list[Key]) -> None:
        """Write ``keys`` back where the table still maps them, then release them all."""
        table = self.table
        live = [k for k in keys if table is not None and table.peek(k[0]) == k[1]]
        if live:
            slots = torch.tensor([self.slots[k] for k in live], dtype=torch.int64)
            with torch.inference_mode():  # the stores were made in vLLM's inference mode
                self._write_layers([k[1] for k in live], slots)
            self.writes += len(live)
        for k in keys:
            del self.slots[k]

    def _write_layers(self, addresses: list[StateAddress], slots: torch.Tensor) -> None:
        tables = None
        for layer in self.layers.values():
            if layer.ssm.shape[0] != self.capacity:
                continue  # a stale layer entry (never holds resident rows)
            if tables is None:  # every layer has the table's layout: one set of tables
                tables = layer.store.tables(addresses)
            at = slots.to(layer.ssm.device)
            layer.store.write_rows(tables, layer.ssm.index_select(0, at),
                                   layer.conv.index_select(0, at))


RESIDENT = Residency()


def flush_all() -> None:
    """Make every organization page current (call before reading pages outside a step)."""
    RESIDENT.flush_all()


def row_copies(since: dict[str, int] | None = None) -> dict[str, int]:
    """Checkpoint rows copied between pages and scratch (per row, all layers together) since
    ``since`` (an earlier result), for the run summary: ``rows_read`` and ``rows_written``."""
    now = {"rows_read": RESIDENT.reads, "rows_written": RESIDENT.writes}
    return now if since is None else {k: v - since.get(k, 0) for k, v in now.items()}

"""The model's Mamba layers read and write recurrent state at the organization's addresses.

When a :class:`~hybridmem.vllm_plugin.state_table.StateTable` is active (organization mode),
every ``MambaMixer2.conv_ssm_forward`` call of a step runs as::

    batch rows (decodes, then prefills)   block ids b_1..b_n  (0 = vLLM padding, skipped)
        |  resolve: b_i -> StateAddress(members, conv)    (once per step, for every layer)
        v
    scratch slots (resident.Residency)   slot 0 = padding (CPU conv kernels skip index 0)
        SSM [C, members x page]  conv [C, c]
        |  a row whose key (b_i, address) held a slot last step keeps it: no copy;
        |  a new row is read from its pages (LayerStore.read_rows: one indexed copy per kind);
        |  a row gone from the batch is written back (LayerStore.write_rows) or, released, dropped
        |  the original forward, on the scratch, with state indices b_i -> slot_i
        |  (+ boundary exports: a prefill row whose chunk crosses recurrent boundaries leaves
        |   each boundary's state, written to that boundary's checkpoint: boundary_export.py)
        v
    the rows stay in their slots (written back when they leave, before anything reads their
    pages, when the engine goes idle, and at shutdown: resident.py's coherence rules)

and align mode's boundary copy (``mamba_utils.collect_mamba_copy_meta``, before the forward:
"checkpoint of the previous boundary -> checkpoint of the current one") becomes a copy
between organization addresses, skipped where both positions hold one block id (D0: the
positions of one checkpoint interval). vLLM's own Mamba rows are neither read nor written.

Storage per layer (:class:`~hybridmem.vllm_plugin.layer_store.LayerStore`): a private zeroed
arena ``[num_pages, page_bytes]``, or -- ``arena mode "shared"`` with the organization grid of
:mod:`.org_geometry` -- the layer's slice of vLLM's one KV buffer itself, org page ``p`` being
block ``p + 1`` (the bytes attention block ``p + 1`` of the same layer would use). D0's
composites are always private (a separate recurrent pool).

``HYBRIDMEM_ORG_RESIDENT=0`` (:func:`set_resident`) writes every row back at the next step's
start instead, so every row is read and written every step (the A/B path of the residency).

Check mode: ``HYBRIDMEM_POISON_VLLM_STATE=1`` (or :func:`set_poison`) fills vLLM's own rows of
the step's block ids with NaN before every Mamba forward. With organization mode on, outputs
must not change; with it off, they do (the negative control).

Fault ``swap-members`` (:mod:`.faults`): S1/S2 reads take member pages 0 and 1 swapped.

On CPU the copies use the torch references of ``kernels/checkpoint_copy``; on a CUDA device the
Triton kernels. The GPU path is untested: the project's test machines have no CUDA device.
Speculative decoding (more than one state index per decode row) and in-forward prefill
checkpoints (``checkpoint_meta``; the grid of :mod:`.org_geometry` turns them off) are refused.
The wrapper does host work per step (block ids -> addresses), so run with ``enforce_eager``:
a captured CUDA graph would replay stale scratch addresses.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from math import prod
from typing import Any, NamedTuple

import torch

from hybridmem.vllm_plugin import faults, state_table
from hybridmem.vllm_plugin.boundary_export import Sink, boundary_capture
from hybridmem.vllm_plugin.layer_store import LayerStore, StateSizes, Tables
from hybridmem.vllm_plugin.org_geometry import PAGES_ATTR
from hybridmem.vllm_plugin.resident import RESIDENT
from hybridmem.vllm_plugin.state_table import StateLayout, StateTable

POISON_ENV = "HYBRIDMEM_POISON_VLLM_STATE"
ARENA_ENV = "HYBRIDMEM_ORG_ARENA"  # "auto" (default) | "private" | "shared"
ARENA_MODES = ("auto", "private", "shared")
CHUNK_STOPS_ENV = "HYBRIDMEM_ORG_CHUNK_STOPS"  # "1": stop prefill chunks at every boundary
_MARK = "_hybridmem_org_state"

RESIDENT_ENV = "HYBRIDMEM_ORG_RESIDENT"  # "0": write every row back after each step
_settings = {"poison": False, "arena": "auto", "resident": True}


def set_poison(on: bool) -> None:
    _settings["poison"] = bool(on)


def poison_on() -> bool:
    return bool(_settings["poison"])


def arena_mode() -> str:
    return str(_settings["arena"])


def set_arena_mode(mode: str) -> None:
    if mode not in ARENA_MODES:
        raise ValueError(f"arena mode {mode!r}; expected one of {', '.join(ARENA_MODES)}")
    _settings["arena"] = mode


def set_resident(on: bool) -> None:
    """Keep running rows in the scratch across steps (default), or read every row from its
    pages and write it back every step (``HYBRIDMEM_ORG_RESIDENT=0``; for A/B checks)."""
    _settings["resident"] = bool(on)


def resident_on() -> bool:
    return bool(_settings["resident"])


def boundary_exports() -> bool:
    """Whether the worker writes interior boundary states during the forward (CPU, unless
    ``HYBRIDMEM_ORG_CHUNK_STOPS=1``); otherwise the scheduler stops chunks at boundaries."""
    if os.environ.get(CHUNK_STOPS_ENV, "0") not in ("", "0"):
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


# -- per-layer storage ------------------------------------------------------------------------
def state_sizes(layer: Any) -> StateSizes:
    """(SSM bytes, conv bytes) of one checkpoint of ``layer``, from its state shapes."""
    shapes = list(layer.get_state_shape())
    dtypes = list(layer.get_state_dtype())
    if len(shapes) != 2:
        raise NotImplementedError(f"{layer.prefix}: {len(shapes)} Mamba states; organization "
                                  "mode handles (conv, ssm) only")
    conv, ssm = (prod(s) * torch.empty((), dtype=d).element_size()
                 for s, d in zip(shapes, dtypes, strict=True))
    return StateSizes(ssm_bytes=ssm, conv_bytes=conv)


def arena_for(layout: StateLayout, vllm_page_bytes: int | None, vllm_blocks: int,
              mode: str | None = None) -> str:
    """``"shared"`` or ``"private"``: where ``layout``'s pages live for arena ``mode`` (default:
    the process setting). Shared needs the organization grid (vLLM's pages ``vllm_page_bytes``;
    None without the grid), a shared-pool organization (not D0) whose page is that page, and
    ``num_pages`` blocks after the null block: S1/S2 on the grid (``P = G x a``); S0 only when
    ``max(r, P) = P``. ``mode == "shared"`` when it does not fit is a ValueError."""
    mode = str(_settings["arena"]) if mode is None else mode
    fits = (vllm_page_bytes is not None and layout.org != "D0"
            and vllm_page_bytes == layout.page_bytes and vllm_blocks - 1 >= layout.num_pages)
    if mode == "shared" and not fits:
        raise ValueError(f"arena mode 'shared' needs the organization grid and {layout.org} "
                         f"pages of {layout.page_bytes} B, {layout.num_pages} of them after the "
                         f"null block; vLLM has {vllm_blocks} blocks of {vllm_page_bytes} B")
    return "shared" if fits and mode != "private" else "private"


def _shared_pages(layer: Any, table: StateTable) -> torch.Tensor | None:
    raw = getattr(layer, PAGES_ATTR, None)
    page, blocks = (None, 0) if raw is None else (int(raw.shape[1]), int(raw.shape[0]))
    try:
        where = arena_for(table.layout, page, blocks)
    except ValueError as exc:
        raise ValueError(f"{layer.prefix}: {exc}") from None
    if where == "private":
        return None
    assert raw is not None
    return raw[1:]  # org page p = block id p + 1


def store_for(layer: Any, table: StateTable) -> LayerStore:
    """The layer's :class:`LayerStore` for ``table`` (built on first use, kept per table)."""
    cached = getattr(layer, "_hybridmem_store", None)
    if cached is not None and cached[0] is table:
        return cached[1]
    device = layer.kv_cache[0].device
    store = LayerStore(table.layout, state_sizes(layer), pages=_shared_pages(layer, table),
                       device=device, swap_members=faults.is_active("swap-members"))
    layer._hybridmem_store = (table, store)
    return store


def _shapes(layer: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``((conv shape, ssm shape), (conv dtype, ssm dtype))`` of one row, cached on the layer."""
    cached = getattr(layer, "_hybridmem_shapes", None)
    if cached is None:
        cached = (tuple(layer.get_state_shape()), tuple(layer.get_state_dtype()))
        layer._hybridmem_shapes = cached
    return cached


def _views(layer: Any, store: LayerStore, ssm: torch.Tensor, conv: torch.Tensor,
           rows: int) -> tuple[Any, Any]:
    """(conv, ssm) views shaped like ``layer.kv_cache`` over ``rows`` padded scratch rows."""
    (conv_shape, ssm_shape), (conv_dt, ssm_dt) = _shapes(layer)
    s = store.sizes.ssm_bytes
    return (conv[:rows].view(conv_dt).view(rows, *conv_shape),
            ssm[:rows, :s].view(ssm_dt).view(rows, *ssm_shape))


# -- one step's plan ---------------------------------------------------------------------------
class _Exports(NamedTuple):
    """This step's interior boundary states to write (state_table's boundary exports)."""

    cuts: dict[int, list[int]]  # prefill row -> token offsets into its query, ascending
    keys: list[tuple[int, int]]  # (prefill row, offset) of each target, in ``tables`` order
    tables: Tables  # the targets' addresses


class _Step(NamedTuple):
    """One step's worker plan, shared by every Mamba layer (one Mamba KV-cache group)."""

    ctx: Any  # the step's metadata dict (held, so identity stays unique)
    table: StateTable
    d: torch.Tensor | None  # state_indices_tensor_d with block ids -> scratch slots
    p: torch.Tensor | None  # state_indices_tensor_p likewise
    read: tuple[list[int], Tables] | None  # scratch slots and addresses of the rows to read
    exports: _Exports | None
    remapped: dict[int, Any]  # id(vLLM metadata) -> the same with slot indices (per group md)


def _export_plan(md: Any, table: StateTable, store: LayerStore) -> _Exports | None:
    """Match every prefill row that spans a recurrent boundary with the manager's export for
    its destination block id; a row without one is refused (its boundary checkpoint would be
    published with state never written)."""
    n = int(md.num_prefills or 0)
    if n == 0 or md.state_indices_tensor_p is None or not table.boundary_checkpoints:
        return None
    gr = table.layout.grid_tokens
    qs = md.query_start_loc_p.tolist()
    nd = int(md.num_decodes or 0)
    ends = md.seq_lens[nd:nd + n].tolist()
    ids = md.state_indices_tensor_p.reshape(-1).tolist()
    cuts: dict[int, list[int]] = {}
    keys: list[tuple[int, int]] = []
    addresses = []
    for r in range(n):
        end = int(ends[r])
        start = end - (qs[r + 1] - qs[r])
        want = tuple(range((start // gr + 1) * gr, end, gr))
        if not want:
            continue
        ex = table.exports.get(int(ids[r]))
        if ex is None or (ex.start, ex.end) != (start, end) \
                or tuple(b for b, _ in ex.boundaries) != want:
            raise AssertionError(f"worker: prefill chunk [{start}, {end}) (block id {ids[r]}) "
                                 f"spans boundaries {list(want)} but the manager exported "
                                 f"{ex}; its checkpoints would be published unwritten")
        cuts[r] = [b - start for b in want]
        for b, block_id in ex.boundaries:
            keys.append((r, b - start))
            addresses.append(table.resolve(block_id))
    if not keys:
        return None
    RESIDENT.flush(addresses)  # their pages are read and written outside the slot map
    return _Exports(cuts, keys, store.tables(addresses))


_last: list[_Step] = []


def _remap(t: torch.Tensor | None, slot_of: dict[int, int]) -> torch.Tensor | None:
    if t is None:
        return None
    out = [slot_of[b] if b > 0 else 0 for b in t.reshape(-1).tolist()]  # 0: vLLM padding
    return torch.tensor(out, dtype=t.dtype, device=t.device).view(t.shape)


def _step(ctx: Any, md: Any, table: StateTable, store: LayerStore) -> _Step:
    """This step's plan (made at its first Mamba layer): the rows' keys and slots, departed
    rows written back (``resident``), the boundary exports."""
    if _last and _last[0].ctx is ctx and _last[0].table is table:
        return _last[0]
    ip, idd = md.state_indices_tensor_p, md.state_indices_tensor_d
    if getattr(md, "checkpoint_meta", None) is not None:
        raise NotImplementedError("in-forward prefill checkpoints write vLLM block ids directly; "
                                  "organization mode needs num_prefill_checkpoint_blocks=0")
    if idd is not None and idd.dim() == 2 and idd.shape[1] != 1:
        raise NotImplementedError(f"{idd.shape[1]} state indices per decode row (speculative "
                                  "decoding) are not supported in organization mode")
    blocks: list[int] = []
    for t in (idd, ip):
        if t is None:
            continue
        for b in t.reshape(-1).tolist():
            if b > 0:
                if b in blocks:
                    raise AssertionError(f"block id {b} serves two batch rows in one step; "
                                         "this indicates a block table bug")
                blocks.append(b)
    addresses = [table.resolve(b) for b in blocks]
    RESIDENT.bind(table)
    if not _settings["resident"]:
        RESIDENT.flush_all()  # every row read and written back every step (the A/B path)
    plan = RESIDENT.begin_step(list(zip(blocks, addresses, strict=True)), _fresh_prefills(md))
    slot_of = dict(zip(blocks, plan.slots, strict=True))
    read = None
    if plan.misses:  # one set of tables for every layer
        read = ([plan.slots[i] for i in plan.misses],
                store.tables([addresses[i] for i in plan.misses]))
    step = _Step(ctx, table, _remap(idd, slot_of), _remap(ip, slot_of), read,
                 _export_plan(md, table, store), {})
    _last[:] = [step]
    return step


def _fresh_prefills(md: Any) -> frozenset[int]:
    """Block ids of prefill rows with no initial state (``has_initial_states_p`` False: the
    forward starts them from zeros, conv and SSM alike, and writes their whole state)."""
    has, ip = getattr(md, "has_initial_states_p", None), md.state_indices_tensor_p
    if has is None or ip is None:
        return frozenset()
    return frozenset(b for b, h in zip(ip.reshape(-1).tolist(), has.tolist(), strict=True)
                     if b > 0 and not h)


def _remapped(step: _Step, md: Any) -> Any:
    held = step.remapped.get(id(md))
    if held is None or held[0] is not md:
        held = step.remapped[id(md)] = (md, dataclasses.replace(
            md, state_indices_tensor_d=step.d, state_indices_tensor_p=step.p))
    return held[1]


def _write_exports(layer: Any, store: LayerStore, ex: _Exports, sink: Sink) -> None:
    """The captured boundary states -> their checkpoints' addresses."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    ssm, conv = store.new_rows(len(ex.keys))  # zeroed: member tails hold no state
    conv_v, ssm_v = _views(layer, store, ssm, conv, len(ex.keys))
    if not is_conv_state_dim_first():  # the forward sees (dim, width), as the mixer does
        conv_v = conv_v.transpose(-1, -2)
    for j, key in enumerate(ex.keys):
        try:
            c, h = sink["conv"][key], sink["ssm"][key]
        except KeyError:
            raise AssertionError(f"worker: {layer.prefix}: no boundary state for prefill row "
                                 f"{key[0]} at offset {key[1]}; the forward took a path the "
                                 "boundary capture does not see") from None
        conv_v[j, :, :c.shape[1]] = c
        ssm_v[j] = h
    store.write_rows(ex.tables, ssm, conv)


def _metadata(layer: Any) -> tuple[dict[str, Any], Any] | None:
    from vllm.forward_context import get_forward_context

    raw = get_forward_context().attn_metadata
    if not isinstance(raw, dict):
        return None
    md = raw.get(layer.prefix)
    return None if md is None else (raw, md)


def _poison_rows(layer: Any, md: Any) -> None:
    """NaN into vLLM's own rows of this step's (non-padding) block ids, every state tensor."""
    ids = [t.reshape(-1) for t in (md.state_indices_tensor_p, md.state_indices_tensor_d)
           if t is not None]
    if not ids:
        return
    live = torch.cat(ids).to(torch.int64)
    for state in layer.kv_cache:
        rows = live[(live > 0) & (live < state.shape[0])]  # D0 ids lie past vLLM's blocks
        state[rows.to(state.device)] = float("nan")


# -- the wrappers ------------------------------------------------------------------------------
def _wrap_forward(original: Any) -> Any:
    @functools.wraps(original)
    def conv_ssm_forward(self: Any, projected_states: torch.Tensor, output: torch.Tensor) -> Any:
        table = state_table.active()
        if table is None and not _settings["poison"] and not hasattr(self, PAGES_ATTR):
            return original(self, projected_states, output)
        found = _metadata(self)
        if found is None:  # profile run
            return original(self, projected_states, output)
        by_layer, md = found
        if _settings["poison"]:
            _poison_rows(self, md)
        if table is None:
            if hasattr(self, PAGES_ATTR):
                raise RuntimeError(f"{self.prefix}: the organization grid is active but no "
                                   "StateTable is: the Mamba state has no home")
            return original(self, projected_states, output)
        store = store_for(self, table)
        step = _step(by_layer, md, table, store)
        lay = RESIDENT.scratch(self.prefix, store)
        if step.read is not None:
            RESIDENT.read(lay, *step.read)
        kept = self.kv_cache
        views = getattr(self, "_hybridmem_views", None)
        if views is None or views[0] is not lay.ssm:
            views = (lay.ssm, _views(self, store, lay.ssm, lay.conv, RESIDENT.capacity))
            self._hybridmem_views = views
        self.__dict__["kv_cache"] = views[1]  # a plain attribute: skip Module.__setattr__
        by_layer[self.prefix] = _remapped(step, md)
        sink: dict[str, dict[tuple[int, int], torch.Tensor]] = {"conv": {}, "ssm": {}}
        try:
            if step.exports is None:
                result = original(self, projected_states, output)
            else:
                with boundary_capture(step.exports.cuts, sink):
                    result = original(self, projected_states, output)
        finally:
            self.__dict__["kv_cache"] = kept
            by_layer[self.prefix] = md
        if step.exports is not None:
            _write_exports(self, store, step.exports, sink)
        return result

    setattr(conv_ssm_forward, _MARK, True)
    return conv_ssm_forward


def _wrap_copy(original: Any) -> Any:
    @functools.wraps(original)
    def collect_mamba_copy_meta(copy_bufs: Any, kv_cache_config: Any, copy_funcs: Any,
                                mamba_group_ids: list[int], src_block_idx: int,
                                dest_block_idx: int, accept_token_bias: int, req_state: Any,
                                forward_context: dict[str, Any]) -> None:
        table = state_table.active()
        if table is None:
            return original(copy_bufs, kv_cache_config, copy_funcs, mamba_group_ids,
                            src_block_idx, dest_block_idx, accept_token_bias, req_state,
                            forward_context)
        if src_block_idx == dest_block_idx and accept_token_bias == 0:
            return None
        if accept_token_bias != 0:
            raise NotImplementedError("align-mode copy with accepted draft tokens (speculative "
                                      "decoding) is not supported in organization mode")
        for gid in mamba_group_ids:
            block_ids = req_state.block_ids[gid]
            if block_ids[src_block_idx] == block_ids[dest_block_idx]:
                continue  # D0: two positions of one interval name one composite
            src = table.resolve(block_ids[src_block_idx])
            dst = table.resolve(block_ids[dest_block_idx])
            RESIDENT.flush((src,))  # the copy reads src's pages: make them current
            RESIDENT.forget((dst,))  # and overwrites dst's whole
            for name in kv_cache_config.kv_cache_groups[gid].layer_names:
                store_for(forward_context[name], table).copy(src, dst)
        return None

    setattr(collect_mamba_copy_meta, _MARK, True)
    return collect_mamba_copy_meta


def install() -> bool:
    """Wrap the Mamba forward and the align-mode copy (idempotent); read the env settings."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.v1.worker import mamba_utils

    set_poison(os.environ.get(POISON_ENV, "0") not in ("", "0"))
    set_arena_mode(os.environ.get(ARENA_ENV, "auto"))
    set_resident(os.environ.get(RESIDENT_ENV, "1") not in ("", "0"))
    if not getattr(MambaMixer2.conv_ssm_forward, _MARK, False):
        MambaMixer2.conv_ssm_forward = _wrap_forward(MambaMixer2.conv_ssm_forward)
    if not getattr(mamba_utils.collect_mamba_copy_meta, _MARK, False):
        mamba_utils.collect_mamba_copy_meta = _wrap_copy(mamba_utils.collect_mamba_copy_meta)
    return True

"""The model's Mamba layers read and write recurrent state at the organization's addresses.

When a :class:`~hybridmem.vllm_plugin.state_table.StateTable` is active (organization mode),
every ``MambaMixer2.conv_ssm_forward`` call of a step runs as::

    batch rows (decodes, then prefills)   block ids b_1..b_n  (0 = vLLM padding, skipped)
        |  resolve: b_i -> StateAddress(members, conv)            (once per step)
        v
    scratch [1 + n, c + s] bytes   row 0 = padding (CPU conv kernels skip index 0: trap 2)
        row i = [ conv c bytes | SSM s bytes ]  <- gathered from the layer's LayerStore
        |  the original forward, on the scratch, with state indices b_i -> i
        v
    rows 1..n scattered back to the same addresses

and align mode's boundary copy (``mamba_utils.collect_mamba_copy_meta``, before the forward:
"checkpoint of the previous boundary -> checkpoint of the current one") becomes a copy
between organization addresses. vLLM's own Mamba rows are neither read nor written.

Storage per layer (:class:`~hybridmem.vllm_plugin.org_storage.LayerStore`): a private zeroed
arena ``[num_pages, page_bytes]``, or -- ``arena mode "shared"`` with the organization grid of
:mod:`.org_geometry` -- the layer's slice of vLLM's one KV buffer itself, org page ``p`` being
block ``p + 1`` (the bytes attention block ``p + 1`` of the same layer would use). D0's
composites are always private (a separate recurrent pool).

Check mode: ``HYBRIDMEM_POISON_VLLM_STATE=1`` (or :func:`set_poison`) fills vLLM's own rows of
the step's block ids with NaN before every Mamba forward. With organization mode on, outputs
must not change; with it off, they do (the negative control).

Fault ``swap-members`` (:mod:`.faults`): S1/S2 reads take member pages 0 and 1 swapped.

On CPU the copies use the torch references of ``kernels/checkpoint_copy``; on a CUDA device the
Triton kernels. The GPU path is untested: no device was lent to the session that wrote it.
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
from hybridmem.vllm_plugin.org_geometry import PAGES_ATTR
from hybridmem.vllm_plugin.org_storage import LayerStore, StateSizes, Tables
from hybridmem.vllm_plugin.state_table import StateLayout, StateTable

POISON_ENV = "HYBRIDMEM_POISON_VLLM_STATE"
ARENA_ENV = "HYBRIDMEM_ORG_ARENA"  # "auto" (default) | "private" | "shared"
ARENA_MODES = ("auto", "private", "shared")
_MARK = "_hybridmem_org_state"

_settings = {"poison": False, "arena": "auto"}


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


def _scratch(layer: Any, store: LayerStore, rows: int) -> tuple[torch.Tensor, tuple[Any, Any]]:
    """Byte scratch ``[rows, c + s]`` and its (conv, ssm) views shaped like ``layer.kv_cache``."""
    s, c = store.sizes
    buf = getattr(layer, "_hybridmem_scratch", None)
    if buf is None or buf.shape[0] < rows:
        buf = torch.zeros(max(rows, 8), c + s, dtype=torch.uint8, device=store.device)
        layer._hybridmem_scratch = buf
    buf = buf[:rows]
    (conv_shape, ssm_shape), (conv_dt, ssm_dt) = layer.get_state_shape(), layer.get_state_dtype()
    conv = buf[:, :c].view(conv_dt).view(rows, *conv_shape)
    ssm = buf[:, c:].view(ssm_dt).view(rows, *ssm_shape)
    return buf, (conv, ssm)


# -- one step's plan ---------------------------------------------------------------------------
class _Plan(NamedTuple):
    md: Any  # vLLM's metadata object the plan was made for (held, so identity stays unique)
    table: StateTable
    remapped: Any  # the same metadata with state indices pointing at scratch rows
    tables: Tables | None  # addresses of scratch rows 1..n (None: no live row)
    rows: int  # 1 + n


_last: list[_Plan] = []


def _plan(md: Any, table: StateTable, store: LayerStore) -> _Plan:
    if _last and _last[0].md is md and _last[0].table is table:
        return _last[0]
    ip, idd = md.state_indices_tensor_p, md.state_indices_tensor_d
    if getattr(md, "checkpoint_meta", None) is not None:
        raise NotImplementedError("in-forward prefill checkpoints write vLLM block ids directly; "
                                  "organization mode needs num_prefill_checkpoint_blocks=0")
    if idd is not None and idd.dim() == 2 and idd.shape[1] != 1:
        raise NotImplementedError(f"{idd.shape[1]} state indices per decode row (speculative "
                                  "decoding) are not supported in organization mode")
    blocks: list[int] = []

    def remap(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = []
        for b in t.reshape(-1).tolist():
            if b <= 0:
                out.append(0)  # vLLM padding: scratch row 0, never gathered or scattered
            else:
                if b in blocks:
                    raise AssertionError(f"block id {b} serves two batch rows in one step; this "
                                         "indicates a block table bug")
                blocks.append(b)
                out.append(len(blocks))
        return torch.tensor(out, dtype=t.dtype, device=t.device).view(t.shape)

    remapped = dataclasses.replace(md, state_indices_tensor_d=remap(idd),
                                   state_indices_tensor_p=remap(ip))
    tables = store.tables([table.resolve(b) for b in blocks]) if blocks else None
    plan = _Plan(md, table, remapped, tables, 1 + len(blocks))
    _last[:] = [plan]
    return plan


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
        plan = _plan(md, table, store)
        buf, views = _scratch(self, store, plan.rows)
        s, c = store.sizes
        words = store.words(buf)
        cw = c // store.word
        if plan.tables is not None:
            store.gather(plan.tables, words[1:, cw:], words[1:, :cw])
        kept = self.kv_cache
        self.kv_cache = views
        by_layer[self.prefix] = plan.remapped
        try:
            result = original(self, projected_states, output)
        finally:
            self.kv_cache = kept
            by_layer[self.prefix] = md
        if plan.tables is not None:
            store.scatter(plan.tables, words[1:, cw:], words[1:, :cw])
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
            src = table.resolve(block_ids[src_block_idx])
            dst = table.resolve(block_ids[dest_block_idx])
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
    if not getattr(MambaMixer2.conv_ssm_forward, _MARK, False):
        MambaMixer2.conv_ssm_forward = _wrap_forward(MambaMixer2.conv_ssm_forward)
    if not getattr(mamba_utils.collect_mamba_copy_meta, _MARK, False):
        mamba_utils.collect_mamba_copy_meta = _wrap_copy(mamba_utils.collect_mamba_copy_meta)
    return True

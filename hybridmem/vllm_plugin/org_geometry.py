"""The organization grid inside vLLM: attention block = Mamba block = G tokens, one page G x a.

Stock vLLM sizes a hybrid's block so that one page holds a whole Mamba state
(``Platform._align_hybrid_block_size``: block = align x ceil(mamba page / (align x a)), 1,568
tokens for Falcon-H1-7B, 256 for the v2 tiny model on CPU) and pads the Mamba page up to the
attention page (``MambaSpec.page_size_padded``); every KV-cache group must then share one page
size (``kv_cache_utils`` uniform-page check). An organization stores a checkpoint over several
pages of a finer grid G (S1/S2: ceil(s / P) member pages, P = G x a), so in organization mode
vLLM must accept a page smaller than the state::

    block_size = mamba_block_size = G           (attention blocks and checkpoint boundaries)
    page       = G x a  for both groups         (a = attention bytes per token, per layer)
    Mamba spec = placeholder shapes (1,) per state, padded to the page, and no in-forward prefill
                 checkpoints (chunks end at every boundary instead): the uniform-page check
                 passes and vLLM's own Mamba "rows" are a dummy of 1 element per block; the real
                 state lives in org_state's LayerStore (the layer's raw pages are kept as
                 ``layer._hybridmem_pages`` [num_blocks, G x a] for the shared arena)

    e.g. v2 tiny model, G = 64: a = 512 B, page 32 KiB; s = 80 KiB -> 3 member pages, the last
    half full; stock vLLM picks 256-token blocks for it (vLLM logs "Setting attention block
    size to 256 tokens").

Each organization has its own G (:func:`org_grid`): S0-S2 the model's grid, D0 its native
16-token attention unit. D0 checkpoints every interval (a multiple of 16: 256 tokens for the
tiny model, 1,792 for Falcon-H1-7B); vLLM's positional Mamba table names one composite at the
``interval / 16`` positions of an interval. On CPU a 16-token block needs the attention backend
widened (:func:`_wrap_cpu_block_sizes`).

With the grid active a Mamba layer can only run with a StateTable active (org_state refuses
otherwise): its real state has no home in vLLM's rows. Use :func:`serving_grid` to get the
engine arguments and the environment that turn the grid on (the environment reaches an engine
core started in another process too), then :func:`install` (done by the plugin's register).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import Any, NamedTuple

import torch

GRID_ENV = "HYBRIDMEM_ORG_GRID"
DEFAULT_GRID_TOKENS = 512  # SPEC's g: the grid of real Falcon-H1 checkpoints
PAGES_ATTR = "_hybridmem_pages"
_MARK = "_hybridmem_org_geometry"


class GridOverride(NamedTuple):
    """What an engine needs to run on organization grid ``grid_tokens``."""

    grid_tokens: int
    engine_kwargs: dict[str, Any]  # merge into EngineArgs / LLM(...)
    env: dict[str, str]  # set before the engine starts (activate_grid does it in-process)


def serving_grid(grid_tokens: int) -> GridOverride:
    """Engine arguments and environment for grid ``grid_tokens`` (a multiple of 16, >= 16).

    Needs ``enable_prefix_caching=True`` (vLLM's align mode, one table position per block). The
    attention backend must accept a G-token block: CPU attention declares multiples of 32, and
    with the grid on it also takes 16-token blocks (:func:`_wrap_cpu_block_sizes`, its kernel's
    ``vec16`` path); the engine start fails with that message otherwise.
    """
    if not isinstance(grid_tokens, int) or grid_tokens < 16 or grid_tokens % 16:
        raise ValueError(f"organization grid must be a multiple of 16 tokens >= 16, "
                         f"got {grid_tokens!r}")
    return GridOverride(grid_tokens, {"block_size": grid_tokens, "enable_prefix_caching": True},
                        {GRID_ENV: str(grid_tokens)})


def model_grid(model: Any) -> int:
    """The shared organizations' (S0-S2) grid G of a model directory: the grid its
    ``hybridmem.json`` declares (the embedded tiny model: 64), else SPEC's 512. An
    organization's own grid is :func:`org_grid`."""
    from hybridmem.engines.tiny_model import grid_tokens

    declared = grid_tokens(str(model))
    return serving_grid(declared if declared is not None else DEFAULT_GRID_TOKENS).grid_tokens


def org_grid(org: str, model: Any) -> int:
    """THE grid of organization ``org`` serving the model directory ``model``: S0-S2 the
    model's grid (:func:`model_grid`), D0 its native 16-token attention unit
    (:func:`hybridmem.units.org_grid_tokens`; its checkpoint interval comes from the plan)."""
    from hybridmem.units import org_grid_tokens

    return serving_grid(org_grid_tokens(org, model_grid(model))).grid_tokens


def server_args(grid: GridOverride) -> tuple[str, ...]:
    """``vllm serve`` flags of :attr:`GridOverride.engine_kwargs` (the env goes to the process)."""
    return ("--block-size", str(grid.engine_kwargs["block_size"]), "--enable-prefix-caching")


def activate_grid(grid_tokens: int | None) -> None:
    """Turn the grid on for engines started from now on in this process (None: off)."""
    if grid_tokens is None:
        os.environ.pop(GRID_ENV, None)
    else:
        os.environ.update(serving_grid(grid_tokens).env)


def active_grid() -> int | None:
    raw = os.environ.get(GRID_ENV, "")
    if not raw:
        return None
    try:
        return serving_grid(int(raw)).grid_tokens
    except ValueError:
        raise ValueError(f"{GRID_ENV}={raw!r}: expected a multiple of 16 tokens >= 16") from None


def _attn_page_per_token(vllm_config: Any, backend_cls: Any) -> int:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    cache, model = vllm_config.cache_config, vllm_config.model_config
    if cache.cache_dtype != "auto" or model.use_mla:
        raise NotImplementedError(f"organization grid with kv cache dtype {cache.cache_dtype!r} "
                                  f"(MLA: {model.use_mla}); only the model dtype is handled")
    spec = FullAttentionSpec(block_size=1,
                             num_kv_heads=model.get_num_kv_heads(vllm_config.parallel_config),
                             head_size=model.get_head_size(), dtype=model.dtype,
                             kv_quant_mode=get_kv_quant_mode(cache.cache_dtype))
    return int(backend_cls.customize_spec(spec).page_size_bytes)


def _wrap_align(original: Any) -> Any:
    @functools.wraps(original)
    def align(cls: Any, vllm_config: Any, backend_cls: Any) -> None:
        grid = active_grid()
        if grid is None:
            return original(cls, vllm_config, backend_cls)
        cache = vllm_config.cache_config
        if cache.mamba_cache_mode != "align":
            raise ValueError(f"organization grid {grid} needs prefix caching (vLLM's "
                             f"mamba_cache_mode 'align'), got {cache.mamba_cache_mode!r}")
        if not backend_cls.supports_block_size(grid):
            raise ValueError(f"attention backend {backend_cls.get_name()} rejects a "
                             f"{grid}-token block")
        cache.block_size = grid
        cache.mamba_block_size = grid
        cache.mamba_page_size_padded = grid * _attn_page_per_token(vllm_config, backend_cls)
        return None

    setattr(align, _MARK, True)
    return align


def _wrap_spec(original: Any) -> Any:
    @functools.wraps(original)
    def get_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
        from vllm.v1.kv_cache_interface import MambaSpec

        spec = original(self, vllm_config)
        if active_grid() is None or not isinstance(spec, MambaSpec):
            return spec
        # No in-forward boundary checkpoints either (they index vLLM's rows by block id): the
        # scheduler then ends a prefill chunk at every boundary (as cpu_fix does on CPU).
        return replace(spec, shapes=tuple((1,) for _ in spec.shapes),
                       num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)

    setattr(get_kv_cache_spec, _MARK, True)
    return get_kv_cache_spec


def _wrap_bind(original: Any) -> Any:
    @functools.wraps(original)
    def bind_kv_cache(self: Any, kv_cache: torch.Tensor) -> None:
        if active_grid() is None:
            return original(self, kv_cache)
        rows = kv_cache.squeeze(dim=(1, 2))  # [num_blocks, state bytes], rows a page apart
        page = int(self.cache_config.mamba_page_size_padded)
        if rows.element_size() != 1 or rows.stride(1) != 1 or rows.stride(0) < page:
            raise ValueError(f"{self.prefix}: expected byte rows at least {page} B apart, got "
                             f"{rows.dtype} {tuple(rows.shape)} strides {rows.stride()}")
        pages = rows.as_strided((rows.shape[0], page), (rows.stride(0), 1))  # whole pages
        setattr(self, PAGES_ATTR, pages)
        self.kv_cache = tuple(torch.zeros(pages.shape[0], 1, dtype=d, device=pages.device)
                              for d in self.get_state_dtype())
        return None

    setattr(bind_kv_cache, _MARK, True)
    return bind_kv_cache


def _wrap_cpu_block_sizes(original: Any) -> Any:
    """CPU attention declares ``MultipleOf(32)`` block sizes, but its kernel has a 16-token
    path (``cpu_attn._get_attn_isa``: a block that is not a multiple of 32 runs ``vec16``). With
    the organization grid on, declare ``MultipleOf(16)`` so that D0's 16-token unit is vLLM's
    block; multiples of 32 still select the same kernel as before."""
    @functools.wraps(original)
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        sizes = original(kv_cache_spec)
        if active_grid() is None:
            return sizes
        from vllm.v1.attention.backend import MultipleOf

        return [MultipleOf(16) if isinstance(s, MultipleOf) and s.base == 32 else s
                for s in sizes]

    setattr(get_supported_kernel_block_sizes, _MARK, True)
    return get_supported_kernel_block_sizes


def install() -> bool:
    """Wrap vLLM's hybrid block alignment, the Mamba2 spec, the Mamba binding and the CPU
    attention backend's block sizes (idempotent).

    Each wrapper decides per call from :data:`GRID_ENV`; without it vLLM runs unmodified.
    """
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.platforms.interface import Platform

    align = Platform.__dict__["_align_hybrid_block_size"].__func__
    if not getattr(align, _MARK, False):
        Platform._align_hybrid_block_size = classmethod(_wrap_align(align))
    if not getattr(MambaMixer2.get_kv_cache_spec, _MARK, False):
        MambaMixer2.get_kv_cache_spec = _wrap_spec(MambaMixer2.get_kv_cache_spec)
    if not getattr(MambaBase.bind_kv_cache, _MARK, False):
        MambaBase.bind_kv_cache = _wrap_bind(MambaBase.bind_kv_cache)
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # a build without the CPU backend: nothing to widen
        return True
    sizes = CPUAttentionBackend.get_supported_kernel_block_sizes
    if not getattr(sizes, _MARK, False):
        CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(
            _wrap_cpu_block_sizes(sizes))
    return True

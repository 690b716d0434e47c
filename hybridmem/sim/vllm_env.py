"""vLLM 0.32's real scheduler, built with no weights, no tokenizer and no worker.

What a real engine core does at start-up, minus the model (see the seams note, "Model-free
scheduler")::

    EngineArgs(model=<dir with config.json>, skip_tokenizer_init=True,
               enable_prefix_caching=True, async_scheduling=False, ...).create_engine_config()
      -> block size: vLLM's hybrid page unification, as on a GPU
             block = 16 ceil(mamba_page / (16 a))   (1,568 tokens for Falcon-H1-7B)
         (the platform hook that sets it needs instantiated layers; the CPU platform would
          pick its own 128-token alignment, so we set the GPU value here)
      -> specs: FullAttentionSpec per attention layer, MambaSpec (shapes and dtypes from the
         model class's get_mamba_state_shape/dtype_from_config) per Mamba layer
      -> get_kv_cache_configs -> generate_scheduler_kv_cache_config -> Scheduler(...)

The KV-cache size is given in blocks (``num_gpu_blocks_override``), i.e. pages per layer.
Nothing here knows about organizations: :mod:`hybridmem.sim.schedulers` picks the scheduler class.

Organization grid (:func:`set_grid`). The paper's shared organizations use 512-token blocks and
checkpoints, D0 16-token attention units. Stock vLLM 0.32 sizes a hybrid's block so that one page
holds a whole Mamba state (1,568 tokens for Falcon-H1-7B); all it requires is one page size
across KV-cache groups, which organization mode meets at any grid with placeholder Mamba rows
(:mod:`hybridmem.vllm_plugin.org_geometry`). Likewise here the groups run at any grid ``G``: the
Mamba group is given a placeholder state shape
that fits one ``G``-token attention page. Nothing reads those bytes -- the organization sizes
every unit from the model config (``org_settings.serving_geometry``) -- and the scheduler sees
what it would see with ``G``-token blocks. In organization mode the specs hold one attention and
one Mamba layer (the organization manager wants exactly one group of each; the layer counts
only scale tensors the simulator does not have).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.sim.model_shape import ModelShape


@dataclass(frozen=True)
class EngineSetup:
    vllm_config: Any
    kv_cache_config: Any
    block_size: int            # scheduler block size, tokens
    hash_block_size: int
    page_bytes: int            # one block's bytes in one layer
    block_hasher: Any


def _quiet() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def engine_config(shape: ModelShape, cap: int, max_model_len: int,
                  max_num_batched_tokens: int, seed: int, prefix_caching: bool = True,
                  admit_first_chunk: bool = False) -> Any:
    """A VllmConfig for ``shape`` with the GPU block size and no async scheduling;
    ``admit_first_chunk`` turns off vLLM's whole-prompt admission gate
    (``scheduler_reserve_full_isl``, on by default)."""
    _quiet()
    from vllm import EngineArgs
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    args = EngineArgs(
        model=str(shape.config_dir), skip_tokenizer_init=True, tokenizer=str(shape.config_dir),
        enable_prefix_caching=prefix_caching, async_scheduling=False, dtype=shape.geometry.dtype,
        max_model_len=max_model_len, max_num_seqs=cap, seed=seed,
        max_num_batched_tokens=max(max_num_batched_tokens, cap), mamba_cache_mode="align",
        enable_chunked_prefill=True, scheduler_reserve_full_isl=not admit_first_chunk,
    )
    try:
        vc = args.create_engine_config()
    except Exception as exc:  # vLLM rejects the config: a caller error, named in one line
        raise HybridMemError(f"vLLM cannot use the model config {str(shape.config_dir)!r}: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
    mc, cc = vc.model_config, vc.cache_config
    cc.mamba_cache_dtype = "auto"       # the CPU platform may force float32 state
    cc.mamba_ssm_cache_dtype = "auto"
    try:
        model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
        shapes = model_cls.get_mamba_state_shape_from_config(vc)
        dtypes = model_cls.get_mamba_state_dtype_from_config(vc)
    except Exception as exc:
        raise HybridMemError(f"model {shape.name!r}: vLLM has no Mamba state shape for "
                             f"architecture {mc.architecture!r} ({exc})") from None
    mamba_page = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    a1 = FullAttentionSpec(block_size=1, num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
                           head_size=mc.get_head_size(), dtype=mc.dtype).page_size_bytes
    block = 16 * -(-mamba_page // (16 * a1))
    cc.block_size = block
    cc.mamba_block_size = block
    cc.mamba_page_size_padded = block * a1 if block * a1 != mamba_page else None
    vc._hybridmem_sim = {"shapes": shapes, "dtypes": dtypes, "attn_bytes_per_token": a1,
                         "mamba_page": mamba_page}
    return vc


def set_grid(vc: Any, grid: int) -> None:
    """Run the scheduler's groups at ``grid`` tokens per block (see the module docstring)."""
    if not isinstance(grid, int) or grid < 16 or grid % 16:
        raise HybridMemError(f"grid must be a positive multiple of 16 tokens, got {grid!r}")
    cc = vc.cache_config
    a1 = vc._hybridmem_sim["attn_bytes_per_token"]
    cc.block_size = grid
    cc.mamba_block_size = grid
    cc.mamba_page_size_padded = grid * a1
    vc._hybridmem_sim["placeholder_state"] = vc._hybridmem_sim["mamba_page"] > grid * a1


def set_stock_block(vc: Any, block: int) -> None:
    """vLLM's own manager on a recorded block of ``block`` tokens (a platform that pads the
    Mamba page further than a GPU, e.g. the CPU's 128-token steps: 256 tokens for the tiny
    model) instead of the GPU rule; the block must still hold one Mamba state."""
    info = vc._hybridmem_sim
    a1 = info["attn_bytes_per_token"]
    if not isinstance(block, int) or block < 16 or block % 16 or block * a1 < info["mamba_page"]:
        raise HybridMemError(f"a stock block of {block} tokens ({block * a1} B) must be a "
                             f"multiple of 16 tokens holding the {info['mamba_page']}-B Mamba "
                             "state")
    cc = vc.cache_config
    cc.block_size = block
    cc.mamba_block_size = block
    cc.mamba_page_size_padded = block * a1 if block * a1 != info["mamba_page"] else None


def kv_specs(vc: Any, shape: ModelShape, one_layer_each: bool = False) -> dict[str, Any]:
    """Layer name -> KV-cache spec, one per attention and per Mamba layer (or one of each)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mc, cc = vc.model_config, vc.cache_config
    info = vc._hybridmem_sim
    shapes, dtypes = info["shapes"], info["dtypes"]
    if info.get("placeholder_state"):
        shapes, dtypes = tuple((1,) for _ in shapes), dtypes
    n_attn, n_mamba = (1, 1) if one_layer_each else (shape.attention_layers, shape.mamba_layers)
    specs: dict[str, Any] = {}
    for i in range(n_attn):
        specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
            block_size=cc.block_size, num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
            head_size=mc.get_head_size(), dtype=mc.dtype)
    for i in range(n_mamba):
        specs[f"model.layers.{i}.mamba"] = MambaSpec(
            shapes=shapes, dtypes=dtypes, block_size=cc.block_size,
            page_size_padded=cc.mamba_page_size_padded, mamba_cache_mode=cc.mamba_cache_mode)
    return specs


def setup(vc: Any, shape: ModelShape, num_blocks: int, one_layer_each: bool = False
          ) -> EngineSetup:
    """KV-cache config of ``num_blocks`` blocks per layer, and the request block hasher."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )

    if num_blocks < 2:
        raise HybridMemError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
    specs = kv_specs(vc, shape, one_layer_each)
    resolve_kv_cache_layout(vc, [["NHD"]], list(specs.values()))
    cc = vc.cache_config
    cc.num_gpu_blocks_override = num_blocks
    page = cc.block_size * vc._hybridmem_sim["attn_bytes_per_token"]
    memory = (num_blocks + 1) * page * len(specs)
    configs = get_kv_cache_configs(vc, [specs], [memory])
    kcc = generate_scheduler_kv_cache_config(configs)
    cc.num_gpu_blocks = kcc.num_blocks
    block, hash_block = resolve_kv_cache_block_sizes(kcc, vc)
    kcc.hash_block_size = hash_block
    hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return EngineSetup(vc, kcc, block, hash_block, page,
                       get_request_block_hasher(hash_block, hash_fn))


def stock_scheduler(env: EngineSetup, scheduler_cls: Any = None) -> Any:
    """vLLM's scheduler (or a subclass: an organization's) over ``env``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    cls = scheduler_cls or Scheduler
    return cls(vllm_config=env.vllm_config, kv_cache_config=env.kv_cache_config,
               structured_output_manager=StructuredOutputManager(env.vllm_config),
               block_size=env.block_size, hash_block_size=env.hash_block_size,
               include_finished_set=False, log_stats=True)

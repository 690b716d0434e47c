"""The one seam between the simulator and the organizations: which scheduler, how many blocks.

``vllm``: vLLM's own ``Scheduler`` and ``KVCacheManager``; a budget ``bN`` (or a byte size per
layer) becomes ``round(nominal / page)`` blocks of vLLM's unified page (1,568 tokens x 1,024 B =
1,605,632 B for Falcon-H1-7B, so ``bN`` is exactly N blocks). Headroom, pinning and retention
are organization policies and are refused here.

``S0``/``S1``/``S2``/``D0``: the organization-backed scheduler shared with serving
(:mod:`hybridmem.vllm_plugin.org_scheduler`, issue 11): the simulator builds exactly what
``vllm serve`` builds from ``additional_config={"hybridmem": {...}}``; there is no second adapter.
When that module is not importable this seam says so (one line) instead of simulating something
else under the organization's name.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from fractions import Fraction
from math import floor
from typing import Any

from hybridmem.budget import parse_budget
from hybridmem.engines.vllm_run import scoped_env
from hybridmem.errors import HybridMemError
from hybridmem.units import derive_units, org_grid_tokens

ORGS = ("vllm", "S0", "S1", "S2", "D0")
PAPER_GRID = 512  # the paper's block and checkpoint boundary of S0-S2 (§3, SPEC §2); D0: 16
ADAPTER = "hybridmem.vllm_plugin.org_scheduler"


@dataclass(frozen=True)
class OrgChoice:
    org: str
    budget: str
    headroom: float = 0.0
    pin_k: int | None = None
    retention: bool = False
    grid: int | None = None    # organizations: scheduler block (default: S0-S2 512, D0 16)
    attention_fraction: float | None = None  # D0's split (default: the model preset's)
    check_invariants: bool = False  # App. D.2 checkers after every step (slow)


@dataclass(frozen=True)
class Built:
    scheduler: Any
    num_blocks: int         # block ids vLLM holds (organizations: their pages + the null block)
    grid_tokens: int        # the checkpoint grid the cost model prices
    detail: dict[str, Any]


def default_grid(org: str, geometry: Any) -> int:
    """The checkpoint grid an organization prices by default (tokens): S0-S2 512, D0 its
    interval, vLLM's stock manager its unified block (``u``)."""
    units = derive_units(geometry, check_slots=org in ("S0", "S1", "S2"))
    if org in ("S0", "S1", "S2"):
        return units.grid_tokens
    if org == "D0":
        return units.d0_interval_tokens
    return units.uniform_tokens


def stock_blocks(budget: str, shape: Any, page_bytes: int) -> int:
    units = derive_units(shape.geometry)
    nominal = Fraction(parse_budget(budget, units).nominal_bytes)
    return floor(nominal / page_bytes + Fraction(1, 2))


def adapter_available() -> bool:
    try:
        importlib.import_module(ADAPTER)
    except ImportError:
        return False
    return True


def build(choice: OrgChoice, vc: Any, shape: Any, trace: str | None = None,
          meta: dict[str, Any] | None = None) -> Built:
    """The scheduler serving ``choice`` over ``vc`` (an :func:`.vllm_env.engine_config`),
    traced into ``trace`` when given (the same hooks and sinks as a real run)."""
    from hybridmem.sim import vllm_env

    if choice.org not in ORGS:
        raise HybridMemError(f"unknown organization {choice.org!r}; expected one of "
                             f"{', '.join(ORGS)}")
    if choice.org == "vllm":
        if choice.headroom or choice.pin_k is not None or choice.retention:
            raise HybridMemError("headroom, pin-k and retention are organization policies; "
                                 "--org vllm (vLLM's own manager) takes none of them")
        if choice.grid is not None and choice.grid != vc.cache_config.block_size:
            raise HybridMemError(f"--org vllm runs vLLM's own block of "
                                 f"{vc.cache_config.block_size} tokens; --grid is for the "
                                 "organizations")
        page = vc.cache_config.block_size * vc._hybridmem_sim["attn_bytes_per_token"]
        blocks = stock_blocks(choice.budget, shape, page)
        env = vllm_env.setup(vc, shape, blocks)
        sched = vllm_env.stock_scheduler(env)
        if trace is not None:
            from hybridmem.vllm_plugin import tracing

            with scoped_env({tracing.META_ENV: json.dumps(meta or {})}):
                tracing.attach(sched, trace)
        return Built(sched, env.kv_cache_config.num_blocks, env.block_size,
                     {"page_bytes": page, "hasher": env.block_hasher})
    if choice.grid is not None and (choice.grid < 16 or choice.grid % 16):
        raise HybridMemError(f"grid must be a positive multiple of 16 tokens, got {choice.grid}")
    if not adapter_available():
        raise HybridMemError(f"organization {choice.org} needs the organization-backed scheduler "
                             f"({ADAPTER}, issue 11), which this build does not have; use "
                             "--org vllm")
    return _build_org(choice, vc, shape, trace, meta)


def _build_org(choice: OrgChoice, vc: Any, shape: Any, trace: str | None,
               meta: dict[str, Any] | None) -> Built:
    """What ``vllm serve --scheduler-cls OrgScheduler --additional-config`` builds, minus the
    worker: the settings travel in ``additional_config``, vLLM gets the organization's block
    ids (``plan.num_block_ids``, what the plugin's block override sets), ``OrgScheduler`` swaps
    in the organization-backed manager and opens the trace from ``HYBRIDMEM_TRACE``."""
    from hybridmem.sim import vllm_env
    from hybridmem.vllm_plugin import tracing
    from hybridmem.vllm_plugin.org_scheduler import OrgScheduler
    from hybridmem.vllm_plugin.org_settings import (
        OrgSettings,
        plan_org,
        serving_geometry,
        serving_grid,
    )

    grid = choice.grid if choice.grid is not None else org_grid_tokens(choice.org, PAPER_GRID)
    vllm_env.set_grid(vc, grid)
    try:
        frac = choice.attention_fraction
        if frac is None and choice.org == "D0":
            frac = shape.geometry.attention_fraction
        settings = OrgSettings(org=choice.org, budget=choice.budget, headroom=choice.headroom,
                               pin_k=choice.pin_k, retention=choice.retention,
                               attention_fraction=frac,
                               check_invariants=choice.check_invariants).check()
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    vc.additional_config = {**(vc.additional_config or {}), **settings.as_config()}
    plan = plan_org(settings, serving_geometry(vc), serving_grid(vc))
    env = vllm_env.setup(vc, shape, plan.num_block_ids, one_layer_each=True)
    variables: dict[str, str | None] = {"HYBRIDMEM_TRACE": trace}
    if trace is not None:
        variables[tracing.META_ENV] = json.dumps(meta or {})
    with scoped_env(variables):
        sched = vllm_env.stock_scheduler(env, gpu_chunking_scheduler(OrgScheduler))
    return Built(sched, env.kv_cache_config.num_blocks, plan.interval,
                 {"hasher": env.block_hasher, "plan": plan.as_dict()})


def gpu_chunking_scheduler(org_scheduler: type) -> type:
    """``OrgScheduler`` with vLLM's own prefill split, as on a GPU.

    The adapter stops every prefill chunk at each grid boundary because on CPU a chunk writes
    only its end state (seams note, trap 3). A GPU's align-mode kernels write every boundary
    state a chunk crosses, so a GPU run (the paper's, and what the simulator prices) lets one
    chunk cross several 512-token boundaries up to ``max_num_batched_tokens``. Nothing else of
    the adapter changes; the organization still allocates and publishes a checkpoint at every
    boundary from ``num_computed_tokens``."""
    from vllm.v1.core.sched.scheduler import Scheduler

    # vLLM's own function itself (no wrapper: it runs for every scheduled request every step)
    return type("GpuChunkingOrgScheduler", (org_scheduler,),
                {"_mamba_block_aligned_split": Scheduler._mamba_block_aligned_split,
                 "__module__": __name__})


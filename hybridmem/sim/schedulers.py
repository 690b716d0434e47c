"""The one seam between the simulator and the organizations: which scheduler, how many blocks.

``vllm``: vLLM's own ``Scheduler`` and ``KVCacheManager``; a budget ``bN`` (or a byte size per
layer) becomes ``round(nominal / page)`` blocks of vLLM's unified page (1,568 tokens x 1,024 B =
1,605,632 B for Falcon-H1-7B, so ``bN`` is exactly N blocks). Headroom, pinning and retention
are organization policies and are refused here.

``S0``/``S1``/``S2``/``D0``: the organization-backed scheduler shared with serving
(:mod:`hybridmem.vllm_plugin.org_scheduler`): the simulator builds exactly what
``vllm serve`` builds from ``additional_config={"hybridmem": {...}}``; there is no second adapter.
When that module is not importable this seam says so (one line) instead of simulating something
else under the organization's name.

Prefill chunking (``OrgChoice.chunking``, ``hybridmem sim --chunking``). vLLM first cuts a
prompt into chunks of at most ``max_num_batched_tokens`` tokens (2,048 on the A100 preset); in
Mamba align mode its ``Scheduler._mamba_block_aligned_split`` then ends every chunk but a
prompt's last on a multiple of an alignment ``A`` and stops at the last ``A``-boundary before the
prompt's end, so the prompt's tail is a chunk of its own. Where chunks end decides how much a
step prefills and how many prompts prefill side by side, hence preemption and throughput, so
every arm of a comparison should run the same rule. :data:`CHUNKINGS` names the rules:

===========  ==============================  =========================  =====================
name         S0 / S1 / S2                    D0                         ``vllm``
===========  ==============================  =========================  =====================
interval     vLLM's split, A = 512 (grid)    A = its checkpoint         A = 1,568 (its block)
             (default)                       interval (1,792 native)
block        vLLM's split, A = 512           A = its scheduler block    A = 1,568
                                             (16 native)
grid512      vLLM's split, A = 512           A = 512                    A = 512
budget       no alignment: a chunk ends      the same                   refused (see below)
             where the token budget does
===========  ==============================  =========================  =====================

``interval`` (the default) is the split the organization-backed scheduler makes when its
worker writes every interior boundary state (``OrgScheduler.vllm_split``): vLLM's own rule with
each organization's checkpoint interval as the Mamba block; for S0-S2 and ``vllm`` block and
interval coincide, so ``interval`` and ``block`` differ only for D0. ``block`` is vLLM's method
unchanged (A = the scheduler's block size). ``grid512`` puts every arm on one 512-token grid.
``budget`` needs a runtime that writes every boundary state a chunk crosses (the organizations
publish a checkpoint at every boundary from ``num_computed_tokens``); vLLM's own manager caches
Mamba state only at chunk ends, so ``--org vllm`` refuses it. Where a worker cannot export boundary
states, ``OrgScheduler`` stops chunks at every checkpoint boundary instead; the simulator never
uses that split.
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
CHUNKINGS = ("interval", "block", "grid512", "budget")  # prefill splits (module docstring)
DEFAULT_CHUNKING = "interval"
CHUNKING_GRID = 512  # grid512's alignment
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
    chunking: str | None = None  # prefill split, one of CHUNKINGS (None: DEFAULT_CHUNKING)


@dataclass(frozen=True)
class Built:
    scheduler: Any
    num_blocks: int         # block ids vLLM holds (organizations: their pages + the null block)
    grid_tokens: int        # the checkpoint grid the cost model prices
    detail: dict[str, Any]  # "chunking": {"name", "align_tokens"} (None: no alignment)


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
    """vLLM's blocks per layer for ``budget``: a per-layer budget rounds half-up (as the
    organizations' labels), a whole-cache total's per-layer share rounds down (never over)."""
    units = derive_units(shape.geometry)
    b = parse_budget(budget, units)
    if b.total_bytes is not None:
        return int(Fraction(b.total_bytes, units.geometry.n_state_layers) // page_bytes)
    return floor(Fraction(b.nominal_bytes) / page_bytes + Fraction(1, 2))


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
    chunking = resolve_chunking(choice)
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
        split = chunk_split(chunking, env.block_size, env.block_size)
        sched = vllm_env.stock_scheduler(env, chunking_scheduler(None, split, env.block_size))
        if trace is not None:
            from hybridmem.vllm_plugin import tracing

            with scoped_env({tracing.META_ENV: json.dumps({**(meta or {}),
                                                           "chunking": split})}):
                tracing.attach(sched, trace)
        return Built(sched, env.kv_cache_config.num_blocks, env.block_size,
                     {"page_bytes": page, "hasher": env.block_hasher, "chunking": split})
    if choice.grid is not None and (choice.grid < 16 or choice.grid % 16):
        raise HybridMemError(f"grid must be a positive multiple of 16 tokens, got {choice.grid}")
    if not adapter_available():
        raise HybridMemError(f"organization {choice.org} needs the organization-backed scheduler "
                             f"({ADAPTER}), which this build does not have; use "
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
    split = chunk_split(resolve_chunking(choice), env.block_size, plan.interval)
    variables: dict[str, str | None] = {"HYBRIDMEM_TRACE": trace}
    if trace is not None:
        variables[tracing.META_ENV] = json.dumps({**(meta or {}), "chunking": split})
    cls = chunking_scheduler(OrgScheduler, split, env.block_size)
    with scoped_env(variables):
        sched = vllm_env.stock_scheduler(env, cls)
    return Built(sched, env.kv_cache_config.num_blocks, plan.interval,
                 {"hasher": env.block_hasher, "plan": plan.as_dict(), "chunking": split})


def resolve_chunking(choice: OrgChoice) -> str:
    """``choice.chunking`` checked, ``None`` resolved to :data:`DEFAULT_CHUNKING`."""
    name = DEFAULT_CHUNKING if choice.chunking is None else choice.chunking
    if name not in CHUNKINGS:
        raise HybridMemError(f"unknown chunking {name!r}; expected one of {', '.join(CHUNKINGS)}")
    if name == "budget" and choice.org == "vllm":
        raise HybridMemError("--chunking budget needs every boundary state a chunk crosses "
                             "written; vLLM's own manager (--org vllm) caches Mamba state only at "
                             "chunk ends, so its chunks end on its block: use interval, block or "
                             "grid512")
    return name


def chunk_split(name: str, block: int, interval: int) -> dict[str, Any]:
    """The resolved split (recorded in summary.json and trace metadata): its name and the
    alignment ``A`` in tokens (``None``: no alignment), for an arm whose scheduler block is
    ``block`` and whose checkpoint interval is ``interval`` tokens."""
    align = {"interval": interval, "block": block, "grid512": CHUNKING_GRID,
             "budget": None}[name]
    return {"name": name, "align_tokens": align}


def aligned_split(start: int, num_new_tokens: int, prefill_end: int, num_tokens: int,
                  align: int, max_prefill_tokens: int) -> int:
    """vLLM 0.32's ``Scheduler._mamba_block_aligned_split`` for Mamba blocks of ``align``
    tokens, as the simulator configures vLLM (no EAGLE, no partial-hash hits, no internal prefill
    checkpoints, no shared-prefix junctions): the tokens to schedule from ``start``.

    During a prefill (``start < prefill_end``) a chunk that does not reach ``prefill_end`` ends
    on a multiple of ``align`` (unless that leaves nothing and ``align`` exceeds the prefill
    limit); a chunk starting off the grid stops at the next multiple; no chunk runs past the
    last multiple below ``num_tokens`` (the last cacheable boundary). Decode steps are left
    alone. ``tests/sim/test_chunking.py`` checks it equals vLLM's own method at the block."""
    if start >= prefill_end:
        return num_new_tokens
    end = start + num_new_tokens
    if end < prefill_end:
        aligned = end // align * align
        if aligned > start or align <= max_prefill_tokens:
            end = aligned
    following = (start // align + 1) * align if start % align else 0
    last = max((num_tokens - 1) // align * align, 0)
    end = min((s for s in (following, last) if start < s < end), default=end)
    return max(end - start, 0)


def _aligned(align: int) -> Any:
    def split(self: Any, request: Any, num_new_tokens: int,
              num_new_local_computed_tokens: int = 0, num_external_computed_tokens: int = 0) -> int:
        start = (request.num_computed_tokens + num_new_local_computed_tokens
                 + num_external_computed_tokens)
        limit = self.max_num_scheduled_tokens
        threshold = self.scheduler_config.long_prefill_token_threshold
        if threshold > 0:
            limit = min(limit, threshold)
        return aligned_split(start, num_new_tokens,
                             max(request.num_prompt_tokens, request.num_tokens - 1),
                             request.num_tokens, align, limit)
    return split


def _unaligned(self: Any, request: Any, num_new_tokens: int, *args: Any) -> int:
    return num_new_tokens


def chunking_scheduler(base: type | None, split: dict[str, Any], block: int) -> type:
    """The scheduler class that cuts prefill chunks by ``split`` (:func:`chunk_split`): vLLM's
    ``Scheduler`` (``base`` None) or ``OrgScheduler``, with ``_mamba_block_aligned_split``
    replaced (nothing else of either changes; the organization still allocates and publishes a
    checkpoint at every boundary from ``num_computed_tokens``).

    Aligned on the scheduler's ``block``, the split is vLLM's own method itself (no wrapper: it
    runs for every scheduled request every step), also in ``OrgScheduler``, whose own override
    adds the CPU chunk stops a GPU does not need (seams note, trap 3)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    align = split["align_tokens"]
    if base is None and align == block:
        return Scheduler
    if align == block:
        method: Any = Scheduler._mamba_block_aligned_split
    elif align is None:
        method = _unaligned
    else:
        method = _aligned(align)
    parent = Scheduler if base is None else base
    return type(f"{split['name'].capitalize()}Chunking{parent.__name__}", (parent,),
                {"_mamba_block_aligned_split": method, "__module__": __name__})

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
from dataclasses import dataclass
from fractions import Fraction
from math import floor
from typing import Any

from hybridmem.budget import parse_budget
from hybridmem.errors import HybridMemError
from hybridmem.units import derive_units

ORGS = ("vllm", "S0", "S1", "S2", "D0")
ADAPTER = "hybridmem.vllm_plugin.org_scheduler"


@dataclass(frozen=True)
class OrgChoice:
    org: str
    budget: str
    headroom: float = 0.0
    pin_k: int | None = None
    retention: bool = False


@dataclass(frozen=True)
class Built:
    scheduler: Any
    num_blocks: int         # block ids vLLM holds (organizations: their pages + the null block)
    grid_tokens: int        # the checkpoint grid the cost model prices
    detail: dict[str, Any]


def default_grid(org: str, geometry: Any) -> int:
    """The checkpoint grid an organization prices by default (tokens): S0-S2 512, D0 its
    interval, vLLM's stock manager its unified block (``u``)."""
    units = derive_units(geometry)
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


def build(choice: OrgChoice, vc: Any, shape: Any) -> Built:
    """The scheduler serving ``choice`` over ``vc`` (an :func:`.vllm_env.engine_config`)."""
    from hybridmem.sim import vllm_env

    if choice.org not in ORGS:
        raise HybridMemError(f"unknown organization {choice.org!r}; expected one of "
                             f"{', '.join(ORGS)}")
    if choice.org == "vllm":
        if choice.headroom or choice.pin_k is not None or choice.retention:
            raise HybridMemError("headroom, pin-k and retention are organization policies; "
                                 "--org vllm (vLLM's own manager) takes none of them")
        page = vc.cache_config.block_size * vc._hybridmem_sim["attn_bytes_per_token"]
        blocks = stock_blocks(choice.budget, shape, page)
        env = vllm_env.setup(vc, shape, blocks)
        sched = vllm_env.stock_scheduler(env)
        return Built(sched, env.kv_cache_config.num_blocks, env.block_size,
                     {"page_bytes": page, "hasher": env.block_hasher})
    if not adapter_available():
        raise HybridMemError(f"organization {choice.org} needs the organization-backed scheduler "
                             f"({ADAPTER}, issue 11), which this build does not have; use "
                             "--org vllm")
    return _build_org(choice, vc, shape)


def _build_org(choice: OrgChoice, vc: Any, shape: Any) -> Built:  # pragma: no cover - adapter
    raise HybridMemError(f"organization {choice.org}: the adapter's entry point is not wired "
                         "into the simulator yet")

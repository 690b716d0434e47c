"""Which organization serves, with which budget and policy: settings and capacity.

The settings travel inside vLLM's engine config, ``additional_config={"hybridmem": {...}}``
(``vllm serve --additional-config '{"hybridmem": {...}}'``), so the engine-core process builds
the same organization in process and behind a server::

    {"org": "S2", "budget": "b40", "headroom": 0.0, "pin_k": 2, "pin_budget": null,
     "retention": false, "fault": null, "check_invariants": false,
     "attention_fraction": null}

Capacity. The budget is parsed as ``hybridmem plan`` parses it (label ``bN``, bytes or a size,
per layer; or ``total SIZE``, the whole cache, as ``--total``) for the model's geometry, on the
organization's own grid ``G`` (vLLM's block size, :func:`serving_grid`; decided by
:func:`hybridmem.units.org_grid_tokens`: S0-S2 the model's grid, 64 tokens for the tiny model,
512 for Falcon-H1; D0 its native 16-token unit), and turned into the organization's units by the
plan (a total's split rounds down instead, :mod:`hybridmem.budget`)::

    S0-S2  pages = round(nominal / page)                 block ids 1 .. pages
    D0     attention units of G tokens = floor(frac x nominal / 16a) x 16 / G
           composites                   = floor((1 - frac) x nominal / r)
           block ids 1 .. A (attention), A + 1 .. A + R (composites)

vLLM must have every block id the organization can hand out, so ``num_gpu_blocks`` is
:func:`num_block_ids` (``pages + 1``; D0 ``A + R + 1``): id 0 is vLLM's null block.

D0 on vLLM 0.32 runs at its native geometry (SPEC §2, Table B-2): 16-token attention units and
its model's checkpoint interval (``u`` rounded up to a multiple of 256: 1,792 tokens for
Falcon-H1-7B, 256 for the tiny model), so b63 is 3,256 attention units and 29 composites. vLLM
asks only that every KV-cache group share one page size, which organization mode meets at any
``G`` (the Mamba rows are placeholders padded to the page; the state lives at the
organization's addresses), and its Mamba block table is positional, so the ``interval / 16``
positions of one interval name one composite. The conversion above for ``G > 16`` (a hand-built
engine with a coarser block) is kept; with ``G = 16`` it is the identity. The two pools stay
static and separate.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from hybridmem.budget import parse_budget, plan_budget
from hybridmem.errors import HybridMemError
from hybridmem.events import Observer
from hybridmem.geometry import Geometry, ceil_div, geometry_from_config
from hybridmem.memory.layouts import LAYOUTS, build, make_organization
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.units import Units, derive_units
from hybridmem.vllm_plugin import faults

CONFIG_KEY = "hybridmem"
SCHEDULER_QUALNAME = "hybridmem.vllm_plugin.org_scheduler.OrgScheduler"  # scheduler_cls
VIOLATION_MARK = "HYBRIDMEM INVARIANT VIOLATION:"  # the engine core's one stderr line
ORG_NAMES = ("S0", "S1", "S2", "D0")


@dataclass(frozen=True)
class OrgSettings:
    org: str
    budget: str
    headroom: float = 0.0
    pin_k: int | None = None
    pin_budget: int | None = None
    retention: bool = False
    fault: str | None = None
    check_invariants: bool = False
    attention_fraction: float | None = None

    def check(self) -> OrgSettings:
        """Validate every field; ValueError naming the offending value."""
        if self.org not in LAYOUTS:
            raise ValueError(f"unknown organization {self.org!r}; expected one of "
                             f"{', '.join(ORG_NAMES)}")
        if not isinstance(self.budget, str) or not self.budget.strip():
            raise ValueError(f"budget must be a label bN, bytes or a size, got {self.budget!r}")
        if not (isinstance(self.headroom, (int, float)) and math.isfinite(self.headroom)
                and 0.0 <= self.headroom < 1.0):
            raise ValueError(f"headroom must be a finite fraction in [0, 1), got {self.headroom}")
        if self.pin_k is not None and self.pin_k not in (1, 2, 3):
            raise ValueError(f"pin-k must be 1, 2 or 3, got {self.pin_k}")
        if self.pin_budget is not None:
            if self.pin_k is None:
                raise ValueError("pin-budget needs pin-k (pinning is off without it)")
            if self.pin_budget < 1:
                raise ValueError(f"pin-budget must be >= 1, got {self.pin_budget}")
        faults.check(self.fault)
        if self.attention_fraction is not None and not (
                math.isfinite(self.attention_fraction) and 0 < self.attention_fraction < 1):
            raise ValueError(f"attention fraction must lie in (0, 1), got "
                             f"{self.attention_fraction}")
        return self

    def as_config(self) -> dict[str, Any]:
        return {CONFIG_KEY: asdict(self)}

    def policy(self) -> dict[str, object]:
        return {"pin_k": self.pin_k, "pin_budget": self.pin_budget, "retention": self.retention}


def settings_from(additional_config: dict[str, Any] | None) -> OrgSettings | None:
    """The settings in vLLM's ``additional_config`` (None: organization mode off)."""
    raw = (additional_config or {}).get(CONFIG_KEY)
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise HybridMemError(f"additional_config[{CONFIG_KEY!r}] must be an object, got {raw!r}")
    known = set(OrgSettings.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise HybridMemError(f"additional_config[{CONFIG_KEY!r}]: unknown keys "
                             f"{sorted(unknown)}; expected {sorted(known)}")
    try:
        return OrgSettings(**raw).check()
    except (TypeError, ValueError) as exc:
        raise HybridMemError(str(exc)) from None


# -- geometry and grid --------------------------------------------------------------------------
def serving_geometry(vllm_config: Any) -> Geometry:
    """The model's per-layer geometry with the SSM dtype vLLM actually stores state in."""
    hf = vllm_config.model_config.hf_config
    cfg = hf.to_dict()
    if "num_hidden_layers" not in cfg and getattr(hf, "num_hidden_layers", None):
        # transformers' NemotronHConfig derives it from its layer types and does not serialize it
        cfg["num_hidden_layers"] = hf.num_hidden_layers
    cache = vllm_config.cache_config
    model_dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
    ssm = str(cache.mamba_ssm_cache_dtype)
    if ssm == "auto":
        ssm = str(cache.mamba_cache_dtype)
    if ssm == "auto":
        ssm = model_dtype
    cfg = {**cfg, "dtype": model_dtype}
    return geometry_from_config(cfg, name=str(vllm_config.model_config.model), ssm_dtype=ssm)


def serving_grid(vllm_config: Any) -> int:
    """The organization's grid G in tokens (its attention block; S0-S2's checkpoint interval
    too), as the engine runs it: vLLM's block size.

    The driver decides G once per organization (:func:`hybridmem.vllm_plugin.org_geometry.
    org_grid`: S0-S2 the model's declared grid, 64 for the tiny model, else SPEC's 512; D0 16
    tokens) and starts the engine on it
    (``org_geometry.serving_grid(G)``: ``block_size = G`` and ``HYBRIDMEM_ORG_GRID=G``, which
    the plugin's alignment wrapper turns into block = Mamba block = G, page = G x a). Without
    the grid environment (an engine built by hand) G is the block size vLLM chose for the
    hybrid (one checkpoint per page, 256 tokens for the tiny model on CPU).
    """
    from hybridmem.vllm_plugin.org_geometry import active_grid

    block = int(vllm_config.cache_config.block_size)
    grid = active_grid()
    if grid is not None and grid != block:
        raise HybridMemError(f"organization grid {grid} tokens (HYBRIDMEM_ORG_GRID) but "
                             f"vLLM's block size is {block}")
    return block


# -- capacity -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OrgPlan:
    """An organization's capacity on the serving grid."""

    settings: OrgSettings
    units: Units
    grid: int  # G: vLLM block size = attention unit (all four orgs)
    interval: int  # recurrent checkpoint interval (S0-S2: G; D0: a multiple of G)
    capacity: int | tuple[int, int]  # pages, or D0 (attention units, composites)
    nominal_bytes: int  # the budget per layer

    @property
    def num_block_ids(self) -> int:
        """vLLM blocks needed so that every id the organization hands out exists."""
        if isinstance(self.capacity, tuple):
            return self.capacity[0] + self.capacity[1] + 1
        return self.capacity + 1

    @property
    def recurrent_id_offset(self) -> int:
        """Added to a checkpoint's home id: D0's composites follow the attention pool."""
        return self.capacity[0] if isinstance(self.capacity, tuple) else 0

    def headroom_units(self) -> tuple[int, int]:
        """H = floor(f B) per pool (shared pools: both equal)."""
        f = self.settings.headroom
        if isinstance(self.capacity, tuple):
            return math.floor(f * self.capacity[0]), math.floor(f * self.capacity[1])
        h = math.floor(f * self.capacity)
        return h, h

    def as_dict(self) -> dict[str, Any]:
        cap: dict[str, int]
        if isinstance(self.capacity, tuple):
            cap = {"attention_units": self.capacity[0], "recurrent_units": self.capacity[1]}
        else:
            cap = {"pages": self.capacity}
        return {"organization": self.settings.org, "budget": self.settings.budget,
                "budget_bytes": self.nominal_bytes, "attention_grid_tokens": self.grid,
                "recurrent_grid_tokens": self.interval, "capacity": cap,
                "num_block_ids": self.num_block_ids}


def plan_org(settings: OrgSettings, geometry: Geometry, grid: int) -> OrgPlan:
    """The organization's capacity for ``settings.budget`` on grid ``grid`` (HybridMemError when
    the budget gives it no unit). D0's units do not depend on S2's conv slots (no slot check)."""
    units = derive_units(geometry, grid_tokens=grid, check_slots=settings.org != "D0")
    budget = parse_budget(settings.budget, units)
    plan = plan_budget(units, budget, settings.attention_fraction)
    name = settings.org
    if name == "D0":
        if plan.d0 is None:
            raise HybridMemError(f"{geometry.model}: D0 needs an attention fraction "
                                 "(--attention-fraction); the model has no preset")
        per_block = grid // units.d0_attn_tokens
        attention = plan.d0.attention_units // per_block
        interval = ceil_div(units.d0_interval_tokens, grid) * grid
        capacity: int | tuple[int, int] = (attention, plan.d0.recurrent_units)
        if attention < 1 or plan.d0.recurrent_units < 1:
            raise HybridMemError(
                f"budget {settings.budget} ({budget.nominal_bytes:,} B per layer) gives D0 "
                f"{attention} attention units of {grid} tokens and {plan.d0.recurrent_units} "
                "composites; each pool needs at least 1")
    else:
        sp = plan.org(name)
        assert sp is not None and not isinstance(sp, tuple)
        capacity = sp.pages  # type: ignore[union-attr]
        interval = grid
        if capacity < 2:
            raise HybridMemError(f"budget {settings.budget} ({budget.nominal_bytes:,} B per "
                                 f"layer) gives {name} {capacity} pages; need at least 2")
    return OrgPlan(settings, units, grid, interval, capacity, budget.nominal_bytes)


def build_org(plan: OrgPlan, observer: Observer | None) -> MemoryOrganization:
    """The organization of ``plan`` with its policy, reporting to ``observer``. D0 runs on the
    serving grid: its native unit is the plan's block, its interval the plan's."""
    s = plan.settings
    policy = s.policy()
    units = plan.units
    if isinstance(plan.capacity, tuple):
        native = replace(units, d0_attn_tokens=plan.grid, d0_interval_tokens=plan.interval,
                         d0_attn_unit_bytes=plan.grid * units.geometry.attn_bytes_per_token)
        return build("D0", native, plan.capacity, observer, **policy)
    budget = parse_budget(s.budget, units)
    return make_organization(s.org, units, plan_budget(units, budget, s.attention_fraction),
                             observer, **policy)


def max_request_need(plan: OrgPlan, tokens: int) -> int:
    """Shared-pool units one request of ``tokens`` tokens holds at its peak: every block, and
    two checkpoints (the newest complete one and the running state's destination; prefills are
    split at block boundaries) -- every checkpoint when retention may keep superseded ones."""
    blocks = ceil_div(tokens, plan.grid)
    ckpts = ceil_div(tokens, plan.interval)
    if not plan.settings.retention:
        ckpts = min(ckpts, 2)
    u = plan.units
    org = plan.settings.org
    if org == "S1":
        return blocks + ckpts * (u.ssm_members + 1)
    if org == "S2":
        return blocks + ckpts * u.ssm_members + ceil_div(ckpts, u.slots_per_slab)
    return blocks + ckpts


def fits_one_request(plan: OrgPlan, tokens: int) -> str | None:
    """None when a request of ``tokens`` tokens (its whole life: every checkpoint held at once,
    the worst case before superseded ones are released) plus the headroom fits the capacity;
    otherwise a one-line reason with the numbers."""
    ha, hr = plan.headroom_units()
    if isinstance(plan.capacity, tuple):
        blocks = ceil_div(tokens, plan.grid)
        ckpts = ceil_div(tokens, plan.interval)
        if not plan.settings.retention:
            ckpts = min(ckpts, 2)
        if blocks + ha > plan.capacity[0] or ckpts + hr > plan.capacity[1]:
            return (f"budget {plan.settings.budget} gives D0 {plan.capacity[0]} attention units "
                    f"and {plan.capacity[1]} composites; a {tokens}-token request needs "
                    f"{blocks} + headroom {ha} and {ckpts} + headroom {hr}")
        return None
    need = max_request_need(plan, tokens)
    if need + ha > plan.capacity:
        return (f"budget {plan.settings.budget} gives {plan.settings.org} {plan.capacity} pages; "
                f"a {tokens}-token request needs up to {need} + headroom {ha}")
    return None


# -- block count ------------------------------------------------------------------------------
_MARK = "_hybridmem_org_blocks"


def install_block_override() -> None:
    """Wrap ``kv_cache_utils.may_override_num_blocks`` (idempotent): with organization settings
    in the engine config, vLLM sizes its KV cache to the organization's block ids."""
    from vllm.v1.core import kv_cache_utils

    original = kv_cache_utils.may_override_num_blocks
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def may_override_num_blocks(vllm_config: Any, num_blocks: int) -> int:
        n = original(vllm_config, num_blocks)
        settings = settings_from(getattr(vllm_config, "additional_config", None))
        if settings is None:
            return n
        plan = plan_org(settings, serving_geometry(vllm_config), serving_grid(vllm_config))
        return plan.num_block_ids

    setattr(may_override_num_blocks, _MARK, True)
    kv_cache_utils.may_override_num_blocks = may_override_num_blocks

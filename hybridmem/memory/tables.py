"""The organization's tables, which every part of the memory core reads: the requests, the two
discoverable indexes, pins, demand and the owner record of every page.

Declared once here, so the parts (:mod:`~hybridmem.memory.blocks`,
:mod:`~hybridmem.memory.checkpoints`, :mod:`~hybridmem.memory.reclaim`,
:mod:`~hybridmem.memory.policy`, :mod:`~hybridmem.memory.integrity`) share one definition of
what they change; :class:`~hybridmem.memory.organization.MemoryOrganization` joins them.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybridmem.events import Event, EventKind, NullObserver, Observer, StateKind
from hybridmem.memory.placement import Placement, SlabTable

if TYPE_CHECKING:
    from hybridmem.memory.blocks import Block
    from hybridmem.memory.checkpoints import Checkpoint
    from hybridmem.memory.pool import PagePool


@dataclass(eq=False)
class RequestState:
    """Per-request tables. Only the organization mutates them."""

    request_id: str
    tokens: array[int]  # int64 token ids (keys.token_array)
    salt: str | None
    attn_chain: list[int]
    rec_chain: list[int]
    blocks: list[Block] = field(default_factory=list)  # block i covers [i g_a, (i + 1) g_a)
    ckpts: dict[int, Checkpoint] = field(default_factory=dict)  # boundary -> held checkpoint
    ckpt_top: int = 0  # highest checkpoint boundary held or adopted
    computed: int = 0  # tokens whose state is written
    preemptions: int = 0
    retained: set[int] = field(default_factory=set)  # checkpoint idents exempt from release
    keyed: int = 0  # leading blocks settled for publish (publish starts after them)
    waits: list[int] = field(default_factory=list)  # keys of blocks waiting on another copy

    @property
    def holds_storage(self) -> bool:
        return bool(self.blocks or self.ckpts)


class Tables:
    """The state of one organization; the layout (:mod:`~hybridmem.memory.layouts`) adds its
    pools, ``owner`` lists and conv :class:`~hybridmem.memory.placement.Placement`."""

    name = "?"
    members = 1  # SSM member units per checkpoint
    placement: Placement = Placement()
    attention_grid: int  # declared here: the parts' type-only bases see the type in any order
    recurrent_grid: int

    def __init__(self, attention_grid: int, recurrent_grid: int, observer: Observer | None,
                 pin_k: int | None, pin_budget: int | None, retention: bool) -> None:
        if recurrent_grid % attention_grid:
            raise ValueError(f"recurrent grid {recurrent_grid} is not a multiple of the "
                             f"attention grid {attention_grid}")
        if pin_k is not None and pin_k < 1:
            raise ValueError(f"pin threshold K must be >= 1 or None (off), got {pin_k}")
        self.attention_grid = attention_grid
        self.recurrent_grid = recurrent_grid
        self.observer: Observer = observer if observer is not None else NullObserver()
        self._emitting = not isinstance(self.observer, NullObserver)
        self.pin_k = pin_k
        self.pin_budget = pin_budget
        self.retention = retention
        self.step = -1  # scheduler step stamped on events; the engine sets it
        self.requests: dict[str, RequestState] = {}
        self.attn_index: dict[int, Block] = {}  # discoverable attention keys
        self.rec_index: dict[int, Checkpoint] = {}  # discoverable recurrent keys
        self.pins: dict[int, tuple[Checkpoint, str]] = {}  # ident -> (checkpoint, owner)
        self.demand: dict[int, set[str]] = {}  # recurrent key -> distinct requesters
        self.num_blocks = 0  # blocks with storage (each owns its page: see live_blocks)
        self.live_ckpts: dict[int, Checkpoint] = {}  # ident -> checkpoint with storage
        # attention key -> requests holding an unpublished block with that key, skipped by
        # publish because another copy is discoverable (they rescan when that copy is lost)
        self.key_waiters: dict[int, set[str]] = {}
        self.owner: dict[str, list[object | None]] = {}  # pool name -> page -> entry / "slab"
        self.next_ident = 0  # the next checkpoint's ident (idents are never reused)
        # pool name -> page -> the block last forgotten on that page, None once reused: the
        # next block allocated on the page reuses the object (a forgotten block has key 0 and
        # no holder, and nothing refers to it) instead of building one, as vLLM's BlockPool
        # keeps one block object per block id
        self.spare_blocks: dict[str, list[Block | None]] = {}

    @property
    def slabs(self) -> SlabTable | None:
        """S2's slab table (None for the other layouts)."""
        return self.placement.slabs

    # the layout's storage (layouts.py)
    def pool_for(self, kind: StateKind, need: int = 0) -> PagePool:
        raise NotImplementedError

    def _unit_bytes(self, pool: PagePool) -> int:
        raise NotImplementedError

    def pools(self) -> list[PagePool]:
        raise NotImplementedError

    def ckpt_pool(self) -> PagePool:
        """The pool every checkpoint page (members, conv page, slab) comes from."""
        raise NotImplementedError

    def _emit(self, kind: EventKind, **fields: object) -> None:
        if self._emitting:
            self.observer.on_event(Event(kind, step=self.step, **fields))  # type: ignore[arg-type]

    def _req(self, request_id: str) -> RequestState:
        try:
            return self.requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}") from None

"""The seam between the organization-backed scheduler side and the worker side.

The scheduler side (``org_manager``: a vLLM KV-cache manager that drives an organization) decides
where every recurrent checkpoint lives; the worker side (``org_state``: wrappers around vLLM's
Mamba forward and state copies) reads and writes recurrent state at those addresses. Both run in
the same engine-core process (vLLM's uni-process executor: in-process ``LLMEngine`` and the
``vllm serve`` engine core alike), and each scheduler step is fully planned before the worker
executes it (async scheduling is off in organization mode), so one process-wide
:class:`StateTable` is the channel.

Block ids. vLLM's block id 0 is its null block; organization page ``p`` is block id ``p + 1``.
For the Mamba KV-cache group the manager hands each request a *positional* block table in vLLM's
``mamba_cache_mode='align'`` convention::

    position i of the Mamba-group table = checkpoint with the state after (i+1) x grid tokens
    block id at position i              = that checkpoint's home id + 1   (0 = not held)

    S0/S1/S2: home id = member page 0 (a shared-pool page id)
    D0:       home id = attention-pool size + composite id (block ids of both pools never collide)

The worker resolves a block id to the checkpoint's full :class:`StateAddress` through
:meth:`StateTable.resolve`.

Boundary exports. A prefill chunk ``[start, end)`` may span recurrent boundaries
``start < b < end`` (multiples of the layout's ``grid_tokens``); the worker writes only the
chunk's end state to the row's state index, so the manager registers, per step, an
:class:`Export` under the row's destination block id (position ``ceil(end / G) - 1``) naming
every interior boundary's checkpoint, and the worker writes each boundary's state there during
the same forward (:mod:`.org_state`). A row that spans a boundary with no export is refused
(its checkpoint would be published unwritten).

An address stays valid while the checkpoint is referenced; the manager removes it (``drop``)
before the storage can be reused.
"""

from __future__ import annotations

from typing import NamedTuple

NO_ADDRESS_LINE = -1  # the conv-slot sentinel (App. A.3): never decoded, never aliased to page 0


class StateLayout(NamedTuple):
    """How one checkpoint is laid out in an organization's recurrent storage (per layer)."""

    org: str  # "S0" | "S1" | "S2" | "D0"
    conv: str  # "inside" (S0, D0) | "page" (S1) | "slot" (S2)
    num_pages: int  # recurrent-capable pages (S0-S2: the shared pool; D0: composites)
    page_bytes: int  # S0: max(r, P); S1/S2: P = grid x a; D0: the composite r
    members: int  # SSM member pages per checkpoint (S0/D0: 1)
    slot_bytes: int  # S2 conv slot (power of two >= c); else 0
    slots_per_slab: int  # S2: page_bytes // slot_bytes; else 0
    grid_tokens: int  # tokens between checkpoints (the Mamba group's block size)


class StateAddress(NamedTuple):
    """Where one checkpoint's state lives.

    ``members``: page ids holding the SSM state in order (member j holds bytes
    ``[j P, (j+1) P)`` of the flat state); S0/D0: the one page / composite.
    ``conv``: S1 the conv page id; S2 the line id ``slots_per_slab * p + s``; S0/D0 equal to
    ``members[0]`` (conv inside). :data:`NO_ADDRESS_LINE` means "no conv state" and must never be
    decoded.
    """

    members: tuple[int, ...]
    conv: int


class Export(NamedTuple):
    """Interior boundaries of one prefill chunk ``[start, end)`` and their checkpoints' block
    ids: ``boundaries[i] = (b, block id)`` with ``start < b < end``, ascending."""

    request_id: str
    start: int
    end: int
    boundaries: tuple[tuple[int, int], ...]


class UnregisteredBlock(AssertionError):
    """The worker was handed a Mamba block id with no live recurrent address (a stale id: the
    checkpoint was released or never registered). Serving stops on it as on an invariant."""


class StateTable:
    """block id (home id + 1) -> :class:`StateAddress`, written by the scheduler side."""

    def __init__(self, layout: StateLayout) -> None:
        self.layout = layout
        self._by_block: dict[int, StateAddress] = {}
        self.exports: dict[int, Export] = {}  # this step's: destination block id -> Export
        # an organization holds a checkpoint at every boundary, so a prefill chunk crossing one
        # needs its export; a table over vLLM's own manager (null blocks between) does not
        self.boundary_checkpoints = False

    def set(self, block_id: int, address: StateAddress) -> None:
        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block or negative")
        if len(address.members) != self.layout.members:
            raise ValueError(f"{self.layout.org}: address has {len(address.members)} members, "
                             f"the layout {self.layout.members}")
        self._by_block[block_id] = address

    def set_export(self, dst_block_id: int, export: Export) -> None:
        """Register ``export`` for the row whose state index is ``dst_block_id`` this step."""
        if dst_block_id <= 0:
            raise ValueError(f"export of {export.request_id}: destination block id "
                             f"{dst_block_id} is vLLM's null block or negative")
        held = self.exports.get(dst_block_id)
        if held is not None and held.request_id != export.request_id:
            raise AssertionError(f"block id {dst_block_id} is the destination of {export} and "
                                 f"of {held} in one step; this indicates a block table bug")
        self.exports[dst_block_id] = export

    def drop_exports(self, request_id: str) -> None:
        for block_id in [b for b, e in self.exports.items() if e.request_id == request_id]:
            del self.exports[block_id]

    def drop(self, block_id: int) -> None:
        self._by_block.pop(block_id, None)

    def resolve(self, block_id: int) -> StateAddress:
        try:
            return self._by_block[block_id]
        except KeyError:
            import sys

            from hybridmem.vllm_plugin.org_settings import VIOLATION_MARK

            line = (f"worker: {self.layout.org}: block id {block_id} has no recurrent address "
                    "[live address]; this indicates the manager handed out a block it did not "
                    "register or had released")
            print(f"{VIOLATION_MARK} {line}", file=sys.stderr, flush=True)  # --server: the log
            raise UnregisteredBlock(line) from None

    def peek(self, block_id: int) -> StateAddress | None:
        """The block id's address, or None when it has none (no violation reported)."""
        return self._by_block.get(block_id)

    def __len__(self) -> int:
        return len(self._by_block)


_ACTIVE: StateTable | None = None


def activate(table: StateTable | None) -> None:
    """Make ``table`` the process's table (None: organization mode off)."""
    global _ACTIVE
    _ACTIVE = table


def active() -> StateTable | None:
    return _ACTIVE

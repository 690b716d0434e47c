"""A logical recurrent checkpoint: the SSM member pages and the conv location at one boundary.

One checkpoint is one reuse unit (§3.3): it is a hit only when every member is present::

    S0   members (p,)            conv inside p          one 1,557-KiB shared page
    S1   members (p0, p1, p2)    conv on its own page   3 + 1 pages of 512 KiB
    S2   members (p0, p1, p2)    conv line 16 q + s     3 pages + one 32-KiB slot of slab q
    D0   members (c,)            conv inside c          one native composite

Member page ids may be non-adjacent; the kernel reads them directly
(``addr_ssm(b, j, u) = base + pi_b(j) S_page + delta(j, u)``). A member whose page was reassigned
is :data:`MISSING_PAGE`; a conv state that is gone is the conv sentinel (``placement.NO_LINE``),
both negative, never decoded. Where the conv state lives is the layout's
:class:`~hybridmem.memory.placement.Placement`.

A checkpoint is allocated with its request's reference at a boundary the request grows past,
published under its recurrent key once the state there is computed (its pages then hold it),
adopted by later requests, pinned or retained by the policy (:mod:`~hybridmem.memory.policy`),
and forgotten once it has no holder, no pin and no key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybridmem.events import Cause, EventKind, StateKind
from hybridmem.memory.placement import NO_LINE

if TYPE_CHECKING:
    from hybridmem.memory.pool import PagePool
    from hybridmem.memory.tables import RequestState
    from hybridmem.memory.tables import Tables as _Base
else:
    _Base = object

MISSING_PAGE = -1  # a member page that no longer belongs to this checkpoint


@dataclass(eq=False, slots=True)
class Checkpoint:
    """Storage of one recurrent checkpoint. Only the owning organization mutates it."""

    ident: int  # organization-unique id (stable while the storage exists)
    boundary: int  # tokens: the state after ``boundary`` tokens
    members: list[int]  # SSM member page ids in member order; MISSING_PAGE when lost
    conv: int  # INSIDE: == members[0]; PAGE: page id; SLOT: line id; negative when absent
    key: int = 0  # cache key while discoverable (published), else 0
    holders: set[str] = field(default_factory=set)  # request ids holding an execution reference
    home_page: int = -1  # members[0] at creation (event page id, stable after a member is lost)
    home_line: int = -1  # S2: line at creation (event line id); -1 otherwise
    # S2: the slab page of ``conv``, decoded once at placement (``placement.decode_line``);
    # meaningful only while ``conv >= 0`` (a line never changes, it only becomes the sentinel)
    conv_page: int = -1

    @property
    def published(self) -> bool:
        return self.key != 0


def is_complete(ckpt: Checkpoint, members: int) -> bool:
    """All ``members`` SSM pages and the conv state are present (a partial one is never a hit)."""
    return len(ckpt.members) == members and min(ckpt.members, default=0) >= 0 \
        and ckpt.conv >= 0


class Checkpoints(_Base):
    """The organization's checkpoint operations (see :class:`~hybridmem.memory.tables.Tables`)."""

    def _complete(self, ck: Checkpoint) -> bool:
        return is_complete(ck, self.members)

    def ckpt_units(self, count: int) -> int:
        """Pure: recurrent units ``count`` new checkpoints take (S2 adds new slabs)."""
        return self.placement.units(count, self.members, self.ckpt_pool())

    def ckpt_pages(self, ck: Checkpoint) -> list[int]:
        """Every pool page that carries references of ``ck``: its present members, then its
        conv page (S1) or slab (S2)."""
        members = ck.members
        if min(members, default=0) >= 0:  # every member present (always, while referenced)
            return members + self.placement.conv_pages(ck)
        return [p for p in members if p >= 0] + self.placement.conv_pages(ck)

    def _ckpt_fields(self, ck: Checkpoint) -> dict[str, object]:
        return {"state_kind": StateKind.RECURRENT, "depth": ck.boundary, "page": ck.home_page,
                "line": ck.home_line}

    def _new_checkpoint(self, pool: PagePool, boundary: int, holder: str) -> Checkpoint:
        """A new checkpoint at ``boundary`` held by ``holder``: its members, then its conv state
        where the layout's placement puts it."""
        owners = self.owner[pool.name]
        ident = self.next_ident
        self.next_ident = ident + 1
        ck = Checkpoint(ident, boundary, [], NO_LINE, 0, {holder})
        ck.members = pool.take_many(self.members)
        for page in ck.members:
            owners[page] = ck
        self.placement.place(ck, pool, owners)
        ck.home_page = ck.members[0]
        self.live_ckpts[ident] = ck
        return ck

    def _ckpt_ref(self, ck: Checkpoint, holder: str) -> None:
        assert holder not in ck.holders, f"{holder} already references checkpoint {ck.ident}"
        assert self._complete(ck), f"reference to incomplete checkpoint {ck.ident}"
        self.ckpt_pool().incref_many(self.ckpt_pages(ck))
        ck.holders.add(holder)

    def _ckpt_unref(self, cks: list[Checkpoint], holder: str | None,
                    req: RequestState | None = None, cause: Cause = Cause.NONE) -> None:
        """Drop one execution reference of each checkpoint in ``cks`` (``holder`` None: its pin;
        ``req`` given: the request ``holder`` releases them, with its RELEASE events of
        ``cause`` first and the checkpoints no longer retained).

        The pages of the batch reach the LRU of cached pages in the placement's release order
        (:meth:`~hybridmem.memory.placement.Placement.release_order`). A checkpoint left with
        no holder, no pin and no key is forgotten (after the pages' references are dropped):
        no longer live, its pages' owner records cleared.
        """
        if req is not None:  # a request releases them
            for ck in cks:
                self._emit(EventKind.RELEASE, request_id=req.request_id,
                           preemption_count=req.preemptions, hash=ck.key, cause=cause,
                           **self._ckpt_fields(ck))
                req.retained.discard(ck.ident)
        pool, placement = self.ckpt_pool(), self.placement
        owners = self.owner[pool.name]
        dead: list[Checkpoint] = []
        conv: list[int] = []
        members: list[int] = []
        for ck in cks:
            if holder is None:
                del self.pins[ck.ident]
            else:
                ck.holders.remove(holder)
            if not ck.holders and ck.ident not in self.pins and not ck.key:
                dead.append(ck)
            conv += placement.conv_pages(ck)
            members += [p for p in ck.members if p >= 0]
        for ck in dead:
            placement.release_slot(ck, owners)  # before the slab page can become free
        pool.decref_many(placement.release_order(members, conv))
        for ck in dead:
            self._forget_ckpt(ck, owners)

    def _forget_ckpt(self, ck: Checkpoint, owners: list[object | None]) -> None:
        """No longer live: the owner records of its pages cleared."""
        del self.live_ckpts[ck.ident]
        for p in ck.members:
            if p >= 0:
                owners[p] = None
        self.placement.forget(ck, owners)

    def _publish_ckpts(self, req: RequestState, published: list[int]) -> None:
        """Make ``req``'s complete checkpoints at boundaries within its computed tokens
        discoverable (unless another copy of the key is), in boundary order, appending the keys
        to ``published``; every page of each gets one hold."""
        pages: list[int] = []
        rec_index, rec_chain, gr = self.rec_index, req.rec_chain, self.recurrent_grid
        for b, ck in sorted(req.ckpts.items()):
            if b > req.computed:
                break
            key = rec_chain[b // gr - 1]
            if ck.key or key in rec_index:
                continue
            assert self._complete(ck), f"publishing incomplete checkpoint {ck.ident} at {b}"
            ck.key = key
            rec_index[key] = ck
            pages += self.ckpt_pages(ck)
            self.demand.setdefault(key, set()).add(req.request_id)  # owner registration
            published.append(key)
            self._emit(EventKind.PUBLICATION, request_id=req.request_id,
                       preemption_count=req.preemptions, hash=key, **self._ckpt_fields(ck))
        if pages:
            self.ckpt_pool().hold_many(pages)

"""A logical recurrent checkpoint: the SSM member pages and the conv location at one boundary.

One checkpoint is one reuse unit (§3.3): it is a hit only when every member is present::

    S0   members (p,)            conv inside p          one 1,557-KiB shared page
    S1   members (p0, p1, p2)    conv on its own page   3 + 1 pages of 512 KiB
    S2   members (p0, p1, p2)    conv line 16 q + s     3 pages + one 32-KiB slot of slab q
    D0   members (c,)            conv inside c          one native composite

Member page ids may be non-adjacent; the kernel reads them directly
(``addr_ssm(b, j, u) = base + pi_b(j) S_page + delta(j, u)``). A member whose page was reassigned
is :data:`MISSING_PAGE`; a conv state that is gone is the conv sentinel (``conv_slab.NO_LINE``),
both negative, never decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

MISSING_PAGE = -1  # a member page that no longer belongs to this checkpoint


class ConvPlacement(Enum):
    INSIDE = "inside"  # conv state lives in member 0 (S0 page, D0 composite)
    PAGE = "page"  # one dedicated page (S1)
    SLOT = "slot"  # one slot of a shared slab, addressed by line id 16 p + s (S2)


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
    # S2: the slab page of ``conv``, decoded once at placement (``conv_slab.decode_line``);
    # meaningful only while ``conv >= 0`` (a line never changes, it only becomes the sentinel)
    conv_page: int = -1

    @property
    def published(self) -> bool:
        return self.key != 0


def is_complete(ckpt: Checkpoint, members: int) -> bool:
    """All ``members`` SSM pages and the conv state are present (a partial one is never a hit)."""
    return len(ckpt.members) == members and min(ckpt.members, default=0) >= 0 \
        and ckpt.conv >= 0

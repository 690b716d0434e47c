"""One Mamba layer's recurrent state stored the organization's way.

A :class:`LayerStore` owns (or borrows) the layer's page arena ``[num_pages, page_bytes]`` and
moves whole checkpoints between it and contiguous rows (a scratch the model's forward runs on).
The state of one checkpoint is two opaque byte runs, in vLLM's own row-major layouts: the flat
SSM state (``s`` bytes) and the conv state (``c`` bytes). Where they live (:class:`StateLayout`)::

    S0, D0  (conv "inside")   page members[0]:  [ SSM s bytes | conv c bytes | unused ]
    S1      (conv "page")     member j holds SSM bytes [jP, (j+1)P) (last member partial);
                              page ``conv`` holds the c conv bytes at offset 0
    S2      (conv "slot")     members as S1; conv line l = spp * p + k is slot k of slab page p:
                              bytes [k * slot, k * slot + c) of page p   (spp = slots per slab)

    e.g. s = 80 KiB, P = 32 KiB, slot = 8 KiB (spp = 4): members (7, 2, 9) hold SSM bytes
    [0, 32K) [32K, 64K) [64K, 80K); line 4 * 5 + 3 = 23 is bytes [24K, 24K + c) of page 5.

S0 and D0 differ only in what the pages are (S0: the shared pool's max(r, P) pages; D0: the
separate recurrent pool of r-byte composites). The conv sentinel :data:`NO_ADDRESS_LINE` is
refused, never decoded.

Copies run in words (the widest of 4/2/1 bytes dividing every size): on CPU by whole-page
copies tested equal to the torch reference of ``kernels/checkpoint_copy`` (the reference itself
builds one address per element and is several times slower), on a CUDA device through that
folder's Triton kernel (same addresses, same call). The Triton path has not been run (the
project's test machines have no CUDA device): it is written, not tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import NamedTuple

import torch

from hybridmem.kernels.paging import num_members, slab_lines
from hybridmem.vllm_plugin.state_table import NO_ADDRESS_LINE, StateAddress, StateLayout

_WORD_DTYPES = {4: torch.int32, 2: torch.int16, 1: torch.uint8}
_CONV_KIND = {"S0": "inside", "D0": "inside", "S1": "page", "S2": "slot"}


class StateSizes(NamedTuple):
    """Bytes of one checkpoint of one layer, as the model's forward holds them."""

    ssm_bytes: int
    conv_bytes: int


class Tables(NamedTuple):
    """Device index tensors of a batch of addresses: members ``[n, m]``, conv ids ``[n]``."""

    members: torch.Tensor
    conv: torch.Tensor


def check_layout(layout: StateLayout, sizes: StateSizes) -> None:
    """Raise ``ValueError`` (with the numbers) unless ``sizes`` fit ``layout``."""
    s, c, p = sizes.ssm_bytes, sizes.conv_bytes, layout.page_bytes
    if layout.org not in _CONV_KIND:
        raise ValueError(f"unknown organization {layout.org!r}; expected S0, S1, S2 or D0")
    if layout.conv != _CONV_KIND[layout.org]:
        raise ValueError(f"{layout.org} keeps conv state {_CONV_KIND[layout.org]!r}, "
                         f"the layout says {layout.conv!r}")
    if s <= 0 or c <= 0 or p <= 0 or layout.num_pages <= 0:
        raise ValueError(f"{layout.org}: ssm {s} B, conv {c} B, page {p} B and "
                         f"{layout.num_pages} pages must all be > 0")
    if layout.conv == "inside":
        if layout.members != 1 or s + c > p:
            raise ValueError(f"{layout.org}: one {p}-B page must hold ssm {s} B + conv {c} B "
                             f"= {s + c} B in 1 member (layout: {layout.members})")
        return
    need = num_members(s, p)
    if layout.members != need:
        raise ValueError(f"{layout.org}: ssm state of {s} B needs ceil({s} / {p}) = {need} "
                         f"member pages, the layout says {layout.members}")
    if layout.conv == "page" and c > p:
        raise ValueError(f"S1: conv state of {c} B does not fit a {p}-B conv page")
    if layout.conv == "slot":
        slot, spp = layout.slot_bytes, layout.slots_per_slab
        if slot < c or spp < 1 or slot * spp != p:
            raise ValueError(f"S2: need conv {c} B <= slot {slot} B and slot x slots per slab "
                             f"{slot} x {spp} = {slot * spp} == page {p} B")


def word_bytes(*sizes: int) -> int:
    """Widest copy word (4, 2 or 1 bytes) dividing every size."""
    g = 0
    for n in sizes:
        g = gcd(g, n)
    return next(w for w in (4, 2, 1) if g % w == 0)


def gather_pages_cpu(pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor) -> None:
    """``gather_pages_ref``'s result (``hybridmem.kernels.checkpoint_copy.reference``) by
    whole-page copies.

    Every id must be >= 0 (``LayerStore.tables`` guarantees it; the sentinel never gets here).

    The reference builds one int64 address per element; this copies the ``n // E`` full
    members of every row with one ``index_select`` and the partial last one with one indexed
    slice -- several times faster on CPU, and tested equal to the reference.
    """
    batch, n = arena.shape
    e = pool.shape[1]
    full, rem = divmod(n, e)
    if full:
        rows = pool.index_select(0, table[:, :full].reshape(-1))
        arena[:, :full * e].copy_(rows.view(batch, full * e))
    if rem:
        arena[:, full * e:].copy_(pool[table[:, full], :rem])


def scatter_pages_cpu(pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor) -> None:
    """``scatter_pages_ref``'s result by whole-page copies (ids >= 0, no id twice)."""
    batch, n = arena.shape
    e = pool.shape[1]
    full, rem = divmod(n, e)
    if full:
        pool.index_copy_(0, table[:, :full].reshape(-1), arena[:, :full * e].reshape(-1, e))
    if rem:
        pool[table[:, full], :rem] = arena[:, full * e:]


def _gather(pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor) -> None:
    if pool.device.type == "cuda":  # untested: the test machines have no CUDA device
        from hybridmem.kernels.checkpoint_copy.kernel import gather_pages

        gather_pages(pool, table, arena, validate=False)
    else:
        gather_pages_cpu(pool, table, arena)


def _scatter(pool: torch.Tensor, table: torch.Tensor, arena: torch.Tensor) -> None:
    if pool.device.type == "cuda":  # untested: the test machines have no CUDA device
        from hybridmem.kernels.checkpoint_copy.kernel import scatter_pages

        scatter_pages(pool, table, arena, validate=False)
    else:
        scatter_pages_cpu(pool, table, arena)


class LayerStore:
    """The organization's recurrent storage of one Mamba layer.

    ``pages``: an existing byte buffer ``[>= num_pages, page_bytes]`` to store in (the shared
    pool, physically shared with attention), or None to allocate a private zeroed arena.
    ``swap_members``: the ``swap-members`` fault -- reads of a checkpoint into rows
    (:meth:`gather`, :meth:`read_rows`) take member pages 0 and 1 in the wrong order (S1/S2
    with >= 2 members; writes and page-to-page copies stay right, so the damage persists).
    """

    def __init__(self, layout: StateLayout, sizes: StateSizes, pages: torch.Tensor | None = None,
                 device: torch.device | str = "cpu", swap_members: bool = False) -> None:
        check_layout(layout, sizes)
        self.layout = layout
        self.sizes = sizes
        if pages is None:
            pages = torch.zeros(layout.num_pages, layout.page_bytes, dtype=torch.uint8,
                                device=device)
        if (pages.dim() != 2 or pages.element_size() != 1 or pages.shape[0] < layout.num_pages
                or pages.shape[1] != layout.page_bytes or pages.stride(1) != 1):
            raise ValueError(f"pages must be a byte tensor [>= {layout.num_pages}, "
                             f"{layout.page_bytes}] with unit inner stride, got "
                             f"{pages.dtype} {tuple(pages.shape)} strides {pages.stride()}")
        self.pages = pages[: layout.num_pages]
        s, c = sizes
        self.word = word_bytes(layout.page_bytes, s, c, layout.slot_bytes or layout.page_bytes)
        words = self.pages.view(_WORD_DTYPES[self.word])
        sw, cw = s // self.word, c // self.word
        if layout.conv == "inside":
            self.ssm_pool, self.conv_pool = words[:, :sw], words[:, sw:sw + cw]
        elif layout.conv == "page":
            self.ssm_pool, self.conv_pool = words, words[:, :cw]
        else:
            self.ssm_pool = words
            self.conv_pool = slab_lines(words, layout.slots_per_slab)[:, :cw]
        self.swap_members = swap_members and layout.members >= 2
        self.device = self.pages.device
        self._single: dict[StateAddress, Tables] = {}

    @property
    def num_conv_ids(self) -> int:
        """Conv ids the layout can address: pages (S0/S1/D0) or lines (S2)."""
        return int(self.conv_pool.shape[0])

    def words(self, rows: torch.Tensor) -> torch.Tensor:
        """A byte tensor ``[n, k]`` (unit inner stride) viewed in this store's copy words."""
        return rows.view(_WORD_DTYPES[self.word])

    def tables(self, addresses: Sequence[StateAddress]) -> Tables:
        """Checked index tensors for ``addresses``; raises ``ValueError`` naming a bad one."""
        m, top, lines = self.layout.members, self.layout.num_pages, self.num_conv_ids
        for a in addresses:
            if len(a.members) != m or min(a.members) < 0 or max(a.members) >= top:
                raise ValueError(f"{self.layout.org}: address {a} needs {m} member ids in "
                                 f"[0, {top})")
            if a.conv == NO_ADDRESS_LINE:
                raise ValueError(f"{self.layout.org}: address {a} has the no-conv sentinel; "
                                 "a checkpoint that is read or written needs its conv state")
            if not 0 <= a.conv < lines:
                raise ValueError(f"{self.layout.org}: conv id {a.conv} of {a} outside "
                                 f"[0, {lines})")
            if self.layout.conv == "inside" and a.conv != a.members[0]:
                raise ValueError(f"{self.layout.org}: conv is inside the page, so conv id "
                                 f"{a.conv} must equal members[0] {a.members[0]}")
        members = torch.tensor([a.members for a in addresses], dtype=torch.int64)
        conv = torch.tensor([a.conv for a in addresses], dtype=torch.int64)
        return Tables(members.view(len(addresses), m).to(self.device), conv.to(self.device))

    def gather(self, t: Tables, ssm_rows: torch.Tensor, conv_rows: torch.Tensor) -> None:
        """Rows ``[n, s / w]`` and ``[n, c / w]`` (words) <- the checkpoints at ``t``."""
        members = t.members
        if self.swap_members:
            members = members[:, [1, 0, *range(2, members.shape[1])]]
        _gather(self.ssm_pool, members, ssm_rows)
        _gather(self.conv_pool, t.conv[:, None], conv_rows)

    def scatter(self, t: Tables, ssm_rows: torch.Tensor, conv_rows: torch.Tensor) -> None:
        """The checkpoints at ``t`` <- rows (words); other pages and lines are untouched."""
        _scatter(self.ssm_pool, t.members, ssm_rows)
        _scatter(self.conv_pool, t.conv[:, None], conv_rows)

    def copy(self, src: StateAddress, dst: StateAddress) -> None:
        """Checkpoint ``dst`` <- checkpoint ``src`` (align mode's boundary copy)."""
        self.copy_many(self._one(src), self._one(dst))

    def _one(self, address: StateAddress) -> Tables:
        """``tables([address])``, memoised (an address's tables depend on nothing else)."""
        t = self._single.get(address)
        if t is None:
            if len(self._single) >= 4096:
                self._single.clear()
            t = self._single[address] = self.tables([address])
        return t

    # -- the serving path: padded scratch rows, one indexed op per state kind ----------------
    @property
    def ssm_row_words(self) -> int:
        """Words of one padded SSM scratch row: ``members`` whole member rows (>= s / w)."""
        return int(self.layout.members * self.ssm_pool.shape[1])

    def new_rows(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous byte scratch ``(ssm [rows, members x member bytes], conv [rows, c])`` for
        :meth:`read_rows` / :meth:`write_rows` (the SSM row is padded to whole members)."""
        ssm = torch.zeros(rows, self.ssm_row_words * self.word, dtype=torch.uint8,
                          device=self.device)
        conv = torch.zeros(rows, self.sizes.conv_bytes, dtype=torch.uint8, device=self.device)
        return ssm, conv

    def read_rows(self, t: Tables, ssm: torch.Tensor, conv: torch.Tensor) -> None:
        """Scratch rows (from :meth:`new_rows`, ``len(t)`` of them) <- the checkpoints at ``t``.

        CPU: one ``index_select`` of every member row (the last member whole: the padding
        receives the rest of that page) and one of every conv line, straight into the scratch.
        Equal to :meth:`gather` on the first ``s`` SSM bytes (tested)."""
        self._read_rows(t, ssm, conv, self.swap_members)

    def _read_rows(self, t: Tables, ssm: torch.Tensor, conv: torch.Tensor, swap: bool) -> None:
        members = t.members
        if swap:
            members = members[:, [1, 0, *range(2, members.shape[1])]]
        sw = self.sizes.ssm_bytes // self.word
        if self.device.type == "cuda":  # untested: the test machines have no CUDA device
            _gather(self.ssm_pool, members, self.words(ssm)[:, :sw])
            _gather(self.conv_pool, t.conv[:, None], self.words(conv))
            return
        e = self.ssm_pool.shape[1]
        torch.index_select(self.ssm_pool, 0, members.reshape(-1),
                           out=self.words(ssm).view(-1, e))
        torch.index_select(self.conv_pool, 0, t.conv, out=self.words(conv))

    def write_rows(self, t: Tables, ssm: torch.Tensor, conv: torch.Tensor) -> None:
        """The checkpoints at ``t`` <- scratch rows (whole member rows: a member page belongs to
        one checkpoint, and its tail is written back as it was read). Equal to
        :meth:`scatter` on every checkpoint byte (tested)."""
        if self.device.type == "cuda":  # untested: the test machines have no CUDA device
            sw = self.sizes.ssm_bytes // self.word
            self.scatter(t, self.words(ssm)[:, :sw], self.words(conv))
            return
        e = self.ssm_pool.shape[1]
        self.ssm_pool.index_copy_(0, t.members.reshape(-1), self.words(ssm).view(-1, e))
        self.conv_pool.index_copy_(0, t.conv, self.words(conv))

    def copy_many(self, src: Tables, dst: Tables) -> None:
        """Checkpoints ``dst[i]`` <- ``src[i]`` for every i (align mode's boundary copies of one
        step, batched). No ``dst`` may appear twice or as a ``src``. A page-to-page copy moves
        members in order even under the ``swap-members`` fault (that fault is the forward's
        read of a checkpoint; a copy that swapped too would undo it on the next read)."""
        if self.device.type == "cuda":  # untested: the test machines have no CUDA device
            ssm, conv = self.new_rows(int(src.conv.shape[0]))
            self._read_rows(src, ssm, conv, swap=False)
            self.write_rows(dst, ssm, conv)
            return
        self.ssm_pool.index_copy_(0, dst.members.reshape(-1),
                                  self.ssm_pool.index_select(0, src.members.reshape(-1)))
        self.conv_pool.index_copy_(0, dst.conv, self.conv_pool.index_select(0, src.conv))

"""Independent scalar replay of a run's event table, in plain Python (no SQL).

It walks the events once in ``seq`` order, keeping a ``valid`` map of cache entries
``(state_kind, hash) -> bool`` (valid from publication until loss; republication revalidates)
and, for every episode that is waiting, its contiguous valid attention prefix ``n`` (blocks)
and joint depth ``J``. Each validity change of a watched entry updates those two scalars:

    attention block p published, p == n   -> n advances over the valid blocks after it
    attention block p lost, p < n         -> n = p
    checkpoint at b published, b <= n*ga  -> J = max(J, b)
    checkpoint at b lost, b == J          -> J = deepest valid checkpoint <= n*ga
    (after an attention change, J = deepest valid checkpoint <= n*ga)

J at the waiting entry is ``J_enter``; the adoption row gives ``J_adopt``. A change of J while
waiting is a depth-increasing publication or depth-decreasing loss of that episode.

The lookup bracket needs the whole step, so it is computed after the pass from each entry's
history sorted by (step, seq): M0 = the state after the latest earlier step, M1 = M0 or a
publication inside the lookup step. The same definitions are in ``lineage/README.md``; the SQL
computes them with set operations instead of this walk.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pac

from lineage.table import LINEAGE_COLUMNS, RunMeta, check_columns, table_meta

Key = tuple[str, int]  # (state_kind, hash)

OTHER_ALLOCATION_CAUSES = ("allocation", "slab_reclaim")


@dataclass(frozen=True, slots=True)
class Depths:
    """A_max, R_max and J (tokens) of one episode at one cut."""

    a_max: int
    r_max: int
    j: int


@dataclass(frozen=True, slots=True)
class DepthChange:
    seq: int
    kind: str  # "publication" | "loss"
    j_before: int
    j_after: int
    cause: str
    requester: str
    other_request_allocation: bool


@dataclass
class EpisodeReplay:
    """Everything the replay knows about one episode (request_id, preemption_count)."""

    request_id: str
    preemption_count: int
    entry_seq: int | None = None
    adopt_seq: int | None = None
    adopt_step: int | None = None
    j_adopt: int | None = None
    chain: tuple[int, ...] = ()
    recurrent_chain: tuple[int, ...] = ()
    entry: Depths | None = None
    exact: Depths | None = None
    m0: Depths | None = None
    m1: Depths | None = None
    changes: list[DepthChange] | None = None
    # live state while waiting
    n: int = 0
    j: int = 0
    waiting: bool = False

    @property
    def j_enter(self) -> int | None:
        return None if self.entry is None else self.entry.j

    @property
    def has_window(self) -> bool:
        return (self.entry_seq is not None and self.adopt_seq is not None
                and self.entry_seq < self.adopt_seq)

    @property
    def klass(self) -> str | None:
        return depth_class(self.j_enter, self.j_adopt)

    def count(self, kind: str) -> int | None:
        if self.changes is None:
            return None
        return sum(1 for c in self.changes if c.kind == kind)

    def other_losses(self) -> int | None:
        if self.changes is None:
            return None
        return sum(1 for c in self.changes if c.other_request_allocation)


def depth_class(j_enter: int | None, j_adopt: int | None) -> str | None:
    """zero->zero, positive-equal, zero->positive, deeper, shallower (None: unclassified)."""
    if j_enter is None or j_adopt is None:
        return None
    if j_enter == 0:
        return "zero->zero" if j_adopt == 0 else "zero->positive"
    if j_adopt == j_enter:
        return "positive-equal"
    return "deeper" if j_adopt > j_enter else "shallower"


def depths_from_flags(attn_valid: list[bool], rec_valid: list[bool], ga: int, gr: int) -> Depths:
    """A_max, R_max, J from per-position validity, from scratch (no incremental state)."""
    n = 0
    while n < len(attn_valid) and attn_valid[n]:
        n += 1
    covered = n * ga
    a_max = r_max = j = 0
    for pos, ok in enumerate(rec_valid):
        b = (pos + 1) * gr
        if b <= covered:
            a_max = b
        if ok:
            r_max = b
            if b <= covered:
                j = b
    return Depths(a_max, r_max, j)


@dataclass
class Replay:
    meta: RunMeta
    episodes: dict[tuple[str, int], EpisodeReplay] = field(default_factory=dict)
    publications: int = 0
    losses: int = 0

    def episode(self, request_id: str, preemption_count: int) -> EpisodeReplay:
        return self.episodes[(request_id, preemption_count)]


class _Walker:
    """The forward pass (one instance per replay)."""

    def __init__(self, meta: RunMeta) -> None:
        self.ga = meta.attention_grid_tokens
        self.gr = meta.recurrent_grid_tokens
        self.valid: dict[Key, bool] = {}
        # entry key -> {episode key: [(state_kind, pos), ...]} for waiting episodes only
        self.watch: dict[Key, dict[tuple[str, int], list[tuple[str, int]]]] = {}
        self.out = Replay(meta)

    # -- per-episode scalar maintenance ------------------------------------------------------

    def _best_j(self, ep: EpisodeReplay) -> int:
        """Deepest valid checkpoint with boundary <= n*ga."""
        top = min(ep.n * self.ga // self.gr, len(ep.recurrent_chain))
        for pos in range(top - 1, -1, -1):
            if self.valid.get(("recurrent", ep.recurrent_chain[pos]), False):
                return (pos + 1) * self.gr
        return 0

    def _advance_n(self, ep: EpisodeReplay) -> None:
        while ep.n < len(ep.chain) and self.valid.get(("attention", ep.chain[ep.n]), False):
            ep.n += 1

    def _r_max(self, ep: EpisodeReplay) -> int:
        for pos in range(len(ep.recurrent_chain) - 1, -1, -1):
            if self.valid.get(("recurrent", ep.recurrent_chain[pos]), False):
                return (pos + 1) * self.gr
        return 0

    def _current(self, ep: EpisodeReplay) -> Depths:
        a_max = min(ep.n * self.ga // self.gr, len(ep.recurrent_chain)) * self.gr
        return Depths(a_max, self._r_max(ep), ep.j)

    # -- event handlers ---------------------------------------------------------------------

    def waiting_entry(self, rid: str, pc: int, seq: int, chain: tuple[int, ...],
                      rchain: tuple[int, ...], prompt_tokens: int = 0) -> None:
        if prompt_tokens > 0:  # only boundaries <= L - 1 are adoptable supply (SPEC §5, §7)
            rchain = rchain[: (prompt_tokens - 1) // self.gr]
        ep = self.out.episodes.get((rid, pc))
        if ep is None:
            ep = self.out.episodes[(rid, pc)] = EpisodeReplay(rid, pc)
        if ep.entry_seq is not None:
            return  # a later duplicate waiting entry; the first one defines the episode
        ep.entry_seq, ep.chain, ep.recurrent_chain = seq, chain, rchain
        ep.n = 0
        self._advance_n(ep)
        ep.j = self._best_j(ep)
        ep.entry = self._current(ep)
        if ep.adopt_seq is not None:
            return  # adopted before it entered: no window to watch
        ep.waiting = True
        ep.changes = []
        reach = len(rchain) * (self.gr // self.ga)  # blocks beyond it never move J
        for pos, h in enumerate(chain[:reach]):
            self.watch.setdefault(("attention", h), {}).setdefault((rid, pc), []).append(
                ("attention", pos))
        for pos, h in enumerate(rchain):
            self.watch.setdefault(("recurrent", h), {}).setdefault((rid, pc), []).append(
                ("recurrent", pos))

    def adoption(self, rid: str, pc: int, seq: int, step: int, depth: int) -> None:
        ep = self.out.episodes.get((rid, pc))
        if ep is None:
            ep = self.out.episodes[(rid, pc)] = EpisodeReplay(rid, pc)
        if ep.adopt_seq is not None:
            return  # a later duplicate adoption; the first one is the episode's
        ep.adopt_seq, ep.adopt_step, ep.j_adopt = seq, step, depth
        if ep.waiting:
            ep.exact = self._current(ep)
            ep.waiting = False
            for h in ep.chain[: len(ep.recurrent_chain) * (self.gr // self.ga)]:
                self.watch.get(("attention", h), {}).pop((rid, pc), None)
            for h in ep.recurrent_chain:
                self.watch.get(("recurrent", h), {}).pop((rid, pc), None)

    def supply(self, seq: int, state_kind: str, h: int, is_pub: bool, cause: str,
               requester: str) -> None:
        key = (state_kind, h)
        if is_pub:
            self.out.publications += 1
        else:
            self.out.losses += 1
        before = self.valid.get(key, False)
        self.valid[key] = is_pub
        if before == is_pub:
            return
        watchers = self.watch.get(key)
        if not watchers:
            return
        for (rid, pc), positions in watchers.items():
            ep = self.out.episodes[(rid, pc)]
            j_old = ep.j
            for kind, pos in positions:
                if kind == "attention":
                    if is_pub and pos == ep.n:
                        self._advance_n(ep)
                        ep.j = self._best_j(ep)
                    elif not is_pub and pos < ep.n:
                        ep.n = pos
                        ep.j = self._best_j(ep)
                else:
                    b = (pos + 1) * self.gr
                    if is_pub and b <= ep.n * self.ga and b > ep.j:
                        ep.j = b
                    elif not is_pub and b == ep.j:
                        ep.j = self._best_j(ep)
            if ep.j != j_old:
                assert ep.changes is not None, "a watched episode has no change list: bug"
                other = (not is_pub and requester != "" and requester != rid
                         and cause in OTHER_ALLOCATION_CAUSES)
                ep.changes.append(DepthChange(seq, "publication" if is_pub else "loss",
                                              j_old, ep.j, cause, requester, other))


def _columns(table: pa.Table) -> dict[str, list]:
    order = table.column("seq").to_numpy().argsort(kind="stable")
    t = table.take(pa.array(order))
    names = ("seq", "kind", "step", "request_id", "preemption_count", "hash", "state_kind",
             "cause", "requester", "depth", "chain", "recurrent_chain")
    return {n: t.column(n).to_pylist() for n in names}


def episode_requests(table: pa.Table) -> list[str]:
    """Every request id with a waiting entry or an adoption (the replay's episodes' ids)."""
    kinds = table.column("kind")
    rows = pac.or_(pac.equal(kinds, "waiting_entry"), pac.equal(kinds, "adoption"))
    ids = pac.unique(pac.filter(table.column("request_id"), rows)).to_pylist()
    return [r for r in ids if r]


def sample_requests(request_ids: Iterable[str], limit: int) -> frozenset[str]:
    """A deterministic sample of at most ``limit`` request ids: those with the smallest CRC-32
    of their UTF-8 bytes (ties by id). Independent of table order, the same on every run."""
    if limit < 1:
        raise ValueError(f"sample limit must be >= 1, got {limit}")
    ids = list(request_ids)
    if len(ids) <= limit:
        return frozenset(ids)
    # the limit-th smallest CRC by selection, then only the ids at that CRC sorted: the same
    # set as sorting every (CRC, id) pair, without a Python key call per id
    crcs = np.fromiter(map(zlib.crc32, map(str.encode, ids)), dtype=np.uint32, count=len(ids))
    cut = np.partition(crcs, limit - 1)[limit - 1]
    below = [ids[i] for i in np.flatnonzero(crcs < cut)]
    at = sorted(ids[i] for i in np.flatnonzero(crcs == cut))
    return frozenset(below + at[:limit - len(below)])


def restrict(table: pa.Table, requests: Collection[str]) -> pa.Table:
    """The rows the replay of ``requests``' episodes reads, with vectorized filters: their
    waiting entries and adoptions, and every publication or loss of an entry on one of their
    chains. Replaying this table gives each of those episodes exactly what the whole table
    gives it: an episode's state depends only on its own rows and its chains' entries."""
    kinds = table.column("kind")
    wanted = pa.array(sorted(requests), pa.string())
    own = pac.and_(pac.or_(pac.equal(kinds, "waiting_entry"), pac.equal(kinds, "adoption")),
                  pac.is_in(table.column("request_id"), value_set=wanted))
    mine = table.filter(own)

    def keys(col: str) -> pa.Array:
        values = pac.list_flatten(mine.column(col))
        return pac.unique(values.combine_chunks() if isinstance(values, pa.ChunkedArray)
                         else values)

    sk, h = table.column("state_kind"), table.column("hash")
    supply = pac.and_(
        pac.or_(pac.equal(kinds, "publication"), pac.equal(kinds, "loss")),
        pac.or_(pac.and_(pac.equal(sk, "attention"), pac.is_in(h, value_set=keys("chain"))),
               pac.and_(pac.equal(sk, "recurrent"),
                       pac.is_in(h, value_set=keys("recurrent_chain")))))
    return table.filter(pac.or_(own, pac.fill_null(supply, False)))


def replay(table: pa.Table, meta: RunMeta | None = None, *, source: str = "table",
           requests: Collection[str] | None = None) -> Replay:
    """Replay every episode of ``table`` (an event table with the shared columns), or only the
    episodes of ``requests`` (then over :func:`restrict`'s rows; ``publications`` and
    ``losses`` then count only the entries of their chains)."""
    check_columns(table, source, LINEAGE_COLUMNS)
    meta = meta if meta is not None else table_meta(table, source)
    if requests is not None:
        table = restrict(table, requests)
    w = _Walker(meta)
    c = _columns(table)
    history: dict[Key, list[tuple[int, int, bool, str]]] = {}  # key -> [(step, seq, pub, rid)]
    for i, kind in enumerate(c["kind"]):
        if kind == "publication" or kind == "loss":
            sk = c["state_kind"][i]
            if sk != "attention" and sk != "recurrent":
                continue
            is_pub = kind == "publication"
            h, seq = c["hash"][i], c["seq"][i]
            w.supply(seq, sk, h, is_pub, c["cause"][i], c["requester"][i])
            history.setdefault((sk, h), []).append((c["step"][i], seq, is_pub,
                                                    c["request_id"][i]))
        elif kind == "waiting_entry" and c["request_id"][i]:
            w.waiting_entry(c["request_id"][i], c["preemption_count"][i], c["seq"][i],
                            tuple(c["chain"][i] or ()), tuple(c["recurrent_chain"][i] or ()),
                            c["depth"][i] or 0)
        elif kind == "adoption" and c["request_id"][i]:
            w.adoption(c["request_id"][i], c["preemption_count"][i], c["seq"][i],
                       c["step"][i], c["depth"][i])
    _lookup_brackets(w.out, history)
    return w.out


def _lookup_brackets(out: Replay,
                     history: dict[Key, list[tuple[int, int, bool, str]]]) -> None:
    """M0/M1 depths at each windowed episode's lookup step. M1 adds publications inside the
    step by other requests (the looking-up request's own publications follow its lookup)."""
    index: dict[Key, tuple[list[int], list[bool], list[str]]] = {}

    def step_index(key: Key) -> tuple[list[int], list[bool], list[str]]:
        got = index.get(key)
        if got is None:
            rows = sorted(history.get(key, ()))
            got = index[key] = ([r[0] for r in rows], [r[2] for r in rows],
                                [r[3] for r in rows])
        return got

    def m0_m1(key: Key, step: int, rid: str) -> tuple[bool, bool]:
        steps, pubs, rids = step_index(key)
        lo, hi = bisect_left(steps, step), bisect_right(steps, step)
        m0 = pubs[lo - 1] if lo > 0 else False
        return m0, m0 or any(pubs[k] and rids[k] != rid for k in range(lo, hi))

    ga, gr = out.meta.attention_grid_tokens, out.meta.recurrent_grid_tokens
    for ep in out.episodes.values():
        if not ep.has_window or ep.adopt_step is None or ep.adopt_step < 0:
            continue
        s = ep.adopt_step
        att = [m0_m1(("attention", h), s, ep.request_id) for h in ep.chain]
        rec = [m0_m1(("recurrent", h), s, ep.request_id) for h in ep.recurrent_chain]
        ep.m0 = depths_from_flags([a[0] for a in att], [r[0] for r in rec], ga, gr)
        ep.m1 = depths_from_flags([a[1] for a in att], [r[1] for r in rec], ga, gr)


# -- comparison with the SQL --------------------------------------------------------------------

ENDPOINT_FIELDS = ("j_enter", "j_adopt")
DETAIL_FIELDS = ("class", "a_max_entry", "r_max_entry", "a_max_m0", "a_max_m1", "a_max_exact",
                 "r_max_m0", "r_max_m1", "r_max_exact", "depth_increasing_publications",
                 "depth_decreasing_losses", "other_request_allocation_losses")


def replay_row(ep: EpisodeReplay) -> dict[str, object]:
    """The replay's values under the ``episode_lineage`` column names."""
    def pick(d: Depths | None, attr: str) -> int | None:
        return None if d is None else int(getattr(d, attr))

    return {
        "request_id": ep.request_id, "preemption_count": ep.preemption_count,
        "j_enter": ep.j_enter, "j_adopt": ep.j_adopt, "class": ep.klass,
        "a_max_entry": pick(ep.entry, "a_max"), "r_max_entry": pick(ep.entry, "r_max"),
        "a_max_m0": pick(ep.m0, "a_max"), "a_max_m1": pick(ep.m1, "a_max"),
        "a_max_exact": pick(ep.exact, "a_max"),
        "r_max_m0": pick(ep.m0, "r_max"), "r_max_m1": pick(ep.m1, "r_max"),
        "r_max_exact": pick(ep.exact, "r_max"),
        "depth_increasing_publications": ep.count("publication") if ep.has_window else None,
        "depth_decreasing_losses": ep.count("loss") if ep.has_window else None,
        "other_request_allocation_losses": ep.other_losses() if ep.has_window else None,
    }


@dataclass(frozen=True, slots=True)
class Agreement:
    """SQL versus replay: endpoints (J_enter, J_adopt) and every compared detail field."""

    episodes: int
    agree: int  # episodes whose J_enter and J_adopt agree
    details_agree: int  # episodes whose every field agrees
    disagreements: tuple[tuple[str, int, str, object, object], ...]  # first few, for messages

    @property
    def complete(self) -> bool:
        return self.agree == self.episodes == self.details_agree


def compare(sql_rows: Iterable[dict[str, object]], rep: Replay, keep: int = 10,
            requests: Collection[str] | None = None) -> Agreement:
    """Compare ``episode_lineage`` rows with the replay, episode by episode (only the episodes
    of ``requests`` when given: a sampled replay)."""
    sql_by_key = {(str(r["request_id"]), int(r["preemption_count"])): r  # type: ignore[call-overload]
                  for r in sql_rows if requests is None or r["request_id"] in requests}
    keys = set(sql_by_key) | set(rep.episodes)
    agree = details = 0
    bad: list[tuple[str, int, str, object, object]] = []
    for key in sorted(keys):
        s = sql_by_key.get(key)
        ep = rep.episodes.get(key)
        if s is None or ep is None:
            if len(bad) < keep:
                bad.append((key[0], key[1], "episode", s is not None, ep is not None))
            continue
        r = replay_row(ep)
        if all(s[f] == r[f] for f in ENDPOINT_FIELDS):
            agree += 1
        diffs = [f for f in ENDPOINT_FIELDS + DETAIL_FIELDS if s[f] != r[f]]
        if not diffs:
            details += 1
        for f in diffs:
            if len(bad) < keep:
                bad.append((key[0], key[1], f, s[f], r[f]))
    return Agreement(len(keys), agree, details, tuple(bad))

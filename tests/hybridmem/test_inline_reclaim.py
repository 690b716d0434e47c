"""``_make_free`` reclaims a cached block's page inline: the same
events, pool watcher calls and final state as the general path it replaces (each LRU head through
``_reclaim`` -> ``_lose_block`` -> ``unhold`` -> ``reclaim``), beside a negative control (the
general path reclaiming the newest page instead of the oldest is told apart)."""

import pytest

from benchmarks.bench_allocator import run_mix
from hybridmem.cached_org import CachedOrganization
from hybridmem.events import Cause, EventKind, RecordingObserver, StateKind

from .pool_calls import PROMPTS, U, record_pool_calls


def _general(newest=False):
    """The loop before the inline path: every LRU head through ``_reclaim``."""
    def make_free(self, pool, need, requester):
        while len(pool._free) < need:
            page = next(reversed(pool._cached)) if newest else pool.oldest_cached()
            self._reclaim(pool, page, Cause.ALLOCATION, requester)
    return make_free


def _run(org_name, monkeypatch, make_free=None):
    with monkeypatch.context() as m:
        calls = record_pool_calls(m)
        if make_free is not None:
            m.setattr(CachedOrganization, "_make_free", make_free)
        obs = RecordingObserver()
        ops = run_mix(org_name, U, "b63", PROMPTS, obs)
    return ops, obs.events, calls


@pytest.mark.parametrize("org_name", ["D0", "S0", "S2"])
def test_inline_block_reclaim_equals_the_general_path(org_name, monkeypatch):
    inline = _run(org_name, monkeypatch)
    losses = [e for e in inline[1] if e.kind == EventKind.LOSS and e.cause == Cause.ALLOCATION
              and e.state_kind == StateKind.ATTENTION]
    assert len(losses) > 100  # the mix reclaims blocks (the path under test runs)
    assert ("attention" if org_name == "D0" else "shared", losses[0].page, "reclaim") in inline[2]
    assert _run(org_name, monkeypatch, _general()) == inline
    # negative control: the general path reclaiming the LRU tail is told apart
    assert _run(org_name, monkeypatch, _general(newest=True))[1:] != inline[1:]

"""A forgotten block's object is reused by the next block on its
page, and publish passes only the blocks within ``computed``. Same events, pool watcher calls
and results as building a new block every time, beside a negative control (a reuse that hands a
page the block of another page is told apart)."""

import pytest

from benchmarks.bench_allocator import run_mix
from hybridmem.budget import parse_budget, plan_budget
from hybridmem.events import RecordingObserver
from hybridmem.memory.blocks import Block
from hybridmem.memory.layouts import build
from hybridmem.memory.organization import MemoryOrganization

from .pool_calls import PROMPTS, U, record_pool_calls


class _NoSpare(list):
    """Keeps nothing: every block is built new (the behaviour before reuse)."""

    def __setitem__(self, page, blk):
        super().__setitem__(page, None)


class _ShiftedSpare(list):
    """The fault: a page gets the block forgotten on the next page (wrong ``page`` field)."""

    def __getitem__(self, page):
        return super().__getitem__((page + 1) % len(self))


def _run(org_name, monkeypatch, spare_cls=None):
    reused = []
    with monkeypatch.context() as m:
        calls = record_pool_calls(m)
        if spare_cls is not None:
            def spare(self, pool):
                lst = self.spare_blocks.get(pool.name)
                if lst is None:
                    lst = self.spare_blocks[pool.name] = spare_cls([None] * pool.total)
                return lst
            m.setattr(MemoryOrganization, "_spare", spare)
        real_block_init = Block.__init__
        built = []

        def block_init(self, *args, **kw):
            built.append(1)
            real_block_init(self, *args, **kw)
        m.setattr(Block, "__init__", block_init)
        obs = RecordingObserver()
        ops = run_mix(org_name, U, "b63", PROMPTS, obs)
        reused.append(len(built))
    return (ops, obs.events, calls), reused[0]


@pytest.mark.parametrize("org_name", ["D0", "S0", "S2"])
def test_block_reuse_equals_new_blocks(org_name, monkeypatch):
    reuse, built_reuse = _run(org_name, monkeypatch)
    fresh, built_fresh = _run(org_name, monkeypatch, _NoSpare)
    allocations = sum(1 for c in reuse[2] if c[2] == "take")
    assert built_reuse < built_fresh  # objects were reused (the path under test runs)
    assert fresh == reuse
    if org_name == "D0":  # at most one block object per page of the attention pool
        plan = plan_budget(U, parse_budget("b63", U))
        pages = plan.d0.attention_units  # the mix's attention pool
        assert built_reuse <= pages < built_fresh and allocations > 2 * pages


def test_a_wrong_reuse_is_told_apart(monkeypatch):
    """Negative control: reusing the block forgotten on another page changes the events."""
    reuse, _ = _run("D0", monkeypatch)
    with pytest.raises(AssertionError):  # the checks catch it, or the events differ
        shifted, _ = _run("D0", monkeypatch, _ShiftedSpare)
        assert shifted[1] == reuse[1]


def test_publish_stops_at_computed_and_at_the_blocks_held():
    """``computed // g_a`` blocks at most, and never past the blocks the request holds."""
    org = build("D0", U, (400, 9))
    tokens = list(range(1, 3001))
    org.add_request("a", tokens)
    org.adopt("a", org.lookup("a"))
    assert org.allocate("a", 100).ok  # 7 blocks of 16 tokens, the last ends at 112
    chain = org.hash_chains("a")[0]
    attention = set(chain)

    def publish(rid, computed):  # the attention keys published (recurrent ones dropped)
        return [k for k in org.publish(rid, computed) if k in attention]

    assert publish("a", 95) == list(chain[:5])  # blocks ending at 16..80 (96 > 95)
    assert publish("a", 96) == [chain[5]]
    assert publish("a", 2000) == [chain[6]]  # computed past the blocks held: 7 only
    assert org.allocate("a", 200).ok
    assert publish("a", 2000) == list(chain[7:13])  # 13 blocks held
    org.add_request("b", tokens)
    hit = org.lookup("b")
    assert hit.a_max == 0 and hit.j == 0  # D0: a_max on the 1,792 grid, 13 x 16 below it
    org.adopt("b", hit)
    assert org.allocate("b", 300).ok
    assert publish("b", 300) == list(chain[13:18])  # 0-12 discoverable on a's copies
    assert org.requests["b"].waits == list(chain[:13])
    org.check_integrity()

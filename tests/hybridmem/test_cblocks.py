"""Session 7 (issue 15 item 3): the compiled per-block loops (hybridmem/_cblocks.c) leave the
organizations in the same state after every call as the Python loops they transcribe, beside a
negative control per compiled loop (a deliberate fault switched on in the C code is told
apart), and the Python loops run when the extension is absent or switched off.

The compiled loops run only with no observer recording events (publish, reclaim) and no pool
watcher, so these runs use the ``NullObserver`` and compare the whole state instead of events:
every pool's reference and hold counts, free deque and LRU order, the index, the waiters, every
request's blocks (page, depth, key, holders), the owner and spare records, and every result.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

from benchmarks import allocator_digest, bench_allocator
from hybridmem import cached_org
from hybridmem.cached_org import Block
from hybridmem.events import NullObserver
from hybridmem.names import ENV_BLOCKS_PURE

from .pool_calls import PROMPTS, U

cblocks = pytest.importorskip("hybridmem._cblocks", reason="extension not built (optional)")
ROOT = Path(__file__).resolve().parents[2]
POLICIES = allocator_digest.POLICIES


def _entry(e: object) -> object:
    if e.__class__ is Block:
        return ("B", e.page, e.depth, e.key, tuple(sorted(e.holders)))  # type: ignore[attr-defined]
    return None if e is None else (type(e).__name__, getattr(e, "ident", e))


def state(org: Any, full: bool) -> str:
    """What the per-block loops read or write, in a canonical text: the counts, every pool's
    lists and the requests' tables after each call; the index, the waiters, every block's
    fields and the owner and spare records too when ``full`` (every 32nd call, and last)."""
    parts: list[object] = [org.num_blocks, org.held(), org.available()]
    for pool in org.pools():
        parts.append(array("q", pool._refs + pool._holds + list(pool._free)
                           + list(pool._cached) + [pool.num_in_use]).tobytes())
    for rid, req in sorted(org.requests.items()):
        parts.append((rid, [b.page for b in req.blocks], req.keyed, req.waits, req.computed))
    if full:
        parts.append(sorted((k, b.page, b.depth) for k, b in org.attn_index.items()))
        parts.append(sorted((k, sorted(v)) for k, v in org.key_waiters.items()))
        for _rid, req in sorted(org.requests.items()):
            parts.append([_entry(b) for b in req.blocks])
        for name in sorted(org.owner):
            parts.append((name, [_entry(e) for e in org.owner[name]]))
        for name in sorted(org.spare_blocks):
            parts.append((name, [None if b is None else b.page for b in org.spare_blocks[name]]))
    return repr(parts)


class Diverged(Exception):
    """A run's state after some call differs from the recorded trail's (told apart early)."""


class StateDigest:
    """An organization whose every method call adds its result and the whole state after it
    to one SHA-256 (attributes pass through)."""

    def __init__(self, org: Any, h: Any, trail: list[bytes] | None = None) -> None:
        self._org, self._h, self._calls = org, h, 0
        self._trail = trail

    def __getattr__(self, name: str) -> Any:
        val = getattr(self._org, name)
        if not callable(val) or name.startswith("_"):
            return val

        def call(*args: Any, **kw: Any) -> Any:
            res = val(*args, **kw)
            self._calls += 1
            full = self._calls % 32 == 0 or name == "check_integrity"
            self._h.update(f"{name}{args!r}={res!r};{state(self._org, full)}\n".encode())
            if self._trail is not None:  # the digest after each call, or the first difference
                at = self._calls - 1
                if at < len(self._trail) and self._trail[at] != self._h.digest():
                    raise Diverged(f"call {self._calls} ({name}) differs")
                if at == len(self._trail):
                    self._trail.append(self._h.digest())
            return res
        return call


_CLEAN: dict[tuple[object, ...], str] = {}  # digests with no fault, computed once


def _digest(monkeypatch: pytest.MonkeyPatch, compiled: bool, org: str, seq: str,
            policy: str = "plain", cached: bool = True,
            trail: list[bytes] | None = None) -> str:
    clean = (compiled, org, seq, policy)
    if cached and not _FAULT and clean in _CLEAN:
        return _CLEAN[clean]
    h = hashlib.sha256()
    with monkeypatch.context() as m:
        m.setattr(cached_org, "_cblocks", cblocks if compiled else None)
        if seq == "mix":
            real = bench_allocator.make_organization
            m.setattr(bench_allocator, "make_organization",
                      lambda *a, **k: StateDigest(real(*a, **k), h, trail))
            ops = bench_allocator.run_mix(org, U, "b63", PROMPTS, NullObserver(),
                                          **POLICIES[policy])
            h.update(f"ops={ops}".encode())  # (run_mix ends with check_integrity: full state)
        else:
            real_build = allocator_digest.build
            m.setattr(allocator_digest, "build",
                      lambda *a, **k: StateDigest(real_build(*a, **k), h))
            trace = allocator_digest.random_ops(org, U, POLICIES[policy], NullObserver(),
                                                steps=300)
            h.update(trace.h.digest())  # (random_ops ends with check_integrity: full state)
    if not _FAULT:
        _CLEAN[clean] = h.hexdigest()
    return h.hexdigest()


_FAULT: list[int] = []  # the fault switched on (none: empty)
_TRAIL: list[bytes] = []  # the clean D0 mix's digest after each call (compiled loops)


def _set_fault(mask: int) -> None:
    cblocks._set_fault(mask)
    _FAULT[:] = [mask] if mask else []


@pytest.fixture(autouse=True)
def _no_fault():
    _set_fault(0)
    yield
    _set_fault(0)


@pytest.mark.parametrize("org", ["D0", "S0", "S2"])
def test_compiled_loops_leave_the_python_loops_state_after_every_call(org, monkeypatch):
    for seq, policy in (("mix", "plain"), ("ops", "pin2-ret")):
        assert _digest(monkeypatch, True, org, seq, policy) == \
            _digest(monkeypatch, False, org, seq, policy), (seq, policy)


def test_every_compiled_loop_runs_in_the_d0_mix(monkeypatch):
    """The D0 mix calls each compiled loop (so the equality above covers them all)."""
    called: dict[str, int] = {}

    class Counting:
        def __getattr__(self, name: str) -> Any:
            fn = getattr(cblocks, name)

            def count(*a: Any) -> Any:
                called[name] = called.get(name, 0) + 1
                return fn(*a)
            return count
    monkeypatch.setattr(cached_org, "_cblocks", Counting())
    bench_allocator.run_mix("D0", U, "b63", PROMPTS, NullObserver())
    assert set(called) == {"take_blocks", "unref_blocks", "publish_blocks", "reclaim_run",
                           "ref_blocks", "adopt_blocks", "block_pages", "drop_waits",
                           "indexed_prefix"}


@pytest.mark.parametrize("fault", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_negative_control_a_fault_in_each_compiled_loop_is_told_apart(fault, monkeypatch):
    """1: a new block one token deeper (take), 2: a forgotten block not counted (unref), 4: a
    published key not returned (publish), 8: a run of LRU heads reclaimed newest first, 16:
    one page more counted in use (ref), 32: the last adopted block left out (adopt), 64: a
    hit's pages reversed (lookup), 128: an empty waiter set left in place (release), 256: the
    discoverable prefix 32 blocks longer (lookup; one block longer rounds down to the same
    512-token boundary, an equivalent fault in these mixes)."""
    if not _TRAIL:  # the clean run's state after every call, recorded once
        _digest(monkeypatch, True, "D0", "mix", cached=False, trail=_TRAIL)
    clean = _digest(monkeypatch, True, "D0", "mix")
    _set_fault(fault)
    try:
        # a copy of the trail: the faulty run stops at the first call whose state differs
        faulty = _digest(monkeypatch, True, "D0", "mix", trail=list(_TRAIL))
    except (AssertionError, ValueError, Diverged):  # a check or the trail told it apart
        return
    assert faulty != clean


def test_a_scratch_copy_of_the_module_leaves_the_compiled_loops_working(monkeypatch):
    """invariants.mutation executes a patched copy of cached_org's source, with its own Block
    class, which may reach the compiled loops; each call passes its Block class, so the real
    module's calls still read real blocks (nothing is bound at import)."""
    scratch: dict[str, Any] = {"__name__": "hybridmem.cached_org"}
    exec(compile(inspect.getsource(cached_org), "<scratch>", "exec"), scratch)  # noqa: S102
    assert scratch["Block"] is not Block
    assert cblocks.block_pages(scratch["Block"], (), {}) == ()  # the scratch class, once
    assert _digest(monkeypatch, True, "D0", "mix", cached=False) == \
        _digest(monkeypatch, False, "D0", "mix")


def test_compiled_loops_raise_the_python_loops_assertion(monkeypatch):
    """A double release: the compiled unref raises the text the Python assert carries."""
    org = allocator_digest.build("D0", U, (400, 9))
    org.add_request("a", list(range(1, 200)))
    org.adopt("a", org.lookup("a"))
    assert org.allocate("a", 100).ok
    blk = org.requests["a"].blocks[0]
    pool = blk.pool
    pool._refs[blk.page] = 0
    with pytest.raises(AssertionError, match=f"decref of page {blk.page} with no reference"):
        cblocks.unref_blocks(Block, [blk], "a", pool._refs, pool._holds, pool._cached,
                             pool._free.append, org.owner[pool.name],
                             org.spare_blocks[pool.name], pool.name)
    with pytest.raises(TypeError, match="expected a Block"):
        cblocks.unref_blocks(Block, [object()], "a", pool._refs, pool._holds, pool._cached,
                             pool._free.append, org.owner[pool.name],
                             org.spare_blocks[pool.name], pool.name)


def test_load_compiled_reasons(monkeypatch):
    if os.environ.get(ENV_BLOCKS_PURE, "") in ("", "0"):  # the suite as it runs: compiled
        assert cached_org.IMPLEMENTATION == "c" and cached_org.UNAVAILABLE is None
    monkeypatch.setenv(ENV_BLOCKS_PURE, "1")
    assert cached_org.load_compiled() == (None, f"{ENV_BLOCKS_PURE} is set")
    monkeypatch.setenv(ENV_BLOCKS_PURE, "0")
    assert cached_org.load_compiled()[0] is cblocks
    mod, why = cached_org.load_compiled("hybridmem._no_such_extension")
    assert mod is None and "not importable" in why


@pytest.mark.parametrize("how", ["env", "missing"])
def test_fresh_process_without_the_extension_runs_the_python_loops(how, monkeypatch):
    """Import blocked (or switched off): the Python loops, the same results as compiled."""
    code = ("import sys, hashlib\n"
            + ("sys.modules['hybridmem._cblocks'] = None\n" if how == "missing" else "")
            + "from hybridmem import cached_org\n"
            "from benchmarks.allocator_digest import random_ops\n"
            "from hybridmem.events import NullObserver\n"
            "from tests.hybridmem.pool_calls import U\n"
            "print(cached_org.IMPLEMENTATION, cached_org.UNAVAILABLE is not None)\n"
            "print(random_ops('D0', U, {}, NullObserver(), steps=300).h.hexdigest())\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env[ENV_BLOCKS_PURE] = "1" if how == "env" else ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out[:2] == ["python", "True"]
    monkeypatch.setattr(cached_org, "_cblocks", cblocks)
    assert out[2] == allocator_digest.random_ops("D0", U, {}, NullObserver(),
                                                 steps=300).h.hexdigest()

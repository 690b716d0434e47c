"""Behaviour digests of the organizations: same operation sequence -> same events and results.

    PYTHONPATH=. python benchmarks/allocator_digest.py [--requests 60] [--fault]
    benchmarks/ab_allocator_digest.sh OLD_CHECKOUT NEW_CHECKOUT      (A/B: digests must match)

For every organization and three policy settings (none; pin K = 2, budget 3, retention; pin
K = 1 with salts) it runs two deterministic operation sequences and prints one SHA-256 per
(organization, policy, sequence):

* ``mix``: the serving loop of ``bench_allocator.run_mix`` on its seeded workload (budget b63);
* ``ops``: a seeded random driver on a small pool (every public operation: add, lookup, adopt,
  allocate, publish, release_superseded, append_tokens, preempt, release, finish, evict,
  invalidate; the pool is small, so reclaim, losses, pins and retention all occur).

A digest covers every event in emission order (``repr`` of each :class:`Event`, all fields) and
the return value of every call plus ``held()``, ``available()`` and ``allocated_bytes()`` after
it. ``ops`` also runs with the :class:`NullObserver` (the disabled path, where the
organizations skip building events): its results-only digest must equal the results-only
digest of the recording run, or the line says ``NULL-PATH DIFFERS`` and the exit status is 1.

``--fault`` injects a deliberate fault (the LRU reclaims the newest cached page instead of the
oldest) so a reader can see the digests change: the negative control of the A/B comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hybridmem.events import Event, NullObserver, Observer
from hybridmem.geometry import PRESETS
from hybridmem.units import Units, derive_units

try:  # the A/B runs this copy against an older checkout too, whose layouts lived elsewhere
    from hybridmem.memory.layouts import LAYOUTS as ORGANIZATIONS
    from hybridmem.memory.layouts import build
    from hybridmem.memory.pool import PagePool
except ImportError:  # pragma: no cover - an older checkout on the path
    from hybridmem.organization import ORGANIZATIONS, build  # type: ignore[no-redef]
    from hybridmem.page_pool import PagePool  # type: ignore[no-redef]

POLICIES: dict[str, dict[str, Any]] = {
    "plain": {},
    "pin2-ret": {"pin_k": 2, "pin_budget": 3, "retention": True},
    "pin1-salt": {"pin_k": 1},
}


class DigestObserver:
    """Hashes every event it receives (``repr``: all fields, enum names included)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.count = 0

    def on_event(self, event: Event) -> None:
        self.h.update(repr(event).encode())
        self.count += 1


class Trace:
    """Hashes call results and the accounting after each call."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def note(self, org: Any, label: str, result: object) -> None:
        self.h.update(f"{label}={result!r};{org.held()!r};{org.available()!r};"
                      f"{org.allocated_bytes()}\n".encode())


def capacity(name: str) -> int | tuple[int, int]:
    """Small pools: a few requests fit, so reclaim and preemption happen often."""
    return (1500, 9) if name == "D0" else {"S0": 14, "S1": 40, "S2": 34}[name]


def random_ops(name: str, units: Units, policy: dict[str, Any], observer: Observer,
               seed: int = 0, steps: int = 400) -> Trace:
    """A seeded random but always legal operation sequence on a small pool."""
    rng = random.Random(seed)
    salts = policy.get("pin_k") == 1
    pol = dict(policy)
    org = build(name, units, capacity(name), observer, **pol)
    grid = 512  # the allocation chunk, every organization
    span = org.recurrent_grid  # prompt lengths scale with the checkpoint interval
    contexts = [[rng.randrange(1, 1000) for _ in range(4 * span)] for _ in range(3)]
    trace = Trace()
    waiting: list[str] = []
    running: dict[str, int] = {}
    serial = 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.25 or not (waiting or running):  # a new request
            rid = f"q{serial}"
            serial += 1
            ctx = contexts[rng.randrange(3)]
            shared = rng.randrange(0, 3 * span)
            tail = [5000 + serial * 7 + j for j in range(rng.randrange(1, 2 * span))]
            salt = rng.choice([None, "a", "b"]) if salts else None
            org.add_request(rid, ctx[:shared] + tail, salt)
            trace.note(org, f"add {rid}", None)
            waiting.append(rid)
        elif op < 0.45 and waiting:  # admit the oldest waiting request
            rid = waiting[0]
            hit = org.lookup(rid)
            trace.note(org, f"lookup {rid}", hit)
            org.adopt(rid, hit)
            n = min(len(org.requests[rid].tokens), hit.j + grid)
            res = org.allocate(rid, n)
            trace.note(org, f"adopt+allocate {rid} {n}", res)
            if res.ok:
                waiting.pop(0)
                running[rid] = n
            else:
                org.release(rid)
                trace.note(org, f"release {rid}", None)
        elif op < 0.80 and running:  # advance a running request by one chunk
            rid = rng.choice(sorted(running))
            n = running[rid]
            trace.note(org, f"publish {rid} {n}", org.publish(rid, n))
            trace.note(org, f"superseded {rid}", org.release_superseded(rid))
            total = len(org.requests[rid].tokens)
            if n >= total:
                if rng.random() < 0.3:  # decode a few tokens, then continue
                    org.append_tokens(rid, [7000 + serial + j for j in range(rng.randrange(1, 40))])
                    trace.note(org, f"append {rid}", org.hash_chains(rid))
                    continue
                org.finish(rid)
                trace.note(org, f"finish {rid}", None)
                del running[rid]
                continue
            m = min(total, n + grid)
            res = org.allocate(rid, m)
            trace.note(org, f"allocate {rid} {m}", res)
            if res.ok:
                running[rid] = m
        elif op < 0.88 and running:  # preempt
            rid = rng.choice(sorted(running))
            trace.note(org, f"preempt {rid}", org.preempt(rid))
            del running[rid]
            waiting.insert(0, rid)
        elif op < 0.94:
            trace.note(org, "evict", org.evict(rng.randrange(1, 4)))
        else:
            keys = sorted(org.attn_index) + sorted(org.rec_index)
            key = rng.choice(keys) if keys else 12345
            trace.note(org, f"invalidate {key}", org.invalidate(key))
    org.check_integrity()
    return trace


@contextmanager
def lru_fault() -> Iterator[None]:
    """The negative control: reclaim the NEWEST cached page (a plausible LRU bug)."""
    orig = PagePool.oldest_cached
    PagePool.oldest_cached = lambda self: next(reversed(self._cached), None)  # type: ignore
    try:
        yield
    finally:
        PagePool.oldest_cached = orig  # type: ignore[method-assign]


def slab_units() -> Units:
    """Falcon-H1-7B with 2 conv slots per slab (slabs fill, so slab reclaim happens)."""
    from dataclasses import replace

    units = derive_units(PRESETS["falcon-h1-7b"])
    return replace(units, slots_per_slab=2)


def digests(requests: int = 60, steps: int = 400,
            orgs: tuple[str, ...] = tuple(ORGANIZATIONS)) -> dict[str, str]:
    """``"ORG POLICY SEQUENCE" -> digest``; ``...ops-null-agrees`` -> "yes"/"NO"."""
    import importlib.util
    from pathlib import Path

    # this checkout's benchmark mix, whichever checkout's hybridmem is on the path (A/B)
    spec = importlib.util.spec_from_file_location(
        "_bench_allocator", Path(__file__).with_name("bench_allocator.py"))
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run_mix, workload = bench.run_mix, bench.workload
    units = derive_units(PRESETS["falcon-h1-7b"])
    prompts = workload(requests)
    out: dict[str, str] = {}
    for name in orgs:
        for pname, policy in POLICIES.items():
            rec = DigestObserver()
            ops = run_mix(name, units, "b63", prompts, rec, **policy)
            out[f"{name} {pname} mix"] = f"{rec.h.hexdigest()[:24]} ({rec.count} events, " \
                f"{ops} ops)"
            rec = DigestObserver()
            trace = random_ops(name, units, policy, rec, steps=steps)
            both = hashlib.sha256((rec.h.hexdigest() + trace.h.hexdigest()).encode())
            out[f"{name} {pname} ops"] = f"{both.hexdigest()[:24]} ({rec.count} events)"
            null = random_ops(name, units, policy, NullObserver(), steps=steps)
            out[f"{name} {pname} ops-null-agrees"] = \
                "yes" if null.h.digest() == trace.h.digest() else "NO"
            if name == "S2":  # again with 2-slot slabs
                rec = DigestObserver()
                trace = random_ops(name, slab_units(), policy, rec, steps=steps)
                both = hashlib.sha256((rec.h.hexdigest() + trace.h.hexdigest()).encode())
                out[f"S2/2slots {pname} ops"] = f"{both.hexdigest()[:24]} ({rec.count} events)"
                null = random_ops(name, slab_units(), policy, NullObserver(), steps=steps)
                out[f"S2/2slots {pname} ops-null-agrees"] = \
                    "yes" if null.h.digest() == trace.h.digest() else "NO"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--fault", action="store_true", help="inject the LRU fault (control)")
    args = ap.parse_args(argv)
    if not 1 <= args.requests <= 10_000 or not 1 <= args.steps <= 100_000:
        print(f"bad --requests {args.requests} or --steps {args.steps} (1..10000, 1..100000)",
              file=sys.stderr)
        return 2
    if args.fault:
        with lru_fault():
            got = digests(args.requests, args.steps)
    else:
        got = digests(args.requests, args.steps)
    bad = 0
    for key, value in got.items():
        if key.endswith("null-agrees"):
            bad += value != "yes"
            if value != "yes":
                print(f"{key[:-len(' ops-null-agrees')]}: NULL-PATH DIFFERS")
            continue
        print(f"{key:<22} {value}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

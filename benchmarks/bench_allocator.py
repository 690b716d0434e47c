"""Allocator throughput: operations per second for one fixed operation mix per organization.

    PYTHONPATH=. python -O benchmarks/bench_allocator.py [--budget b63] [--requests 300]
                                                         [--repeat 5] [--orgs S0,S1,S2,D0]
    PYTHONPATH=. python benchmarks/bench_allocator.py ...     (the same with invariant checks on)
    ... --clock cpu        (time each run by this thread's CPU time instead of wall time)
    ... --hash-floor       (instead: what the hash chains alone cost each row, and the ratio
                            each organization would reach if nothing else cost anything)
    ... --vllm-keys python|vllm   (how the vLLM rows compute their block keys)

Invariant checks are the organizations' ``assert`` statements (reference-count, ownership and
free-page checks inside every transition); ``python -O`` strips them ("checks off", the
production setting), a plain ``python`` keeps them ("checks on"). The header line says which.
``check_integrity()`` runs once after every timed mix either way.

Every round times each organization and the vLLM rows once, interleaved, so all rows of a round
saw the same machine load; the table gives the fastest round and the ratio columns the median
over rounds of the within-round ratio.

The mix is a small serving loop over a deterministic workload (seeded): 8 shared contexts,
prompts of 1,000-6,000 tokens (about 60% shared prefix), at most 8 requests running. Per request:
register, lookup, adopt; then per 512-token chunk: allocate, publish, release superseded
checkpoints; finally finish (release). Admission waits while ``can_allocate`` fails, so
allocations reclaim LRU cached storage (with invalidation); every 25 requests an explicit
``evict(8)`` runs. Every call counts as one operation. Pools are the budget plan's
(Falcon-H1-7B, per layer). Timing uses the NullObserver (the disabled trace path); the event mix
is counted in a separate run with a recording observer.

If vLLM is importable, the same mix (allocate, publish, lookup, adopt, release, reclaim) runs on
``vllm.v1.core.block_pool.BlockPool`` with 512-token blocks (S0-S2's attention grid, pool of S2's
page count) and again with 16-token blocks (D0's attention grid and vLLM's default block size,
pool of D0's attention unit count): 32 times more blocks, hashes and publications per request,
as D0 has. ``vs vLLM`` compares with the 512-token row, ``vs vLLM@grid`` with the row at the
organization's own attention grid. Without vLLM those rows say so and nothing is estimated.

The vLLM rows compute their block keys in Python per block, as vLLM does (its request block
hasher); ``--vllm-keys`` says how (the organizations always use :mod:`hybridmem.memory.keys`)::

    python    (default) hybridmem.memory.keys.hash_chain, the organizations' own chain: one hashlib
              blake2b per block, the same key cost as the organizations, so the ratio compares
              bookkeeping alone; about what vLLM 0.32's own default hasher costs at 512 tokens,
              less at 16
    vllm      vLLM's own vllm.v1.core.kv_cache_utils.hash_block_tokens with its default
              sha256 (pickle + SHA-256 per block)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from hybridmem.budget import parse_budget, plan_budget
from hybridmem.events import EventKind, NullObserver, Observer, RecordingObserver
from hybridmem.geometry import load_geometry

try:  # allocator_digest's A/B loads this copy against an older checkout too
    from hybridmem.memory.layouts import LAYOUTS, make_organization
except ImportError:  # pragma: no cover - an older checkout on the path
    from hybridmem.organization import ORGANIZATIONS as LAYOUTS  # type: ignore[no-redef]
    from hybridmem.organization import make_organization  # type: ignore[no-redef]
from hybridmem.units import Units, derive_units

CHUNK = 512
MAX_RUNNING = 8
ORG_KEYS = "python"  # hybridmem.memory.keys: hashlib blake2b, the one implementation


def workload(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    contexts = [[rng.randrange(1, 50_000) for _ in range(4096)] for _ in range(8)]
    prompts = []
    for i in range(n):
        length = rng.randrange(1000, 6000)
        shared = min(length - 1, int(length * 0.6))
        tail = [100_000 + i * 10_000 + j for j in range(length - shared)]
        prompts.append(contexts[rng.randrange(8)][:shared] + tail)
    return prompts


def run_mix(name: str, units: Units, budget: str, prompts: list[list[int]],
            observer: Observer, **policy: object) -> int:
    """Run the mix on a fresh organization (``policy``: pinning / retention keywords of
    :func:`make_organization`, none in the benchmark); returns the number of operations."""
    org = make_organization(name, units, plan_budget(units, parse_budget(budget, units)),
                            observer, **policy)
    ops = 0
    waiting = list(range(len(prompts)))
    running: dict[str, int] = {}  # request id -> tokens allocated
    done = 0
    while waiting or running:
        while waiting and len(running) < MAX_RUNNING:
            i = waiting[0]
            rid = f"r{i}"
            if rid not in org.requests:
                org.add_request(rid, prompts[i])
                ops += 1
            hit = org.lookup(rid)
            org.adopt(rid, hit)
            n = min(len(prompts[i]), hit.j + CHUNK)
            ops += 3
            if not org.allocate(rid, n).ok:
                org.release(rid)
                ops += 1
                break
            waiting.pop(0)
            running[rid] = n
        if not running:
            raise RuntimeError(f"{name}: a {len(prompts[waiting[0]])}-token request cannot "
                               f"be admitted into an empty {budget} pool")
        for rid in list(running):
            n = running[rid]
            org.publish(rid, n)
            org.release_superseded(rid)
            ops += 2
            total = len(org.requests[rid].tokens)
            if n >= total:
                org.finish(rid)
                del running[rid]
                ops += 1
                done += 1
                if done % 25 == 0:
                    org.evict(8)
                    ops += 1
                continue
            ops += 1
            if org.allocate(rid, min(total, n + CHUNK)).ok:
                running[rid] = min(total, n + CHUNK)
            elif len(running) > 1:  # out of storage: preempt it (recompute later)
                org.preempt(rid)
                ops += 1
                del running[rid]
                waiting.insert(0, int(rid[1:]))
    org.check_integrity()
    return ops


VLLM_KEYS = ("python", "vllm")


def vllm_keys(how: str, block_tokens: int) -> Callable[[list[int]], list[bytes]]:
    """The vLLM rows' block keys of one prompt (``--vllm-keys``, see the module docstring)."""
    from hybridmem.events import StateKind
    from hybridmem.memory import keys as hashing

    kind = StateKind.ATTENTION
    if how == "python":
        def keys(prompt: list[int]) -> list[bytes]:
            return [k.to_bytes(8, "big") for k in
                    hashing.hash_chain(kind, prompt, block_tokens)]
    elif how == "vllm":
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils as kvu

        kvu.init_none_hash(sha256)
        hash_block = kvu.hash_block_tokens

        def keys(prompt: list[int]) -> list[bytes]:
            out: list[bytes] = []
            parent = None
            for lo in range(0, len(prompt) - block_tokens + 1, block_tokens):
                parent = hash_block(sha256, parent, prompt[lo:lo + block_tokens], None)
                out.append(parent)
            return out
    else:
        raise ValueError(f"--vllm-keys {how!r}: choose from {', '.join(VLLM_KEYS)}")
    return keys


def vllm_mix(prompts: list[list[int]], num_blocks: int, block_tokens: int = CHUNK,
             keys_of: str = "python") -> Callable[[], int] | str:
    """The same mix on vLLM's BlockPool with ``block_tokens``-token blocks: a callable that runs
    it once and returns its operation count, or a string that says why it cannot run."""
    try:
        from vllm.v1.core import block_pool as vbp
    except ImportError as exc:
        return f"not run: vLLM is not importable here ({exc.name})"
    import inspect

    block_keys = vllm_keys(keys_of, block_tokens)
    params = inspect.signature(vbp.BlockPool).parameters
    kwargs: dict[str, Any] = {"num_gpu_blocks": num_blocks, "enable_caching": True}
    if "hash_block_size" in params:
        kwargs["hash_block_size"] = block_tokens
    pool = vbp.BlockPool(**kwargs)
    touch_takes_tuple = "tuple" in str(inspect.signature(pool.touch))  # newer vLLM: per group
    published: dict[bytes, tuple[Any, int]] = {}  # key -> (block, allocation generation)
    generation: dict[int, int] = {}

    def run() -> int:
        ops = 0
        published.clear()
        for prompt in prompts:  # sequential: lookup, adopt (touch), allocate, publish, free
            keys = block_keys(prompt)
            hit = []
            for key in keys:
                entry = published.get(key)
                if entry is None or generation.get(entry[0].block_id) != entry[1]:
                    break  # never published, or its block was reallocated since
                hit.append(entry[0])
            ops += 1
            pool.touch((hit,) if touch_takes_tuple else hit)
            ops += 1
            need = -(-len(prompt) // block_tokens) - len(hit)
            if need > pool.get_num_free_blocks():
                pool.free_blocks(hit)
                ops += 1
                continue
            new = pool.get_new_blocks(need)  # reclaims the oldest free blocks
            for blk in new:
                generation[blk.block_id] = generation.get(blk.block_id, 0) + 1
            ops += 1
            for key, blk in zip(keys[len(hit):], new, strict=False):
                published[key] = (blk, generation[blk.block_id])  # publication (outside vLLM)
            ops += 1
            pool.free_blocks(list(reversed(hit + new)))
            ops += 1
        return ops

    try:
        run()  # once untimed: checks the adapter against this vLLM's API
    except (TypeError, AttributeError) as exc:  # an API this adapter does not know
        return f"not run: vLLM BlockPool API differs from the adapter ({exc})"
    return run


def profile(name: str, model: str, budget: str, requests: int) -> int:
    """Where one organization's mix spends its time: cProfile on the thread's CPU clock (other
    tenants' load does not land on random functions), by own time, top 15."""
    import cProfile
    import pstats

    if name not in LAYOUTS:
        print(f"--profile {name!r}: choose from {', '.join(LAYOUTS)}", file=sys.stderr)
        return 2
    units = derive_units(load_geometry(model))
    prompts = workload(requests)
    prof = cProfile.Profile(time.thread_time_ns, 1e-9)
    prof.enable()
    run_mix(name, units, budget, prompts, NullObserver())
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"{name}: {requests} requests, profiled CPU {stats.total_tt:.3f} s "
          "(profiler overhead included)")
    stats.sort_stats("tottime").print_stats(15)
    return 0


def hash_floor(names: list[str], units: Units, budget: str, prompts: list[list[int]],
               repeat: int, grids: dict[str, int], keys_of: str = "python") -> int:
    """What the keys alone cost each row: this thread's CPU seconds (fastest of ``repeat``) of
    the hash chains of every prompt, as ``add_request`` computes them (the organization's two
    chains, :func:`hybridmem.memory.keys.hash_chain_pair`) and as the vLLM rows do (one attention
    chain at the block size, keys as ``--vllm-keys`` says). ``ceiling`` is the ratio to the vLLM
    row if everything but the keys cost nothing on both sides: (organization ops / its
    hashing) / (vLLM ops / vLLM hashing); against the measured vLLM row (whose block-pool
    calls do cost) the bound is higher by that row's seconds over its hashing seconds."""
    from hybridmem.memory.keys import hash_chain_pair

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.thread_time()
            fn()
            times.append(time.thread_time() - t0)
        return min(times)

    vllm_ops = 5 * len(prompts)  # the vLLM mix: 5 operations per prompt, all admitted
    vllm: dict[int, float] = {}
    for tokens in sorted(set(grids.values()), reverse=True):
        keys = vllm_keys(keys_of, tokens)
        vllm[tokens] = best(lambda keys=keys: [keys(p) for p in prompts])
        print(f"vLLM@{tokens:<5} one chain of {tokens}-token chunks: {vllm[tokens]:.4f} s "
              f"(--vllm-keys {keys_of}; organizations: {ORG_KEYS})")
    for name in names:
        org = make_organization(name, units, plan_budget(units, parse_budget(budget, units)))
        ga, gr = org.attention_grid, org.recurrent_grid
        secs = best(lambda ga=ga, gr=gr: [hash_chain_pair(list(p), ga, gr) for p in prompts])
        ops = run_mix(name, units, budget, prompts, NullObserver())
        ceiling = (ops / secs) / (vllm_ops / vllm[CHUNK]) if CHUNK in vllm else float("nan")
        print(f"{name:<10} two chains ({ga}/{gr}): {secs:.4f} s = {secs / vllm[CHUNK]:.2f}x "
              f"vLLM@{CHUNK}'s; {ops} ops; ceiling vs vLLM@{CHUNK}: {ceiling:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--budget", default="b63")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--model", default="falcon-h1-7b")
    ap.add_argument("--orgs", default=",".join(LAYOUTS),
                    help="comma-separated organizations (default: all)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time each run by wall clock (perf_counter, default) or by this "
                         "thread's CPU time (thread_time: steadier when other processes "
                         "share the cores)")
    ap.add_argument("--profile", metavar="ORG", default=None,
                    help="instead: cProfile one run of ORG's mix (thread CPU clock), top 15")
    ap.add_argument("--hash-floor", action="store_true",
                    help="instead: CPU seconds of the hash chains alone per row, and the ratio "
                         "each organization would reach if nothing else cost anything")
    ap.add_argument("--vllm-keys", choices=VLLM_KEYS, default="python",
                    help="how the vLLM rows compute block keys: python (default: hashlib "
                         "blake2b per block, hybridmem's chain, as the organizations), "
                         "vllm (vLLM's own sha256 block hasher)")
    args = ap.parse_args(argv)
    if args.profile is not None:
        return profile(args.profile, args.model, args.budget, args.requests)
    names = [n for n in args.orgs.split(",") if n]
    bad = [n for n in names if n not in LAYOUTS]
    if bad or not names or args.requests < 1 or args.repeat < 1:
        print(f"bad --orgs {args.orgs!r} (choose from {', '.join(LAYOUTS)}), --requests "
              f"{args.requests} or --repeat {args.repeat}", file=sys.stderr)
        return 2
    units = derive_units(load_geometry(args.model))
    prompts = workload(args.requests)
    grids = {n: (units.d0_attn_tokens if n == "D0" else CHUNK) for n in names}
    if args.hash_floor:
        return hash_floor(names, units, args.budget, prompts, args.repeat, grids, args.vllm_keys)
    plan = plan_budget(units, parse_budget(args.budget, units))
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    print(f"model {args.model}, budget {args.budget}, {args.requests} requests, "
          f"{sum(map(len, prompts))} prompt tokens, {args.repeat} interleaved rounds, invariant "
          f"checks {'ON (asserts active)' if __debug__ else 'OFF (python -O)'}, clock "
          f"{args.clock}, keys: organizations {ORG_KEYS}, "
          f"vLLM rows {args.vllm_keys}", file=sys.stderr)
    mixes: dict[str, tuple[int, int, int, int]] = {}
    for name in names:
        rec = RecordingObserver()
        run_mix(name, units, args.budget, prompts, rec)
        mix = Counter(e.kind for e in rec.events)
        hits = sum(1 for e in rec.events if e.kind == EventKind.ADOPTION and e.depth)
        mixes[name] = (mix[EventKind.PUBLICATION], mix[EventKind.LOSS], hits,
                       sum(mix.values()))
    runs: dict[str, Callable[[], int]] = {
        n: (lambda n=n: run_mix(n, units, args.budget, prompts, NullObserver())) for n in names}
    vllm_rows: dict[int, str] = {}
    for tokens in sorted(set(grids.values()), reverse=True):
        blocks = plan.s2.pages if tokens == CHUNK else plan.d0.attention_units
        got = vllm_mix(prompts, blocks, tokens, args.vllm_keys)
        label = f"vLLM@{tokens}"
        if isinstance(got, str):
            vllm_rows[tokens] = got
        else:
            runs[label] = got
            vllm_rows[tokens] = label
    times: dict[str, list[float]] = {k: [] for k in runs}
    ops: dict[str, int] = {}
    for r in range(args.repeat):
        for key, fn in runs.items():
            t0 = clock()
            ops[key] = fn()
            times[key].append(clock() - t0)
        print(f"  round {r + 1} of {args.repeat}: " + ", ".join(
            f"{k} {ops[k] / times[k][-1]:.0f}" for k in runs) + " ops/s", file=sys.stderr)

    def rate(key: str, i: int | None = None) -> float:
        return ops[key] / (min(times[key]) if i is None else times[key][i])

    def ratio(name: str, ref: str) -> str:
        if ref not in runs:
            return "-"
        med = statistics.median(rate(name, i) / rate(ref, i) for i in range(args.repeat))
        return f"{med:.2f}"

    ref512 = vllm_rows.get(CHUNK, "")
    print(f"{'org':<9}{'ops':>8}{'seconds':>10}{'ops/s':>10}{'us/op':>8}{'events':>9}"
          f"{'publications':>14}{'losses':>8}{'hits':>6}{'vs vLLM':>9}{'vs vLLM@grid':>14}")
    for key in runs:
        secs = min(times[key])
        line = f"{key:<9}{ops[key]:>8}{secs:>10.3f}{rate(key):>10.0f}{1e6 * secs / ops[key]:>8.1f}"
        if key in mixes:
            pubs, losses, hits, n_events = mixes[key]
            line += (f"{n_events:>9}{pubs:>14}{losses:>8}{hits:>6}{ratio(key, ref512):>9}"
                     f"{ratio(key, vllm_rows.get(grids[key], '')):>14}")
        print(line)
    for tokens, row in vllm_rows.items():
        if row not in runs:
            print(f"vLLM BlockPool @{tokens} tokens: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

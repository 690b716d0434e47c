"""A synthetic but realistic event stream (for the benchmark and tests): requests arrive with a
boundary hash chain, allocate, adopt a joint prefix, publish attention blocks and recurrent
checkpoints every 512 tokens, lose entries to other requests' allocations or slab reclaims, get
preempted and resumed now and then, pin, retain, release and finish. Deterministic per seed."""

from __future__ import annotations

import random
from collections.abc import Iterator

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind

GRID = 512


def synthetic_events(n: int, seed: int = 0) -> Iterator[Event]:
    """Exactly ``n`` events (END excluded); every :class:`EventKind` but END appears once
    ``n`` is a few hundred."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    out = 0
    step = 0
    req = 0
    while True:
        req += 1
        rid = f"req-{seed}-{req:06d}"
        other = f"req-{seed}-{max(1, req - rng.randint(1, 5)):06d}"
        prompt = rng.randint(1500, 5000)
        blocks = prompt // GRID
        chain = tuple(rng.getrandbits(64) for _ in range(blocks))
        rchain = tuple(rng.getrandbits(64) for _ in range(blocks))
        pc = 0
        stream = [Event(EventKind.WAITING_ENTRY, step, rid, pc, depth=prompt, chain=chain,
                        recurrent_chain=rchain)]
        need = blocks + 1
        stream.append(Event(EventKind.ALLOCATION, step, rid, pc, need=need,
                            free=rng.randint(0, 200), outcome=Outcome.OK, requester=rid))
        stream.append(Event(EventKind.ADOPTION, step, rid, pc, depth=GRID * rng.randint(0, blocks)))
        for b in range(blocks):
            page = rng.randint(0, 253)
            stream.append(Event(EventKind.PUBLICATION, step + b, rid, pc, chain[b], (b + 1) * GRID,
                                StateKind.ATTENTION, page))
            stream.append(Event(EventKind.PUBLICATION, step + b, rid, pc, rchain[b],
                                (b + 1) * GRID, StateKind.RECURRENT, page,
                                16 * page + rng.randint(0, 15)))
            if rng.random() < 0.3:
                cause = Cause.ALLOCATION if rng.random() < 0.8 else Cause.SLAB_RECLAIM
                stream.append(Event(EventKind.LOSS, step + b, other, 0, rng.getrandbits(64),
                                    GRID * rng.randint(1, 8), StateKind.RECURRENT,
                                    rng.randint(0, 253), -1, cause, rid))
        if rng.random() < 0.1:
            stream.append(Event(EventKind.PIN, step, rid, pc, rchain[-1] if rchain else 0,
                                blocks * GRID, StateKind.RECURRENT, outcome=Outcome.OK))
            stream.append(Event(EventKind.PREEMPTION, step + 1, rid, pc))
            pc += 1
            stream.append(Event(EventKind.RESUME, step + 2, rid, pc, depth=blocks * GRID))
            stream.append(Event(EventKind.UNPIN, step + 2, rid, pc, rchain[-1] if rchain else 0))
        stream.append(Event(EventKind.RETENTION, step, rid, pc, rchain[0] if rchain else 0,
                            GRID, StateKind.RECURRENT,
                            outcome=Outcome.OK if rng.random() < 0.5 else Outcome.BELOW_THRESHOLD))
        stream.append(Event(EventKind.RELEASE, step + blocks, rid, pc, cause=Cause.FINISH))
        stream.append(Event(EventKind.FINISH, step + blocks, rid, pc))
        step += rng.randint(1, 4)
        for e in stream:
            if out == n:
                return
            out += 1
            yield e

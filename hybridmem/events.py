"""State-lifecycle events and the observer interface (SPEC §6, App. C.1, C.3, D.4, F.1).

The memory organizations, the serving engines (the vLLM plugin) and tests *emit* events; the trace
writer, recording observers and runtime checkers *receive* them. Nothing here knows about files or
vLLM: an organization only calls ``observer.on_event(Event(...))``.

One event vocabulary serves every producer, so the trace format, the Parquet event table and the
lineage SQL agree on field meanings:

=================  ==========================================================================
field              meaning
=================  ==========================================================================
kind               :class:`EventKind`
step               scheduler step the event belongs to (-1 when the producer has no steps)
request_id         the request the event is about ("" when none, e.g. a loss by eviction)
preemption_count   episode key with ``request_id``: 0 = INITIAL, >= 1 = RESUME after preemption
hash               64-bit key of the cache entry (block or checkpoint), 0 when none
depth              tokens: boundary of the entry (publication/loss), adopted joint depth
                   (adoption), prompt length (waiting-entry)
state_kind         :class:`StateKind` of the entry
page               physical page / block id, -1 when none
line               conv slot line id ``16 p + s`` (S2), -1 (the sentinel) when none
cause              :class:`Cause` of a loss (or of a release)
requester          request whose allocation caused the loss / made the allocation attempt
need, free         blocks needed and free (incl. reclaimable cached) at an allocation attempt
outcome            :class:`Outcome` of an allocation attempt, pin or retention decision
chain              waiting-entry only: the request's boundary hash chain, one 64-bit hash per
                   grid boundary (attention block keys); ``recurrent_chain`` the recurrent keys
=================  ==========================================================================

Depth values are token counts on the organization's grid (512 for S0-S2; 16 attention / 1,792
recurrent for D0 at Falcon-H1-7B).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, runtime_checkable


class EventKind(IntEnum):
    WAITING_ENTRY = 1  # a request (episode) enters the waiting queue, with its hash chain
    PUBLICATION = 2  # a cache key becomes discoverable (not GPU-write completion)
    LOSS = 3  # a discoverable key stops being discoverable (supply lost), with its cause
    ADOPTION = 4  # the scheduler adopts a joint prefix hit of ``depth`` tokens
    ALLOCATION = 5  # an allocation attempt: need, free, outcome, requester
    RELEASE = 6  # execution references dropped; entries stay cached until reassigned
    PREEMPTION = 7
    RESUME = 8
    FINISH = 9
    PIN = 10  # preemption-time pin of a checkpoint
    UNPIN = 11
    RETENTION = 12  # producer-side retention decision for a checkpoint
    END = 13  # end of run (written by the tracer itself)


class StateKind(IntEnum):
    NONE = 0
    ATTENTION = 1
    RECURRENT = 2  # a complete recurrent checkpoint (all SSM members + conv state)
    CONV = 3  # a conv slot / line on its own (S2 slab bookkeeping)


class Cause(IntEnum):
    NONE = 0
    ALLOCATION = 1  # storage reassigned to satisfy ``requester``'s allocation
    SLAB_RECLAIM = 2  # a conv slab was reclaimed, taking every checkpoint with a slot in it
    EVICTION = 3  # eviction not tied to one allocation (e.g. cache reset, engine policy)
    INVALIDATION = 4  # explicit invalidation (dependency broken, partial checkpoint, reset)
    PREEMPTION = 5  # released because its request was preempted
    FINISH = 6  # released because its request finished


class Outcome(IntEnum):
    NONE = 0
    OK = 1
    REJECTED = 2  # not enough free + reclaimable storage (or admission headroom)
    CAP = 3  # rejected by the running-sequence cap
    BELOW_THRESHOLD = 4  # pin / retention demand below K
    SKIPPED = 5


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    step: int = -1
    request_id: str = ""
    preemption_count: int = 0
    hash: int = 0
    depth: int = 0
    state_kind: StateKind = StateKind.NONE
    page: int = -1
    line: int = -1
    cause: Cause = Cause.NONE
    requester: str = ""
    need: int = 0
    free: int = 0
    outcome: Outcome = Outcome.NONE
    chain: tuple[int, ...] = field(default=())
    recurrent_chain: tuple[int, ...] = field(default=())


@runtime_checkable
class Observer(Protocol):
    """Receives every state-lifecycle event. Must not raise for well-formed events."""

    def on_event(self, event: Event) -> None: ...


class NullObserver:
    """The disabled path: drops everything."""

    __slots__ = ()

    def on_event(self, event: Event) -> None:
        return None


class RecordingObserver:
    """Keeps every event in memory, in emission order (for tests and small runs)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def of_kind(self, *kinds: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]


class FanOut:
    """Sends each event to several observers in order."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = list(observers)

    def on_event(self, event: Event) -> None:
        for obs in self.observers:
            obs.on_event(event)


HASH_MASK = (1 << 64) - 1


def hash64(value: bytes | int) -> int:
    """A 64-bit unsigned key from an engine hash (bytes: first 8, big-endian; int: low 64 bits)."""
    if isinstance(value, int):
        return value & HASH_MASK
    return int.from_bytes(bytes(value[:8]).rjust(8, b"\0"), "big")

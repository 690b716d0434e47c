"""The trace writer: an :class:`~hybridmem.events.Observer` that packs events into preallocated
packet buffers and lets a background thread write them (``tracer/FORMAT.md``).

Memory is bounded: ``ceil(buffer_records / packet_records)`` buffers (at least 2) of
``packet_records`` fixed records each. When every buffer is waiting for the disk, ``policy="block"``
makes the emitting thread wait and ``policy="drop"`` discards the record and counts it; a dropped
record never receives a sequence number, so the count in ``dropped`` (carried in every packet
header and in END) is the only trace it leaves, and the verdict refuses the run::

    emitting threads                     flusher thread
    ----------------                     --------------
    take token; one pack_into            wait for a sealed buffer (or flush_interval_s)
    full? seal -> sealed queue    ---->  take every sealed buffer; crc32 each; write them as
                                         packets (one os.writev; fsync if fsync="packet")
    take a free buffer           <----   give the buffers back to the free pool
    (none free: block or drop)

The emitting state (active buffer, offset, sequence number, string ids) is guarded by a *token*:
a one-element list whose ``pop()`` takes it and ``append()`` gives it back. Both are single
atomic operations (documented as thread safe), and on CPython they cost about a third of
``Lock.acquire()`` + ``release()``, whose argument parsing dominates a 100 B record's cost. A
thread that finds the list empty waits in :meth:`TraceWriter._take` (short sleeps; contention is
rare). The fast path has no other check than "no chain": an enum value outside its enum (END
included) or a string id missing from the dictionary (``KeyError`` from a dict look-up) or a full
or closed buffer (``struct.error`` from ``pack_into``) sends the record to the slow path, which
also validates every field before anything is committed.
Waits (a full pool, the flusher's hand-offs) use a separate condition variable.

``close()`` (also run by ``atexit``, and after SIGTERM through ``SystemExit``) seals the last
buffer, waits for the flusher, then writes the END record with the final counters.

``TraceWriter(...)`` returns the compiled variant of ``tracer/accel.py`` when it is built (same
bytes, same synchronization through the GIL; this class stays the reference and the fallback,
``HYBRIDMEM_TRACER_PURE=1`` forces it).

The disabled path is :data:`NULL_WRITER` (``TraceWriter.disabled()``): its methods do nothing, and
callers on hot paths may test ``writer.enabled`` before building an :class:`Event`.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import signal
import struct
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from typing import IO, Any, NamedTuple

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind
from tracer import cext
from tracer import format as fmt
from tracer.errors import TraceError

POLICIES = ("block", "drop")
WRITEV_PACKETS = 256  # packets per os.writev (two buffers each; Linux takes at most 1,024)
FSYNC_POLICIES = ("none", "close", "packet")
# Keys every trace header carries (None when the caller did not give one).
RUN_META_KEYS = ("organization", "geometry", "budget", "seed", "engine",
                 "attention_grid_tokens", "recurrent_grid_tokens")
CLOCK_SOURCE = "CLOCK_MONOTONIC via time.monotonic_ns(), ns"

_mono = time.monotonic_ns
_NO: tuple[int, ...] = ()  # the empty tuple (a singleton): "no chain" on the fast path
# The enum values an event record may hold (the reader refuses a packet holding any other, so
# one bad field would cost every record packed beside it). The fast path looks each one up
# (``_KINDS[kind]``; a KeyError sends the record to the slow path, which refuses it); END is
# not an event kind here: close() writes it.
_KINDS = {int(k): int(k) for k in EventKind if k is not EventKind.END}
_STATE_KINDS = {int(k): int(k) for k in StateKind}
_CAUSES = {int(k): int(k) for k in Cause}
_OUTCOMES = {int(k): int(k) for k in Outcome}


class WriterStats(NamedTuple):
    records: int  # event records given a sequence number (END excluded)
    dropped: int  # records discarded because every buffer was full (policy "drop")
    write_errors: int  # packet writes that failed (their records are lost from the file)
    lost_records: int  # event records inside the failed packets
    packets: int  # packets written successfully (END packet included once closed)
    bytes_written: int
    dropped_after_close: int  # events offered after END was written (not in the file)
    closed: bool


class _Sealed(NamedTuple):
    buf: bytearray
    length: int
    first_seq: int
    n_records: int
    discarded: int
    pooled: bool


def _json_default(obj: Any) -> Any:
    as_dict = getattr(obj, "as_dict", None)
    if callable(as_dict):
        return as_dict()
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def header_bytes(meta: dict[str, Any]) -> bytes:
    """The file header for ``meta`` (already completed with the writer's own keys)."""
    try:
        text = json.dumps(meta, sort_keys=True, default=_json_default).encode()
    except (TypeError, ValueError) as exc:
        raise TraceError(f"trace metadata is not JSON serializable: {exc}") from None
    if len(text) > fmt.MAX_META_BYTES:
        raise TraceError(f"trace metadata is {len(text):,} B, over the {fmt.MAX_META_BYTES:,} B "
                         "limit")
    head = fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, 0, len(text)) + text
    return head + fmt.HEADER_CRC.pack(fmt.crc32(head))


class _PyNullBase:
    __slots__ = ()

    def on_event(self, event: Event) -> None:
        # (A C-level no-op such as ``deque(maxlen=0).append`` as a class attribute measured
        # no faster on CPython 3.11: the call site's method lookup is then not specialized. A
        # C method descriptor, tracer._ctrace.NullCore.on_event, is: see _null_base.)
        return None


def _null_base() -> Any:
    """``on_event`` of the disabled path: the C method descriptor of ``tracer._ctrace.NullCore``
    when the extension is built and not refused at import (``HYBRIDMEM_TRACER_PURE``), a few
    ns per call less than the Python method of :class:`_PyNullBase`, the fallback."""
    if cext.pure_forced():
        return _PyNullBase
    mod, _why = cext.load()
    return _PyNullBase if mod is None else mod.NullCore


_NullBase: Any = _null_base()


class NullTraceWriter(_NullBase):
    """The disabled path: every method is a no-op (``enabled`` is False)."""

    __slots__ = ()
    enabled = False

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> NullTraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NULL_WRITER = NullTraceWriter()


class TraceWriter:
    """Binary trace writer; see the module docstring. Thread safe.

    ``path`` is a file path, or an already open binary file object (tests inject failing ones).
    ``meta`` is the run metadata (``RUN_META_KEYS``; missing keys are written as null).
    """

    enabled = True
    implementation = "python"  # "c": the compiled on_event of tracer/accel.py

    def __new__(cls, *args: Any, **kwargs: Any) -> TraceWriter:
        """``TraceWriter(...)`` builds the compiled variant when it is built and not refused
        (``HYBRIDMEM_TRACER_PURE=1``); see ``tracer/accel.py``."""
        if cls is TraceWriter:
            from tracer.accel import writer_class

            chosen = writer_class()
            if chosen is not TraceWriter:
                return chosen.__new__(chosen)
        return super().__new__(cls)

    def __init__(self, path: str | os.PathLike[str] | IO[bytes], meta: dict[str, Any], *,
                 policy: str = "block", buffer_records: int = 65536, packet_records: int = 1024,
                 fsync: str = "close", flush_interval_s: float = 0.2,
                 handle_signals: bool = True) -> None:
        if policy not in POLICIES:
            raise TraceError(f"policy must be one of {POLICIES}, got {policy!r}")
        if fsync not in FSYNC_POLICIES:
            raise TraceError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if packet_records < 1 or buffer_records < 1:
            raise TraceError(f"packet_records ({packet_records}) and buffer_records "
                             f"({buffer_records}) must be >= 1")
        if not flush_interval_s > 0:
            raise TraceError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        if not isinstance(meta, dict):
            raise TraceError(f"meta must be a dict, got {type(meta).__name__}")
        self.policy = policy
        self.fsync = fsync
        self.flush_interval_s = flush_interval_s
        n_buffers = max(2, -(-buffer_records // packet_records))
        self._packet_bytes = packet_records * fmt.EVENT.size
        self.meta: dict[str, Any] = dict.fromkeys(RUN_META_KEYS)
        self.meta.update(meta)
        self.meta.update({
            "incarnation_id": uuid.uuid4().hex, "clock_source": CLOCK_SOURCE,
            "created_unix_ns": time.time_ns(), "pid": os.getpid(),
            "format_version": fmt.VERSION, "writer_policy": policy, "fsync": fsync,
            "packet_records": packet_records, "buffer_records": n_buffers * packet_records,
        })
        header = header_bytes(self.meta)

        self._owns_file = isinstance(path, (str, os.PathLike))
        if isinstance(path, (str, os.PathLike)):
            self.path: str | None = os.fspath(path)
            try:
                self._file: IO[bytes] = open(self.path, "wb", buffering=0)  # noqa: SIM115
            except OSError as exc:
                raise TraceError(f"cannot create trace {self.path!r}: {exc.strerror}") from None
        else:
            self.path = getattr(path, "name", None)
            self._file = path
        try:
            self._write_all(header)
        except OSError as exc:
            raise TraceError(f"cannot write trace header to {self.path!r}: {exc}") from None

        # --- state guarded by the token _tok (emitting threads, close, the periodic seal) ---
        self._tok: list[bool] = [True]
        self._cv = threading.Condition()  # waits and hand-offs between emitters and flusher
        self._end_lock = threading.Lock()  # one END, even if several threads call close()
        self._free = [bytearray(self._packet_bytes) for _ in range(n_buffers - 1)]
        self._buf = bytearray(self._packet_bytes)
        self._off = 0
        self._buf_first_seq = 0
        self._seq = 0
        self._dropped = 0
        self._dropped_after_close = 0
        self._ids: dict[str, int] = {"": 0}
        self._sealed: collections.deque[_Sealed] = collections.deque()
        self._closing = False
        self._closed = False
        # --- state owned by the flusher thread (read by close() after joining it) ---
        self._pkt_seq = 0
        self._write_errors = 0
        self._lost_records = 0
        self._packets = 0
        self._bytes_written = len(header)

        self._pid = os.getpid()
        self._pack = fmt.EVENT.pack_into
        self._pack_fast = fmt.EVENT_NO_CHAIN.pack_into
        self._tok_pop = self._tok.pop
        self._tok_push = self._tok.append
        self._flusher = threading.Thread(target=self._flush_loop, name="hybridmem-trace-flush",
                                         daemon=True)
        self._flusher.start()
        _register(self, handle_signals)

    @staticmethod
    def disabled() -> NullTraceWriter:
        return NULL_WRITER

    # ------------------------------------------------------------------ emitting
    def on_event(self, event: Event) -> None:
        """Observer entry point: one event record (the writer stamps seq and ts).

        Same fast path as :meth:`record`, inlined: attribute loads replace argument passing.
        """
        e = event
        kind = e.kind
        try:
            self._tok_pop()
        except IndexError:  # another thread holds the token
            self._take()
        try:
            if e.chain is _NO and e.recurrent_chain is _NO:
                ids = self._ids
                seq = self._seq
                try:
                    self._pack_fast(self._buf, self._off, _KINDS[kind], _STATE_KINDS[e.state_kind],
                                    _CAUSES[e.cause], _OUTCOMES[e.outcome], seq, _mono(), e.step,
                                    ids[e.request_id], ids[e.requester], e.preemption_count,
                                    e.hash, e.depth, e.page, e.line, e.need, e.free)
                    # no call between these two stores: a signal handler (SIGTERM -> close)
                    # cannot run between them (test_no_signal_can_land_between_...)
                    self._off += 100
                    self._seq = seq + 1
                    return
                except (struct.error, KeyError, TypeError):
                    pass  # full or closed buffer, a new string, END or a bad field: slow path
            self._record_slow(kind, e.step, e.request_id, e.preemption_count, e.hash, e.depth,
                              e.state_kind, e.page, e.line, e.cause, e.requester, e.need,
                              e.free, e.outcome, e.chain, e.recurrent_chain)
        finally:
            self._tok_push(True)

    def record(self, kind: int, step: int = -1, request_id: str = "", preemption_count: int = 0,
               hash: int = 0, depth: int = 0, state_kind: int = 0, page: int = -1,
               line: int = -1, cause: int = 0, requester: str = "", need: int = 0,
               free: int = 0, outcome: int = 0, chain: tuple[int, ...] = (),
               recurrent_chain: tuple[int, ...] = ()) -> None:
        """Fast path: the fields of :class:`Event` as arguments, no Event object needed.
        ``kind`` must not be END (END is written by :meth:`close`)."""
        try:
            self._tok_pop()
        except IndexError:
            self._take()
        try:
            if chain is _NO and recurrent_chain is _NO:
                ids = self._ids
                seq = self._seq
                try:
                    self._pack_fast(self._buf, self._off, _KINDS[kind], _STATE_KINDS[state_kind],
                                    _CAUSES[cause], _OUTCOMES[outcome], seq, _mono(), step,
                                    ids[request_id], ids[requester], preemption_count, hash,
                                    depth, page, line, need, free)
                    self._off += 100
                    self._seq = seq + 1
                    return
                except (struct.error, KeyError, TypeError):
                    pass
            self._record_slow(kind, step, request_id, preemption_count, hash, depth,
                              state_kind, page, line, cause, requester, need, free,
                              outcome, chain, recurrent_chain)
        finally:
            self._tok_push(True)

    def _take(self, timeout_s: float | None = None) -> bool:
        """Wait for the token (another thread holds it); False when ``timeout_s`` ran out."""
        pop = self._tok_pop
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        delay = 1e-5
        while True:
            try:
                pop()
                return True
            except IndexError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)

    def _record_slow(self, kind: int, step: int, request_id: str, preemption_count: int,
                     hash: int, depth: int, state_kind: int, page: int, line: int, cause: int,
                     requester: str, need: int, free: int, outcome: int,
                     chain: Iterable[int], recurrent_chain: Iterable[int]) -> None:
        """Called with the token held: new strings, chains, a full buffer, a closed writer,
        END (refused) or a field out of range (ValueError, nothing committed)."""
        if self._closing:
            self._dropped_after_close += 1
            return
        if kind == EventKind.END:
            raise ValueError("END is written by the tracer itself on close(), not emitted")
        try:  # as the fast path: anything equal to a member's value packs as that value
            kind, state_kind, cause, outcome = (_KINDS[kind], _STATE_KINDS[state_kind],
                                                _CAUSES[cause], _OUTCOMES[outcome])
        except (KeyError, TypeError):
            raise ValueError(f"event enum field out of range: kind={kind!r} "
                             f"state_kind={state_kind!r} cause={cause!r} "
                             f"outcome={outcome!r}") from None
        if type(chain) is not tuple:
            chain = tuple(chain)
        if type(recurrent_chain) is not tuple:
            recurrent_chain = tuple(recurrent_chain)
        ids = self._ids
        strings_size = 0
        rb = qb = None  # UTF-8 of strings not yet in the dictionary
        if request_id not in ids:
            if not isinstance(request_id, str):
                raise ValueError(f"request ids must be str, got {type(request_id).__name__} "
                                 f"{request_id!r}")
            rb = request_id.encode()
            strings_size += fmt.STRING.size + len(rb)
        if requester not in ids and requester != request_id:
            if not isinstance(requester, str):
                raise ValueError(f"request ids must be str, got {type(requester).__name__} "
                                 f"{requester!r}")
            qb = requester.encode()
            strings_size += fmt.STRING.size + len(qb)
        n_chain, n_rchain = len(chain), len(recurrent_chain)
        size = strings_size + fmt.EVENT.size + 8 * (n_chain + n_rchain)
        if self._off + size > len(self._buf) and not self._reserve(size):
            if self._closing:
                self._dropped_after_close += 1
            else:
                self._dropped += 1
            return
        # Pack the event and its hashes first (that validates every field); strings and the
        # offset are committed only after. Ids are looked up again: _reserve may have waited.
        buf, off = self._buf, self._off
        sid = len(ids)
        rid = ids.get(request_id)
        if rid is None:
            rid, sid = sid, sid + 1
        qid = ids.get(requester)
        if qid is None:
            qid = rid if requester == request_id else sid
        ev_off = off + strings_size
        end = ev_off + fmt.EVENT.size
        seq = self._seq
        try:
            self._pack(buf, ev_off, fmt.TAG_EVENT, kind, state_kind, cause, outcome, seq, _mono(),
                       step, rid, qid, preemption_count, hash, depth, page, line, need, free,
                       n_chain, n_rchain)
            if n_chain or n_rchain:
                _hashes_struct(n_chain + n_rchain).pack_into(buf, end, *chain, *recurrent_chain)
        except struct.error as exc:
            raise ValueError(_bad_fields(exc, kind, step, preemption_count, hash, depth, page,
                                         line, need, free, chain, recurrent_chain)) from None
        if rb is not None:
            off = _put_string(buf, off, rid, rb)
            ids[request_id] = rid
        if qb is not None:
            off = _put_string(buf, off, qid, qb)
            ids[requester] = qid
        self._off = end + 8 * (n_chain + n_rchain)
        self._seq = seq + 1

    def _reserve(self, size: int) -> bool:
        """Make ``size`` bytes available in the active buffer (token held). False: drop it.

        Pooled buffers hold ``packet_records`` fixed records; a record larger than that (a very
        long chain) gets a one-off buffer of its own, which is not returned to the pool.
        """
        while self._off + size > len(self._buf):
            if self._closing:
                return False
            if size > self._packet_bytes:
                if self._off > 0:
                    self._seal(bytearray(size))
                else:
                    if len(self._buf) == self._packet_bytes:
                        self._free.append(self._buf)
                    self._buf = bytearray(size)
            elif self._free:
                self._seal(self._free.pop())
            elif self.policy == "drop":
                return False
            else:
                # Give the token back while waiting (close() and other threads may go on), like
                # Condition.wait() gives back its lock; the loop re-checks the buffer after.
                self._tok_push(True)
                try:
                    with self._cv:
                        if not self._free and not self._closing:
                            self._cv.wait(0.05)
                finally:
                    self._take()
        return True

    def _seal(self, next_buf: bytearray) -> None:
        """Hand the active buffer to the flusher; ``next_buf`` becomes active (token held).

        The SIGTERM handler is deferred while the handover runs (:func:`_hold_sigterm`): it
        raises SystemExit in the main thread at the next call or backward jump, and one raised
        after the buffer is queued but before it stops being the active one made close() seal
        and write the same packet twice."""
        held = _hold_sigterm()
        try:
            buf = self._buf
            with self._cv:
                self._sealed.append(_Sealed(buf, self._off, self._buf_first_seq,
                                            self._seq - self._buf_first_seq, self._dropped,
                                            len(buf) == self._packet_bytes))
                self._cv.notify_all()
            self._buf = next_buf
            self._off = 0
            self._buf_first_seq = self._seq
        finally:
            if held:
                _release_sigterm()  # a deferred SIGTERM raises here, the handover complete

    # ------------------------------------------------------------------ flushing
    def _flush_loop(self) -> None:
        cv = self._cv
        wait_s = self.flush_interval_s
        while True:
            with cv:
                while not self._sealed and not self._closing:
                    if not cv.wait(wait_s):
                        # periodic flush, so a crash loses at most ~flush_interval_s of records;
                        # an emitter holding the token is retried 1 ms later
                        wait_s = self.flush_interval_s if self._periodic_seal() else 1e-3
                if not self._sealed:
                    return  # closing and drained
                items = list(self._sealed)
                self._sealed.clear()
            for at in range(0, len(items), WRITEV_PACKETS):
                self._write_batch(items[at:at + WRITEV_PACKETS])
            with cv:
                self._free.extend([item.buf for item in items if item.pooled])
                cv.notify_all()

    def _periodic_seal(self) -> bool:
        """Seal a partly filled buffer if a free one is there (flusher, _cv held). False: an
        emitter held the token, try again soon."""
        if self._off == 0 or not self._free:
            return True
        try:
            self._tok_pop()
        except IndexError:
            return False
        try:
            if self._off > 0 and self._free and not self._closing:
                self._seal(self._free.pop())
        finally:
            self._tok_push(True)
        return True

    def _write_batch(self, items: list[_Sealed]) -> None:
        """Write sealed buffers as packets, in order (flusher).

        Every thread switch costs the emitting thread a hand-over of the GIL, so a trace file
        this writer opened gets all the packets of the batch in one ``os.writev`` (one
        release of the GIL for the whole batch instead of two writes per packet). A short or
        failed writev goes on packet by packet from the first byte not written, exactly as
        :meth:`_write_packet` would have (a packet not yet started is built again, so its
        header carries the write errors counted before it)."""
        if len(items) == 1 or not self._owns_file or self.fsync == "packet" \
                or not hasattr(os, "writev"):
            for item in items:
                self._write_packet(item.buf, item.length, item.first_seq, item.n_records,
                                   item.discarded)
            return
        first = self._pkt_seq
        heads = [self._packet_head(item.buf, item.length, item.first_seq, item.n_records,
                                   item.discarded) for item in items]
        views = [memoryview(item.buf)[:item.length] for item in items]
        parts = [part for pair in zip(heads, views, strict=True) for part in pair]
        try:
            n = os.writev(self._file.fileno(), parts)
        except OSError:
            n = 0
        for i, item in enumerate(items):
            head, content = heads[i], views[i]
            size = fmt.PACKET.size + item.length
            if n >= size:
                n -= size
                self._packets += 1
                self._bytes_written += size
            elif n > 0:  # the packet the short write stopped in: its remaining bytes
                rest = bytes(head[n:]) + content if n < len(head) else content[n - len(head):]
                self._send(rest, None, item.n_records, size)
                n = 0
            else:  # not started: built again, after the write errors counted before it
                self._pkt_seq = first + i
                self._write_packet(item.buf, item.length, item.first_seq, item.n_records,
                                   item.discarded)
            content.release()
        self._pkt_seq = first + len(items)

    def _packet_head(self, buf: bytearray, length: int, first_seq: int, count: int,
                     discarded: int) -> bytes:
        """The next packet's header, its CRC over the header and ``buf[:length]`` included."""
        head = fmt.PACKET.pack(fmt.PACKET_MAGIC, self._pkt_seq, first_seq, length, count,
                               discarded, self._write_errors, 0)
        with memoryview(buf) as view:
            crc = fmt.crc32(memoryview(head)[:fmt.PACKET_CRC_OFFSET], view[:length])
        self._pkt_seq += 1
        return head[:fmt.PACKET_CRC_OFFSET] + fmt.HEADER_CRC.pack(crc)

    def _write_packet(self, buf: bytearray, length: int, first_seq: int, count: int,
                      discarded: int) -> None:
        head = self._packet_head(buf, length, first_seq, count, discarded)
        with memoryview(buf) as view:
            self._send(head, view[:length], count, fmt.PACKET.size + length)

    def _send(self, head: bytes | memoryview, content: memoryview | None, count: int,
              size: int) -> None:
        """Write ``head`` then ``content``; count the packet (``size`` bytes) or its loss."""
        try:
            self._write_all(head)
            if content is not None:
                self._write_all(content)
            if self.fsync == "packet":
                self._sync()
        except OSError:
            self._write_errors += 1
            self._lost_records += count
            return
        self._packets += 1
        self._bytes_written += size

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while len(view):
            n = self._file.write(view)
            if n is None:  # a file object that does not report counts wrote it all
                break
            if n <= 0:
                raise OSError("short write of 0 bytes")
            view = view[n:]

    def _sync(self) -> None:
        flush = getattr(self._file, "flush", None)
        if flush is not None:
            flush()
        try:
            fileno = self._file.fileno()
        except (AttributeError, OSError, ValueError):
            return  # an in-memory file object: nothing to sync
        os.fsync(fileno)

    # ------------------------------------------------------------------ closing
    def close(self, timeout_s: float | None = None) -> WriterStats:
        """Flush everything, write END, fsync (unless fsync="none"), close. Idempotent.

        ``timeout_s`` bounds the wait for the writer lock and for the flusher to drain (a
        stalled disk); past it, :class:`TraceError` says END was not written. In a forked child
        this does nothing: the parent owns the file.
        """
        if self._pid != os.getpid():
            return self.stats()
        if not self._take(timeout_s):
            raise TraceError(f"trace writer lock still held after {timeout_s} s: END not written")
        try:
            if not self._closing:
                self._closing = True
                # an empty active buffer: every later record fails pack_into, goes to the slow
                # path and is refused there
                if self._off > 0:
                    self._seal(bytearray())
                else:
                    self._buf = bytearray()
        finally:
            self._tok_push(True)
        with self._cv:
            self._cv.notify_all()
        self._flusher.join(timeout_s)
        if self._flusher.is_alive():
            raise TraceError(f"trace flusher did not drain within {timeout_s} s (stalled "
                             "disk?): END not written")
        with self._end_lock:
            if not self._closed:
                self._write_end()
        return self.stats()

    def _write_end(self) -> None:
        """END in a packet of its own, then fsync and close (flusher drained, _end_lock held)."""
        end_seq = self._seq
        end = bytearray(fmt.END.size)
        fmt.END.pack_into(end, 0, fmt.TAG_END, end_seq, _mono(), end_seq, self._dropped,
                          self._write_errors)
        self._write_packet(end, len(end), end_seq, 1, self._dropped)
        try:
            if self.fsync != "none":
                self._sync()
        except OSError:
            self._write_errors += 1
        finally:
            if self._owns_file:
                try:
                    self._file.close()
                except OSError:
                    self._write_errors += 1
            self._closed = True
            _LIVE.discard(self)

    def _orphan(self) -> None:
        """In a forked child: a fresh token and condition (the parent's may have been held),
        refuse events."""
        self._tok = [True]
        self._tok_pop, self._tok_push = self._tok.pop, self._tok.append
        self._cv = threading.Condition()
        self._closing = True
        self._buf = bytearray()

    def stats(self) -> WriterStats:
        return WriterStats(self._seq, self._dropped, self._write_errors, self._lost_records,
                           self._packets, self._bytes_written, self._dropped_after_close,
                           self._closed)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_HASH_STRUCTS: dict[int, struct.Struct] = {}


def _hashes_struct(n: int) -> struct.Struct:
    """``<nQ`` (a chain's hashes), compiled once per length."""
    st = _HASH_STRUCTS.get(n)
    if st is None:
        if len(_HASH_STRUCTS) > 4096:
            _HASH_STRUCTS.clear()
        st = _HASH_STRUCTS[n] = struct.Struct(f"<{n}Q")
    return st


def _put_string(buf: bytearray, off: int, sid: int, data: bytes) -> int:
    """A dictionary record at ``off``; returns the offset after it."""
    fmt.STRING.pack_into(buf, off, fmt.TAG_STRING, sid, len(data))
    off += fmt.STRING.size
    buf[off:off + len(data)] = data
    return off + len(data)


def _bad_fields(exc: struct.error, kind: int, step: int, preemption_count: int, hash: int,
                depth: int, page: int, line: int, need: int, free: int,
                chain: tuple[int, ...] = (), recurrent_chain: tuple[int, ...] = ()) -> str:
    return (f"event field out of range for the trace layout ({exc}): kind={kind} step={step} "
            f"preemption_count={preemption_count} hash={hash} depth={depth} page={page} "
            f"line={line} need={need} free={free} chain={len(chain)} hashes "
            f"recurrent_chain={len(recurrent_chain)} hashes (hashes are uint64, ids int64)")


# ---------------------------------------------------------------------- process shutdown
_LIVE: weakref.WeakSet[TraceWriter] = weakref.WeakSet()
_HOOKS_INSTALLED = False
_SIGTERM_INSTALLED = False
_PREV_SIGTERM: Any = None


ATEXIT_TIMEOUT_S = 30.0


def _close_all() -> None:
    for w in list(_LIVE):
        try:
            w.close(timeout_s=ATEXIT_TIMEOUT_S)
        except TraceError as exc:  # not silent: the verdict will also say END is missing
            print(f"hybridmem tracer: {w.path}: {exc}", file=sys.stderr)


def _after_fork_in_child() -> None:
    for w in list(_LIVE):
        w._orphan()
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# Python runs signal handlers in the main thread only, but the process-directed SIGTERM may be
# received by any thread (the flusher, an engine's threads): masking it in the main thread does
# not keep the handler out of a handover. So the handler itself defers: while the main thread is
# inside a handover it records the signal, and the handover raises it when it is complete.
_HOLDING = 0  # main thread: handovers in progress
_DEFERRED: list[tuple[int, Any]] = []  # a SIGTERM that arrived during one


def _hold_sigterm() -> bool:
    """Defer this writer's SIGTERM handler while the main thread hands a buffer over; False
    (nothing deferred) in other threads, whose handovers the handler never interrupts."""
    global _HOLDING
    if not _SIGTERM_INSTALLED or threading.get_ident() != threading.main_thread().ident:
        return False
    _HOLDING += 1
    return True


def _release_sigterm() -> None:
    """End a handover; run a SIGTERM deferred during it (which may raise SystemExit)."""
    global _HOLDING
    _HOLDING -= 1
    if _HOLDING == 0 and _DEFERRED:
        signum, frame = _DEFERRED[0]
        _DEFERRED.clear()
        _on_sigterm(signum, frame)


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM: let the previous Python handler decide, else exit through SystemExit so the
    stack unwinds (releasing any writer lock this thread held) and ``atexit`` writes END.
    Inside a main-thread handover it only records the signal (see above)."""
    if _HOLDING:
        _DEFERRED.append((signum, frame))
        return
    prev = _PREV_SIGTERM
    if callable(prev):
        prev(signum, frame)
        return
    raise SystemExit(128 + signum)


def _register(writer: TraceWriter, handle_signals: bool) -> None:
    global _HOOKS_INSTALLED, _SIGTERM_INSTALLED, _PREV_SIGTERM
    _LIVE.add(writer)
    if not _HOOKS_INSTALLED:
        _HOOKS_INSTALLED = True
        atexit.register(_close_all)
    if (handle_signals and not _SIGTERM_INSTALLED
            and threading.current_thread() is threading.main_thread()):
        _SIGTERM_INSTALLED = True
        prev = signal.getsignal(signal.SIGTERM)
        if prev is not signal.SIG_IGN:
            _PREV_SIGTERM = prev
            signal.signal(signal.SIGTERM, _on_sigterm)

"""Streaming trace reader (``tracer/FORMAT.md``).

The reader never trusts a byte it has not checked: a packet is used only if its magic, length and
CRC32 are right and every record inside parses. Damage is skipped by scanning forward for the next
packet magic whose packet checks out (like a CTF reader resynchronising on packet headers); what
was skipped is counted, never silently ignored::

    [hdr][pkt 0][pkt 1][##damaged##][pkt 3][pkt 4][torn pkt 5..EOF
                        ^ checksum_errors += 1     ^ END missing, torn tail reported
                        pkt 3 starts at seq > expected -> gaps += 1

Records already yielded are never retracted, so ``events()`` is exact for every intact packet and
the verdict (``verdict()``, after the iterator is exhausted) says whether the whole run is there.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from typing import IO, Any, Protocol, TypeVar

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind
from tracer import crcrange
from tracer import format as fmt
from tracer.errors import TraceError
from tracer.judge import ScanCounters, Verdict, judge

CHUNK = 1 << 20
DIRECT_CRC_MAX = 4096  # content up to this is CRC'd directly (cheaper than a shift), longer
#                        directly while the credit below lasts, else by prefix checkpoints
#                        (tracer/crcrange.py)
# Credit for longer direct CRCs: the bytes CRC'd directly past DIRECT_CRC_MAX stay within
# 2 x (file offset reached) + DIRECT_CRC_SLACK. An intact file (each packet CRC'd once, at an
# offset past the packets before it) never runs out and never builds checkpoints (a Python step
# per 512 B); a hostile one (headers that each claim the rest of the file) spends the credit in
# O(file) bytes and continues through the checkpoints: linear either way.
DIRECT_CRC_SLACK = 1 << 20
CK_BLOCK = 512  # prefix-CRC checkpoint spacing: a range CRC reads <= 2 x 512 B + 44 B

TraceEvent = tuple[int, int, Event]  # (seq, ts_ns, event)
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Malformed(Exception):
    """A packet whose CRC passed but whose records do not parse (a writer bug or forgery)."""


class _Window:
    """A sliding read window over a file: ``buf[pos:]`` holds unread bytes."""

    def __init__(self, f: IO[bytes], start: int) -> None:
        self.f = f
        self.buf = bytearray()
        self.pos = 0
        self.base = start  # file offset of buf[0]
        self.eof = False
        self.ck: list[int] | None = None  # ck[k] = crc32(file[ck_origin:ck_origin + k*BLOCK])
        self.ck_origin = start
        self.direct = 0  # bytes CRC'd directly on credit (packets longer than DIRECT_CRC_MAX)

    def ensure(self, n: int) -> bool:
        """True when at least ``n`` unread bytes are in the window."""
        while len(self.buf) - self.pos < n and not self.eof:
            if self.pos > CHUNK:
                cut = self.pos
                if self.ck is not None:  # keep the checkpoint grid: cut on a block boundary
                    self._extend_ck(self.base + len(self.buf))
                    cut = (self.base + self.pos - self.ck_origin) // CK_BLOCK * CK_BLOCK \
                        + self.ck_origin - self.base
                del self.buf[:cut]
                self.base += cut
                self.pos -= cut
            data = self.f.read(max(CHUNK, n))
            if not data:
                self.eof = True
            else:
                self.buf += data
        return len(self.buf) - self.pos >= n

    def available(self) -> int:
        return len(self.buf) - self.pos

    def offset(self) -> int:
        return self.base + self.pos

    def _extend_ck(self, upto: int) -> None:
        """Checkpoints for every whole block below absolute offset ``upto``."""
        ck = self.ck
        assert ck is not None
        while self.ck_origin + len(ck) * CK_BLOCK <= upto:
            lo = self.ck_origin + (len(ck) - 1) * CK_BLOCK - self.base
            ck.append(zlib.crc32(memoryview(self.buf)[lo:lo + CK_BLOCK], ck[-1]))

    def prefix_crc(self, x: int) -> int:
        """crc32(file[ck_origin:x]) for an absolute offset x inside the window."""
        if self.ck is None:
            self.ck, self.ck_origin = [0], self.base
        self._extend_ck(x)
        k = (x - self.ck_origin) // CK_BLOCK
        lo = self.ck_origin + k * CK_BLOCK - self.base
        return zlib.crc32(memoryview(self.buf)[lo:x - self.base], self.ck[k])

    def packet_crc(self, start: int, length: int) -> int:
        """CRC of the packet at ``buf[start:]`` as FORMAT.md defines it (header up to the CRC
        field, then ``length`` content bytes): directly when short or on credit (see
        DIRECT_CRC_SLACK), else in O(DIRECT_CRC_MAX) work from the prefix checkpoints."""
        view = memoryview(self.buf)
        head = zlib.crc32(view[start:start + fmt.PACKET_CRC_OFFSET])
        lo = start + fmt.PACKET.size
        if length <= DIRECT_CRC_MAX:
            return zlib.crc32(view[lo:lo + length], head) & 0xFFFFFFFF
        if self.direct + length <= 2 * (self.base + start) + DIRECT_CRC_SLACK:
            self.direct += length
            return zlib.crc32(view[lo:lo + length], head) & 0xFFFFFFFF
        s = self.base + lo
        return crcrange.shift(head ^ self.prefix_crc(s), length) ^ self.prefix_crc(s + length)

    def find_magic(self) -> bool:
        """Advance to the next packet magic after ``pos``; False (window emptied) at EOF."""
        start = self.pos + 1
        while True:
            i = self.buf.find(fmt.PACKET_MAGIC, start)
            if i >= 0:
                self.pos = i
                return True
            if self.eof:
                self.pos = len(self.buf)
                return False
            self.pos = max(self.pos, len(self.buf) - len(fmt.PACKET_MAGIC) + 1)
            self.ensure(self.available() + CHUNK)  # may compact: indices move with pos
            start = self.pos


def read_header(f: IO[bytes], name: str) -> tuple[dict[str, Any], int]:
    """Parse the file header; returns (metadata, header length). Raises :class:`TraceError`."""
    fixed = f.read(fmt.HEADER.size)
    if len(fixed) < fmt.HEADER.size:
        raise TraceError(f"{name}: truncated header ({len(fixed)} of {fmt.HEADER.size} B)")
    magic, version, _flags, meta_len = fmt.HEADER.unpack(fixed)
    if magic != fmt.MAGIC:
        raise TraceError(f"{name}: not a hybridmem trace (magic {magic!r}, expected "
                         f"{fmt.MAGIC!r})")
    if version != fmt.VERSION:
        raise TraceError(f"{name}: trace format version {version}, this reader reads "
                         f"{fmt.VERSION}")
    if meta_len > fmt.MAX_META_BYTES:
        raise TraceError(f"{name}: damaged header (metadata length {meta_len:,} B over "
                         f"{fmt.MAX_META_BYTES:,} B)")
    rest = f.read(meta_len + fmt.HEADER_CRC.size)
    if len(rest) < meta_len + fmt.HEADER_CRC.size:
        raise TraceError(f"{name}: truncated header ({fmt.HEADER.size + len(rest)} of "
                         f"{fmt.HEADER.size + meta_len + fmt.HEADER_CRC.size} B)")
    meta_bytes = rest[:meta_len]
    (crc,) = fmt.HEADER_CRC.unpack(rest[meta_len:])
    if crc != fmt.crc32(fixed, meta_bytes):
        raise TraceError(f"{name}: damaged header (checksum mismatch)")
    try:
        meta = json.loads(meta_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{name}: damaged header (metadata is not JSON: {exc})") from None
    except RecursionError:
        raise TraceError(f"{name}: damaged header (metadata JSON nested too deeply)") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{name}: damaged header (metadata is {type(meta).__name__}, not an "
                         "object)")
    return meta, fmt.HEADER.size + meta_len + fmt.HEADER_CRC.size


class TraceReader:
    """One pass over a trace. ``meta`` is available at once; ``events()`` streams; after it is
    exhausted ``verdict()`` judges the run and ``counters`` holds the raw tallies."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                self.meta, self.header_len = read_header(f, self.path)
        except OSError as exc:
            raise TraceError(f"cannot read trace {self.path!r}: {exc.strerror}") from None
        self.counters = ScanCounters()
        self.end_ts_ns: int | None = None
        self._done = False

    def verdict(self) -> Verdict | None:
        """The verdict once ``events()`` has been read to the end, else None."""
        return judge(self.counters) if self._done else None

    def events(self) -> Iterator[TraceEvent]:
        """(seq, ts_ns, Event) for every record in an intact packet, END last when present."""
        return self.scan(RowParser())

    def scan(self, parser: PacketParser[T]) -> Iterator[T]:
        """The packet walk with ``parser`` deciding what a packet's records become: the one
        place where integrity is judged, whatever the output (``events()``: Event rows;
        ``tracer.columnar``: Arrow record batches)."""
        try:
            f = open(self.path, "rb")
        except OSError as exc:
            raise TraceError(f"cannot read trace {self.path!r}: {exc.strerror}") from None
        with f:
            f.seek(self.header_len)
            try:
                yield from self._scan(_Window(f, self.header_len), parser)
            except OSError as exc:
                raise TraceError(f"cannot read trace {self.path!r}: {exc.strerror}") from None
            yield from parser.finish()
        self._done = True

    def _scan(self, w: _Window, parser: PacketParser[T]) -> Iterator[T]:
        c = self.counters
        strings: dict[int, str] = {0: ""}
        next_pkt, next_seq = 0, 0
        damaged = False  # inside a damaged region (count it once)
        while True:
            if not w.ensure(fmt.PACKET.size):
                if w.available():
                    self._damage_at_eof(w, damaged)
                return
            head = fmt.PACKET.unpack_from(w.buf, w.pos)
            magic, pkt_seq, first_seq, length, count, discarded, write_errors, crc = head
            if magic != fmt.PACKET_MAGIC or length > fmt.MAX_PACKET_CONTENT:
                damaged = self._resync(w, damaged)
                continue
            if not w.ensure(fmt.PACKET.size + length):
                if damaged or self._packet_follows(w):
                    damaged = self._resync(w, damaged)  # a damaged length, not a torn tail
                    continue
                self._damage_at_eof(w, damaged)
                return
            start = w.pos
            if crc != w.packet_crc(start, length):  # O(1) amortised: no copy before the CRC
                damaged = self._resync(w, damaged)
                continue
            content = bytes(w.buf[start + fmt.PACKET.size:start + fmt.PACKET.size + length])
            try:
                records, end = parser.parse(content, first_seq, count, strings)
            except _Malformed:
                c.malformed_packets += 1
                w.pos = start + fmt.PACKET.size + length
                damaged = False
                continue
            w.pos = start + fmt.PACKET.size + length
            damaged = False
            if pkt_seq < next_pkt or first_seq < next_seq:
                c.gaps += 1
                c.duplicate_packets += 1
                continue  # an old or repeated packet: its records were yielded already
            if pkt_seq > next_pkt or first_seq > next_seq:
                c.gaps += 1
                c.missing_records += first_seq - next_seq
            next_pkt, next_seq = pkt_seq + 1, first_seq + count
            c.packet_dropped = max(c.packet_dropped, discarded)
            c.packet_write_errors = max(c.packet_write_errors, write_errors)
            yield from parser.accept(records, c)
            if end is not None:
                end_seq, end_ts, end_records, end_dropped, end_errors = end
                c.end_present = True
                c.end_records, c.end_dropped, c.end_write_errors = (end_records, end_dropped,
                                                                    end_errors)
                self.end_ts_ns = end_ts
                yield from parser.end(end_seq, end_ts)
                w.ensure(1)
                while w.available():
                    c.bytes_after_end += w.available()
                    w.pos = len(w.buf)
                    w.ensure(1)
                return

    def _resync(self, w: _Window, damaged: bool) -> bool:
        if not damaged:
            self.counters.checksum_errors += 1
        w.find_magic()
        return True

    def _packet_follows(self, w: _Window) -> bool:
        """Is there another packet magic after this (too long) packet header? Then its length
        field is damaged, the file goes on, and this is not a torn tail."""
        return w.buf.find(fmt.PACKET_MAGIC, w.pos + 1) >= 0

    def _damage_at_eof(self, w: _Window, damaged: bool) -> None:
        if damaged:
            return  # already counted as one damaged region reaching to EOF
        self.counters.torn_tail_bytes = w.available()
        w.pos = len(w.buf)


# A request id whose dictionary record was in a lost packet reads as this prefix plus its string
# id, so two lost ids never merge into one request.
LOST_STRING_PREFIX = "\x00<lost string #"


class PacketParser(Protocol[T_co]):
    """What :meth:`TraceReader.scan` asks of a record parser. ``parse`` checks one intact
    packet's records (raising ``_Malformed`` refuses the whole packet; ``strings`` is updated
    only when it parses) and returns ``(records, end)``; ``accept`` is called for each packet
    that is in sequence (not a duplicate), tallies ``counters`` (``max_seq``,
    ``unresolved_strings``, ``recovered_records``) and yields its output; ``end`` yields the
    END's output; ``finish`` yields what is still held when the file ends."""

    def parse(self, content: bytes, first_seq: int, count: int, strings: dict[int, str]
              ) -> tuple[Any, tuple[int, int, int, int, int] | None]: ...

    def accept(self, records: Any, counters: ScanCounters) -> Iterator[T_co]: ...

    def end(self, seq: int, ts_ns: int) -> Iterator[T_co]: ...

    def finish(self) -> Iterator[T_co]: ...


class RowParser:
    """Records as ``(seq, ts_ns, Event)`` rows (the reference parser)."""

    def parse(self, content: bytes, first_seq: int, count: int, strings: dict[int, str]
              ) -> tuple[list[TraceEvent], tuple[int, int, int, int, int] | None]:
        return _parse_records(content, first_seq, count, strings)

    def accept(self, records: list[TraceEvent], c: ScanCounters) -> Iterator[TraceEvent]:
        for rec in records:
            seq, ts, event = rec
            c.max_seq = max(c.max_seq, seq)
            if (event.request_id.startswith(LOST_STRING_PREFIX)
                    or event.requester.startswith(LOST_STRING_PREFIX)):
                c.unresolved_strings += 1
            c.recovered_records += 1
            yield rec

    def end(self, seq: int, ts_ns: int) -> Iterator[TraceEvent]:
        yield seq, ts_ns, Event(EventKind.END)

    def finish(self) -> Iterator[TraceEvent]:
        return iter(())


def _parse_records(content: bytes, first_seq: int, count: int, strings: dict[int, str]
                   ) -> tuple[list[TraceEvent], tuple[int, int, int, int, int] | None]:
    """Every record of one packet, checked; string records update ``strings`` only when the
    whole packet parses."""
    out: list[TraceEvent] = []
    new_strings: dict[int, str] = {}
    end = None
    off, n, expect = 0, len(content), first_seq
    ev_size, str_size, end_size = fmt.EVENT.size, fmt.STRING.size, fmt.END.size
    while off < n:
        if end is not None:
            raise _Malformed("records after END")
        tag = content[off]
        if tag == fmt.TAG_EVENT:
            if off + ev_size > n:
                raise _Malformed("event record overruns packet")
            (_, kind, sk, cause, outcome, seq, ts, step, rid, qid, pc, h, depth, page, line,
             need, free, n_chain, n_rchain) = fmt.EVENT.unpack_from(content, off)
            off += ev_size
            n_hashes = n_chain + n_rchain
            if seq != expect or off + 8 * n_hashes > n:
                raise _Malformed("event seq or chain length wrong")
            hashes = struct.unpack_from(f"<{n_hashes}Q", content, off)
            off += 8 * n_hashes
            try:
                kind_e = EventKind(kind)
                if kind_e is EventKind.END:
                    raise _Malformed("END kind in an event record")
                event = Event(kind_e, step, _string(rid, strings, new_strings), pc, h, depth,
                              StateKind(sk), page, line, Cause(cause),
                              _string(qid, strings, new_strings), need, free, Outcome(outcome),
                              tuple(hashes[:n_chain]), tuple(hashes[n_chain:]))
            except ValueError as exc:
                raise _Malformed(str(exc)) from None
            out.append((seq, ts, event))
            expect += 1
        elif tag == fmt.TAG_STRING:
            if off + str_size > n:
                raise _Malformed("string record overruns packet")
            _, sid, length = fmt.STRING.unpack_from(content, off)
            off += str_size
            if off + length > n or sid == 0:
                raise _Malformed("bad string record")
            define_string(content, off, length, sid, strings, new_strings)
            off += length
        elif tag == fmt.TAG_END:
            if off + end_size > n:
                raise _Malformed("END record overruns packet")
            _, seq, ts, records, dropped, errors = fmt.END.unpack_from(content, off)
            off += end_size
            if seq != expect:
                raise _Malformed("END seq wrong")
            end = (seq, ts, records, dropped, errors)
            expect += 1
        else:
            raise _Malformed(f"unknown record tag {tag}")
    if expect - first_seq != count:
        raise _Malformed("record count disagrees with packet header")
    strings.update(new_strings)
    return out, end


def define_string(content: bytes, at: int, length: int, sid: int, strings: dict[int, str],
                  new_strings: dict[int, str]) -> None:
    """Record string ``sid`` (the UTF-8 text at ``content[at:at + length]``) in ``new_strings``;
    a text that does not decode, or another text for an id already defined, refuses the
    packet."""
    try:
        text = content[at:at + length].decode()
    except UnicodeDecodeError as exc:
        raise _Malformed(str(exc)) from None
    if strings.get(sid, text) != text or new_strings.get(sid, text) != text:
        raise _Malformed(f"string id {sid} redefined")
    new_strings[sid] = text


def _string(sid: int, strings: dict[int, str], new_strings: dict[int, str]) -> str:
    text = new_strings.get(sid)
    if text is None:
        text = strings.get(sid)
        if text is None:
            return f"{LOST_STRING_PREFIX}{sid}>"
    return text


def read_events(path: str | os.PathLike[str]) -> Iterator[TraceEvent]:
    """Stream (seq, ts_ns, Event) from every intact packet (END included when present)."""
    yield from TraceReader(path).events()

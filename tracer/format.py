"""Byte layouts of the binary trace (``tracer/FORMAT.md`` is the prose version; keep in step).

A trace file is one header followed by packets; the last packet holds the END record::

    +--------------------------------------------------------------+
    | file header  HEADER (16 B) | meta JSON (meta_len B) | crc32 |
    +--------------------------------------------------------------+
    | packet 0  PACKET (48 B) | content: records ...               |
    | packet 1  PACKET (48 B) | content: records ...               |
    | ...                                                          |
    | packet k  PACKET (48 B) | content: ... END record            |
    +--------------------------------------------------------------+

Every integer is little-endian. The packet CRC32 (``zlib.crc32``) covers the packet header up to
the CRC field plus the content, so a damaged record can never be read as a good one.

Records inside a packet start with a one-byte tag:

* ``TAG_EVENT``  (0) fixed ``EVENT`` layout, then ``n_chain + n_recurrent`` uint64 hashes;
* ``TAG_STRING`` dictionary record: ``(id, length)`` then UTF-8 bytes; string id 0 is ``""``;
* ``TAG_END``    the END record (final sequence number, records written, dropped, write errors).

Sequence numbers count event records (END included) from 0 without holes: a dropped record never
gets one (it is counted in ``dropped`` instead), so any hole in a file is data lost after the
writer accepted it.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"HMTRACE\x00"
VERSION = 1

# magic, version, flags, meta_len; then meta JSON, then crc32(header fixed part + meta).
HEADER = struct.Struct("<8sHHI")
HEADER_CRC = struct.Struct("<I")
MAX_META_BYTES = 1 << 20

PACKET_MAGIC = b"HMPK"
# magic, packet seq, first record seq, content length, event record count,
# discarded-record counter snapshot, write-error counter snapshot, crc32.
PACKET = struct.Struct("<4sQQIIQQI")
PACKET_CRC_OFFSET = PACKET.size - 4
MAX_PACKET_CONTENT = 64 << 20  # the reader refuses larger content lengths as a damaged header

TAG_EVENT = 0
TAG_STRING = 2
TAG_END = 3

# tag, kind, state_kind, cause, outcome, (3 pad), seq, ts_ns, step, request_id (string id),
# requester (string id), preemption_count, hash, depth, page, line, need, free,
# n_chain, n_recurrent_chain.
EVENT = struct.Struct("<BBBBB3xQqqIIiQqqqqqII")
# The same layout for the writer's fast path: tag (0) and empty chain counts are pad bytes, which
# struct writes as zeros, so the hot call passes 18 values instead of 21.
EVENT_NO_CHAIN = struct.Struct("<xBBBB3xQqqIIiQqqqqq8x")
# tag, (7 pad), seq, ts_ns, records written (event records before END), dropped, write errors.
END = struct.Struct("<B7xQqQQQ")
# tag, (3 pad), string id, byte length.
STRING = struct.Struct("<B3xII")
HASH = struct.Struct("<Q")

assert EVENT.size == EVENT_NO_CHAIN.size == 100, "EVENT layout changed: FORMAT.md is out of date"
assert TAG_EVENT == 0, "EVENT_NO_CHAIN writes the tag as a zero pad byte"
assert END.size == 48, "END layout changed: this indicates FORMAT.md is out of date"
assert PACKET.size == 48, "PACKET layout changed: this indicates FORMAT.md is out of date"


def crc32(*parts: bytes | bytearray | memoryview) -> int:
    """CRC32 (zlib) over the concatenation of ``parts``."""
    value = 0
    for part in parts:
        value = zlib.crc32(part, value)
    return value & 0xFFFFFFFF

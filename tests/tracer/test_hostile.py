"""Bounded cost on hostile traces: resynchronisation is linear in the file
size, and the range-CRC path accepts and rejects exactly what the direct CRC does.

Benchmark (time per MiB at two sizes): ``python benchmarks/bench_verify_hostile.py``."""

import random
import zlib

import pytest

from benchmarks.bench_verify_hostile import hostile
from tests.tracer.test_corruption import EVENTS, ORIGINAL, SPANS, check
from tracer import crcrange, read_events, reader, verify

pytestmark = pytest.mark.writer_paths("default")  # reader only (see test_corruption.py)


class _CountingZlib:
    def __init__(self):
        self.bytes = 0
        self.calls = 0

    def crc32(self, data, value=0):
        self.bytes += len(data)
        self.calls += 1
        return zlib.crc32(data, value)


def _verify_counted(path, monkeypatch):
    """(verdict, CRC counter) of verifying ``path``."""
    counter = _CountingZlib()
    monkeypatch.setattr(reader, "zlib", counter)
    return verify(str(path)), counter


def _work(tmp_path, monkeypatch, size: int) -> int:
    path = tmp_path / f"h{size}.hmt"
    path.write_bytes(hostile(size))
    v, counter = _verify_counted(path, monkeypatch)
    assert not v.accepted and v.checksum_errors == 1
    return counter.bytes


def test_resync_work_is_linear(tmp_path, monkeypatch):
    """CRC bytes per file byte stay flat as the file doubles (was: each of the n headers CRC'd
    the rest of the file, n^2/2 x 48 B)."""
    small, large = (_work(tmp_path, monkeypatch, s) for s in (64 << 10, 256 << 10))
    assert large / small < 4.5, (small, large)  # 4x the size: linear is ~4, quadratic ~16
    assert large < 100 * (256 << 10)  # at most ~4 KiB of CRC per 48-byte header
    # negative control: with the prefix path switched off the same file costs quadratic work
    monkeypatch.setattr(reader, "DIRECT_CRC_MAX", 1 << 40)
    quad_small, quad_large = (_work(tmp_path, monkeypatch, s) for s in (64 << 10, 256 << 10))
    assert quad_large / quad_small > 12


def test_range_crc_identity():
    rng = random.Random(3)
    data = rng.randbytes(200_000)
    for _ in range(200):
        s = rng.randrange(0, 100_000)
        e = rng.randrange(s, 200_000)
        got = zlib.crc32(data[:e]) ^ crcrange.shift(zlib.crc32(data[:s]), e - s)
        assert got == zlib.crc32(data[s:e])
    crcrange.check()
    assert crcrange.shift(0xDEADBEEF, 0) == 0xDEADBEEF
    assert crcrange.shift(1, 5) != 1  # negative control: a shift changes the register


@pytest.mark.parametrize("seed", range(6))
def test_prefix_path_reads_damaged_traces_exactly(monkeypatch, seed):
    """Every packet through the range-CRC path: the corruption checks of test_corruption hold
    (every returned record exact, nothing damaged accepted)."""
    monkeypatch.setattr(reader, "DIRECT_CRC_MAX", 0)
    monkeypatch.setattr(reader, "DIRECT_CRC_SLACK", -(1 << 62))  # no credit either
    rng = random.Random(seed)
    damaged = bytearray(ORIGINAL)
    for i in rng.sample(range(SPANS[0][0], len(ORIGINAL)), 3):
        damaged[i] ^= 1 << rng.randrange(8)
    check(bytes(damaged))


def test_prefix_path_over_window_compaction(tmp_path, monkeypatch):
    """A file larger than the read window (compaction moves the checkpoint grid) still reads
    every record through the range-CRC path."""
    monkeypatch.setattr(reader, "DIRECT_CRC_MAX", 0)
    monkeypatch.setattr(reader, "DIRECT_CRC_SLACK", -(1 << 62))  # no credit either
    monkeypatch.setattr(reader, "CHUNK", 4096)
    path = tmp_path / "t.hmt"
    path.write_bytes(ORIGINAL)
    got = [e for _, _, e in read_events(str(path))][:-1]
    assert got == EVENTS and verify(str(path)).accepted  # the undamaged file, accepted


def _alternating(size: int) -> bytes:
    """Valid one-record packets, each followed by a header with a bad CRC claiming the rest
    of the file: every claim is at the scan's expected position, not inside a damaged region."""
    from tests.tracer.test_columnar import event, header, packet
    from tracer import format as fmt

    out = bytearray(header())
    i = 0
    while len(out) < size:
        out += packet(2 * i, i, event(i), 1)
        out += fmt.PACKET.pack(fmt.PACKET_MAGIC, 2 * i + 1, i + 1, 0, 1, 0, 0, 0xDEADBEEF)
        i += 1
    data = bytearray(out)
    # each bad header claims the bytes after it (patched once the file's length is known)
    pos = len(header())
    while pos < len(data):
        length = fmt.PACKET.unpack_from(data, pos)[3]
        pos += fmt.PACKET.size + length  # the valid packet
        if pos >= len(data):
            break
        head = list(fmt.PACKET.unpack_from(data, pos))
        head[3] = min(len(data) - pos - fmt.PACKET.size, fmt.MAX_PACKET_CONTENT)
        fmt.PACKET.pack_into(data, pos, *head)
        pos += fmt.PACKET.size
    return bytes(data)


def _alternating_work(tmp_path, monkeypatch, size: int) -> int:
    path = tmp_path / f"a{size}.hmt"
    path.write_bytes(_alternating(size))
    v, counter = _verify_counted(path, monkeypatch)
    assert not v.accepted and v.recovered_records > 100
    return counter.bytes


def test_direct_crc_credit_keeps_alternating_claims_linear(tmp_path, monkeypatch):
    """Long packets are CRC'd directly only on credit (DIRECT_CRC_SLACK): claims that follow
    valid packets cannot make the scan quadratic. Negative control: unlimited credit can."""
    monkeypatch.setattr(reader, "DIRECT_CRC_SLACK", 0)  # the bound shows at small sizes
    small, large = (_alternating_work(tmp_path, monkeypatch, s) for s in (64 << 10, 256 << 10))
    assert large / small < 5 and large < 8 * (256 << 10), (small, large)  # 4.45 and 6.5 B/B
    monkeypatch.setattr(reader, "DIRECT_CRC_SLACK", 1 << 62)
    quad_small, quad_large = (_alternating_work(tmp_path, monkeypatch, s)
                              for s in (64 << 10, 256 << 10))
    assert quad_large / quad_small > 12, (quad_small, quad_large)


def test_intact_long_packets_are_crcd_once_without_checkpoints(tmp_path, monkeypatch):
    """An intact file: each long packet one direct CRC, no prefix checkpoints (a Python step per
    512 B). Negative control: without credit the checkpoints are built."""
    from tests.tracer.helpers import write_trace
    from tracer.synthetic import synthetic_events

    path = tmp_path / "t.hmt"
    write_trace(path, list(synthetic_events(20_000, seed=2)), packet_records=512)
    size = path.stat().st_size
    packets = 20_000 // 512 + 2
    v, counter = _verify_counted(path, monkeypatch)
    assert v.accepted and counter.calls <= 3 * packets and counter.bytes < 1.01 * size
    monkeypatch.setattr(reader, "DIRECT_CRC_SLACK", -(1 << 62))
    v, counter = _verify_counted(path, monkeypatch)
    assert v.accepted and counter.calls > size // reader.CK_BLOCK

"""Damaged traces: byte flips, truncation, zero-filled ranges, duplicated packets. The reader
never crashes, never calls a damaged trace accepted, and every record it does return is exactly
the record the writer wrote under that sequence number."""

import io
import os
import tempfile
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.tracer.helpers import META, every_kind
from tracer import TraceError, TraceWriter, read_events, verify
from tracer import format as fmt
from tracer.reader import LOST_STRING_PREFIX, read_header
from tracer.synthetic import synthetic_events


def _build() -> tuple[bytes, list, list[tuple[int, int]]]:
    fd, path = tempfile.mkstemp(suffix=".hmtrace")
    os.close(fd)
    events = every_kind() + list(synthetic_events(300, seed=1))
    with TraceWriter(path, dict(META), packet_records=16, handle_signals=False) as w:
        for e in events:
            w.on_event(e)
    data = open(path, "rb").read()
    os.unlink(path)
    # packet spans, walking the valid file
    _, pos = read_header(io.BytesIO(data), "original")
    header_len = pos
    spans = []
    while pos < len(data):
        length = fmt.PACKET.unpack_from(data, pos)[3]
        spans.append((pos, fmt.PACKET.size + length))
        pos += fmt.PACKET.size + length
    assert pos == len(data) and header_len == spans[0][0]
    return data, events, spans


# Reader tests: the reader has one (pure-Python) path and ORIGINAL is written once, here, by
# the writer TraceWriter(...) picks (compiled when built). The pure-Python writer writes the
# same bytes for the same events (test_accel.py: byte identity incl. every_kind and synthetic
# streams, with a negative control), so damaging its file would check nothing new: run once.
pytestmark = pytest.mark.writer_paths("default")

ORIGINAL, EVENTS, SPANS = _build()
HEADER_LEN = SPANS[0][0]
EXAMPLES = int(os.environ.get("HYBRIDMEM_CORRUPTION_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def check(data: bytes) -> None:
    """The property every damaged file must satisfy."""
    assert data != ORIGINAL, "test bug: this damage left the file unchanged"
    fd, path = tempfile.mkstemp(suffix=".hmtrace")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            verdict = verify(path)
        except TraceError:
            return  # unreadable (damaged header): a clear error is the right answer
        assert not verdict.accepted, f"damaged trace accepted: {verdict}"
        assert verdict.reason.startswith("not accepted: ")
        for seq, _, event in read_events(path):
            if seq < len(EVENTS):
                want = EVENTS[seq]
                # a request id whose dictionary record was lost reads as a marked placeholder
                for name in ("request_id", "requester"):
                    if getattr(event, name).startswith(LOST_STRING_PREFIX):
                        want = replace(want, **{name: getattr(event, name)})
                assert event == want, f"record {seq} read back wrong"
    finally:
        os.unlink(path)


def test_original_is_accepted():
    assert len(SPANS) > 10
    fd, path = tempfile.mkstemp()
    os.write(fd, ORIGINAL)
    os.close(fd)
    try:
        assert verify(path).accepted
    finally:
        os.unlink(path)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, len(ORIGINAL) - 1), st.integers(1, 255)),
                min_size=1, max_size=4))
def test_byte_flips(flips):
    data = bytearray(ORIGINAL)
    for pos, xor in flips:
        data[pos] ^= xor
    assume(bytes(data) != ORIGINAL)
    check(bytes(data))


@SETTINGS
@given(st.integers(0, len(SPANS) - 1), st.integers(0, fmt.PACKET.size - 1), st.integers(1, 255))
def test_packet_header_flips(which, offset, xor):
    data = bytearray(ORIGINAL)
    data[SPANS[which][0] + offset] ^= xor
    check(bytes(data))


@SETTINGS
@given(st.lists(st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(ORIGINAL) - 1), st.integers(1, 255)),
    st.tuples(st.just("zero"), st.integers(0, len(ORIGINAL) - 1), st.integers(1, 200)),
    st.tuples(st.just("dup"), st.integers(0, len(SPANS) - 1), st.integers(0, len(SPANS))),
), min_size=1, max_size=3), st.integers(1, 64))
def test_combined_damage(ops, cut):
    data = bytearray(ORIGINAL)
    for op, a, b in ops:
        if op == "flip":
            data[a % len(data)] ^= b
        elif op == "zero":
            lo = a % len(data)
            hi = min(len(data), lo + b)
            data[lo:hi] = bytes(hi - lo)
        else:
            start, size = SPANS[a]
            at = SPANS[b][0] if b < len(SPANS) else len(data)
            data[at:at] = ORIGINAL[start:start + size]
    if cut < 8:
        data = data[:len(data) - cut]
    assume(bytes(data) != ORIGINAL)
    check(bytes(data))


@SETTINGS
@given(st.integers(0, len(ORIGINAL) - 1))
def test_truncation(length):
    check(ORIGINAL[:length])


@SETTINGS
@given(st.integers(0, len(ORIGINAL) - 1), st.integers(1, 400))
def test_zero_filled_range(start, length):
    data = bytearray(ORIGINAL)
    end = min(len(data), start + length)
    data[start:end] = bytes(end - start)
    assume(bytes(data) != ORIGINAL)
    check(bytes(data))


@SETTINGS
@given(st.integers(0, len(SPANS) - 1), st.integers(0, len(SPANS)))
def test_duplicated_packet(which, where):
    start, size = SPANS[which]
    at = SPANS[where][0] if where < len(SPANS) else len(ORIGINAL)
    check(ORIGINAL[:at] + ORIGINAL[start:start + size] + ORIGINAL[at:])


@SETTINGS
@given(st.integers(0, len(SPANS) - 2))
def test_missing_packet(which):
    start, size = SPANS[which]
    check(ORIGINAL[:start] + ORIGINAL[start + size:])


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:5], "truncated header"),
    (lambda d: b"XX" + d[2:], "not a hybridmem trace"),
    (lambda d: d[:8] + b"\x09\x00" + d[10:], "version 9"),
    (lambda d: d[:HEADER_LEN - 1], "truncated header"),
    (lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "damaged header"),
    (lambda d: b"", "truncated header"),
], ids=["short", "magic", "version", "meta-cut", "meta-flip", "empty"])
def test_unreadable_headers_raise_trace_error(tmp_path, damage, message):
    path = tmp_path / "t.hmtrace"
    path.write_bytes(damage(ORIGINAL))
    with pytest.raises(TraceError, match=message):
        verify(path)


def test_missing_file_raises_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        verify(tmp_path / "nope")

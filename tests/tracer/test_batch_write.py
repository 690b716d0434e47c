"""The flusher's batched write (one ``os.writev`` per batch of sealed buffers, on a trace file
the writer opened): a short or failed writev goes on packet by packet and loses nothing."""

import errno
import os

import pytest

from hybridmem.events import Event, EventKind, StateKind
from tests.tracer.helpers import META
from tracer import TraceWriter, read_events, verify
from tracer import writer as writer_mod

N = 3000  # 8-record packets: ~375 of them, so the flusher finds several sealed at once


def pub(i: int) -> Event:
    return Event(EventKind.PUBLICATION, i, f"r{i % 5}", 0, i, 512, StateKind.ATTENTION, i % 97)


def write_with(path, monkeypatch, writev) -> list[int]:
    """Write N events with ``os.writev`` replaced by ``writev``; the batch sizes it saw."""
    seen: list[int] = []

    def spy(fd, parts):
        seen.append(len(parts) // 2)
        return writev(fd, parts)

    monkeypatch.setattr(os, "writev", spy)
    w = TraceWriter(path, META, packet_records=8, handle_signals=False)
    for i in range(N):
        w.on_event(pub(i))
    stats = w.close()
    monkeypatch.undo()
    assert stats.write_errors == 0 and stats.lost_records == 0
    return seen


def events(path) -> list[tuple[int, Event]]:
    return [(seq, e) for seq, _ts, e in read_events(path) if e.kind != EventKind.END]


def short_writev(fd, parts):
    """A disk that takes a third of what it is given (at least a byte)."""
    data = b"".join(bytes(p) for p in parts)
    return os.write(fd, data[:max(1, len(data) // 3)])


def failing_writev(fd, parts):
    raise OSError(errno.EAGAIN, "try again (simulated)")


@pytest.mark.parametrize("writev", [os.writev, short_writev, failing_writev],
                         ids=["whole", "short", "failing"])
def test_batched_writes_keep_every_record(tmp_path, monkeypatch, writev):
    path = tmp_path / "t.hmtrace"
    batches = write_with(path, monkeypatch, writev)
    assert batches and max(batches) > 1  # the batched path ran
    v = verify(path)
    assert v.accepted and v.records == N, v.reason
    assert events(path) == [(i, pub(i)) for i in range(N)]


def test_a_writev_that_loses_bytes_is_seen(tmp_path, monkeypatch):
    """Negative control: a writev that says it wrote everything but drops a batch's last byte
    leaves a trace that is refused (the check above can fail)."""
    def lossy(fd, parts):
        data = b"".join(bytes(p) for p in parts)
        os.write(fd, data[:-1])
        return len(data)

    path = tmp_path / "t.hmtrace"
    write_with(path, monkeypatch, lossy)
    assert not verify(path).accepted


def test_a_batch_is_written_in_slices_of_at_most_writev_packets(tmp_path, monkeypatch):
    """Linux's writev takes at most 1,024 buffers: a batch goes out WRITEV_PACKETS at a time."""
    monkeypatch.setattr(writer_mod, "WRITEV_PACKETS", 2)
    path = tmp_path / "t.hmtrace"
    seen = write_with(path, monkeypatch, os.writev)
    assert seen and max(seen) == 2
    assert verify(path).accepted and events(path) == [(i, pub(i)) for i in range(N)]

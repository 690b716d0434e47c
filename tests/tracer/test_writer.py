"""Writer under pressure: full buffers (drop or block), a full disk, several threads."""

import os
import threading
import time

import pytest

from hybridmem.events import Event, EventKind, StateKind
from tests.tracer.helpers import META, FailingFile, StallingFile
from tracer import TraceError, TraceWriter, read_events, verify


def pub(i: int, rid: str = "r") -> Event:
    return Event(EventKind.PUBLICATION, i, rid, 0, i, 512, StateKind.ATTENTION, i % 97)


def dump(f, tmp_path):
    path = tmp_path / "t.hmtrace"
    path.write_bytes(f.getvalue())
    return path


def test_drop_policy_counts_every_dropped_record(tmp_path):
    f = StallingFile()
    # 2 buffers of 4 records: the active one and one sealed (stuck in the flusher's write)
    w = TraceWriter(f, META, policy="drop", packet_records=4, buffer_records=8,
                    handle_signals=False)
    for i in range(100):
        w.on_event(pub(i))
    stuck = w.stats()
    assert stuck.dropped > 0 and stuck.records + stuck.dropped == 100
    f.release.set()
    stats = w.close()
    assert stats.dropped == stuck.dropped and stats.write_errors == 0
    path = dump(f, tmp_path)
    v = verify(path)
    # kept records have contiguous seqs (a dropped record never gets one); dropped != 0 refuses
    assert (v.accepted, v.dropped, v.gaps, v.records, v.recovered_records) == (
        False, stats.dropped, 0, stats.records, stats.records)
    assert v.reason == f"not accepted: {stats.dropped} records dropped"
    kept = [e.step for _, _, e in read_events(path)][:-1]
    assert kept == sorted(kept) and len(kept) == stats.records


def test_block_policy_waits_and_loses_nothing(tmp_path):
    f = StallingFile()
    w = TraceWriter(f, META, policy="block", packet_records=4, buffer_records=8,
                    handle_signals=False)
    producer = threading.Thread(target=lambda: [w.on_event(pub(i)) for i in range(100)])
    producer.start()
    time.sleep(0.3)
    assert producer.is_alive(), "producer must block while every buffer waits for the disk"
    assert w.stats().dropped == 0 and w.stats().records < 100
    f.release.set()
    producer.join(10)
    assert not producer.is_alive()
    assert w.close().records == 100
    v = verify(dump(f, tmp_path))
    assert v.accepted and v.records == 100


def test_full_disk_write_errors_are_counted_and_reported(tmp_path):
    f = FailingFile(budget=2000)  # header + a packet or two, then ENOSPC
    w = TraceWriter(f, META, packet_records=8, handle_signals=False)
    for i in range(200):
        w.on_event(pub(i))
        if i % 8 == 7:
            time.sleep(0.002)  # let the flusher hit the full disk for several packets
    time.sleep(0.1)
    f.budget = 10**9  # space comes back before shutdown: END records the damage
    stats = w.close()
    assert stats.write_errors > 0 and stats.lost_records > 0 and f.failures >= stats.write_errors
    v = verify(dump(f, tmp_path))
    assert not v.accepted and v.end_present
    assert v.write_errors == stats.write_errors
    assert v.gaps >= 1 and f"{stats.write_errors} write errors" in v.reason
    assert v.recovered_records <= 200 - stats.lost_records


def test_disk_full_until_the_end_means_no_end(tmp_path):
    f = FailingFile(budget=1500)
    w = TraceWriter(f, META, packet_records=8, handle_signals=False)
    for i in range(100):
        w.on_event(pub(i))
    stats = w.close()
    assert stats.write_errors >= 1
    v = verify(dump(f, tmp_path))
    assert not v.accepted and not v.end_present
    assert v.reason.startswith("not accepted: END missing")


def test_several_threads_get_unique_contiguous_seqs(tmp_path):
    path = tmp_path / "t.hmtrace"
    n_threads, per_thread = 4, 2500
    w = TraceWriter(path, META, packet_records=64, buffer_records=256, handle_signals=False)
    barrier = threading.Barrier(n_threads)

    def emit(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            if i % 500 == 0:  # mix in slow-path records (chains, new strings)
                w.on_event(Event(EventKind.WAITING_ENTRY, i, f"t{t}-{i}", chain=(t, i)))
            else:
                w.record(EventKind.PUBLICATION, i, f"t{t}", 0, t, i)

    threads = [threading.Thread(target=emit, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    w.close()
    got = list(read_events(path))
    assert [s for s, _, _ in got] == list(range(n_threads * per_thread + 1))
    for t in range(n_threads):
        steps = [e.step for _, _, e in got if e.request_id.startswith(f"t{t}")]
        assert steps == list(range(per_thread)), f"thread {t}: its events in its own order"
    assert verify(path).accepted


@pytest.mark.parametrize("fsync", ["none", "close", "packet"])
def test_fsync_policies_all_produce_accepted_traces(tmp_path, fsync):
    path = tmp_path / "t.hmtrace"
    with TraceWriter(path, META, fsync=fsync, packet_records=4, handle_signals=False) as w:
        for i in range(20):
            w.on_event(pub(i))
    assert verify(path).accepted


def test_close_on_a_stalled_disk_times_out_then_completes(tmp_path):
    f = StallingFile()
    w = TraceWriter(f, META, packet_records=4, handle_signals=False)
    for i in range(10):
        w.on_event(pub(i))
    with pytest.raises(TraceError, match="END not written"):
        w.close(timeout_s=0.2)
    assert not w.stats().closed
    f.release.set()
    assert w.close(timeout_s=10).closed  # the disk came back: END is written now
    assert verify(dump(f, tmp_path)).accepted


def test_forked_child_never_writes_into_the_parents_trace(tmp_path):
    path = tmp_path / "t.hmtrace"
    w = TraceWriter(path, META, handle_signals=False)
    w.on_event(pub(0))
    pid = os.fork()
    if pid == 0:  # child: its events are refused and its close() leaves the file alone
        try:
            w.on_event(pub(1))
            w.close()
        finally:
            os._exit(0 if w.stats().dropped_after_close == 1 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    w.on_event(pub(2))
    w.close()
    assert [e.step for _, _, e in read_events(path)][:-1] == [0, 2]
    assert verify(path).accepted

"""Child process for the seal/SIGTERM test: SIGTERM arrives inside the writer's buffer
handover (``TraceWriter._seal``, right after the sealed buffer is queued), the worst moment for
an exception raised by the handler. ``--unguarded`` removes the guard (negative control).

Run as ``python -m tests.tracer.child_seal_signal PATH [--unguarded]``."""

import os
import signal
import sys
import threading

import tracer.writer as tw
from tests.tracer.helpers import META
from tracer import TraceWriter
from tracer.synthetic import synthetic_events


def _kill_on_first_main_notify(cv: threading.Condition) -> None:
    """The first notify_all from the main thread (a seal there) sends this process SIGTERM."""
    notify_all = cv.notify_all
    fired = []

    def notify_and_kill() -> None:
        notify_all()
        if not fired and threading.current_thread() is threading.main_thread():
            fired.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    cv.notify_all = notify_and_kill  # type: ignore[method-assign]


def main() -> None:
    path = sys.argv[1]
    if "--unguarded" in sys.argv[2:]:
        tw._hold_sigterm = lambda: None  # the writer before the guard
    # no periodic seals from the flusher: the main thread fills and seals every buffer
    w = TraceWriter(path, dict(META), packet_records=16, buffer_records=64, fsync="none",
                    flush_interval_s=60.0)
    _kill_on_first_main_notify(w._cv)
    for e in synthetic_events(10_000, seed=9):
        w.on_event(e)
    sys.exit(3)  # not reached: SIGTERM ends the process during the first seal


if __name__ == "__main__":
    main()

"""Child process for the seal/SIGTERM test: SIGTERM arrives inside the writer's buffer
handover (``TraceWriter._seal``, right after the sealed buffer is queued), the worst moment for
an exception raised by the handler. ``--unguarded`` removes the guard (negative control).
``--to-flusher`` sends the signal to the flusher thread instead of the process: the kernel may
deliver a process-directed SIGTERM to any thread, and Python still runs the handler in the main
thread (a guard that only masks SIGTERM in the main thread misses this case).

Run as ``python -m tests.tracer.child_seal_signal PATH [--unguarded] [--to-flusher]``."""

import os
import signal
import sys
import threading
import time

import tracer.writer as tw
from tests.tracer.helpers import META
from tracer import TraceWriter
from tracer.synthetic import synthetic_events


def _kill_on_first_main_notify(cv: threading.Condition, target: int | None) -> None:
    """The first notify_all from the main thread (a seal there) sends SIGTERM to this process,
    or to thread ``target``."""
    notify_all = cv.notify_all
    fired = []

    def notify_and_kill() -> None:
        notify_all()
        if not fired and threading.current_thread() is threading.main_thread():
            fired.append(True)
            if target is None:
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                signal.pthread_kill(target, signal.SIGTERM)
                time.sleep(0.05)  # let that thread take it: the handler then runs on return

    cv.notify_all = notify_and_kill  # type: ignore[method-assign]


def main() -> None:
    path = sys.argv[1]
    if "--unguarded" in sys.argv[2:]:
        tw._hold_sigterm = lambda: None  # the writer before the guard
    # no periodic seals from the flusher: the main thread fills and seals every buffer
    w = TraceWriter(path, dict(META), packet_records=16, buffer_records=64, fsync="none",
                    flush_interval_s=60.0)
    target = w._flusher.ident if "--to-flusher" in sys.argv[2:] else None
    _kill_on_first_main_notify(w._cv, target)
    for e in synthetic_events(10_000, seed=9):
        w.on_event(e)
    sys.exit(3)  # not reached: SIGTERM ends the process during the first seal


if __name__ == "__main__":
    main()

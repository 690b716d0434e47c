"""Child process for the kill tests: writes synthetic_events(seed) forever (or --count),
printing "ready" once the first packets are on disk.

Run as ``python -m tests.tracer.child_writer PATH``."""

import argparse
import os
import sys
import time

from tests.tracer.helpers import META
from tracer import TraceWriter
from tracer.synthetic import synthetic_events


class ChoppyFile:
    """A slow disk: every write() stores at most 7 bytes, so a kill tears packets."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, data) -> int:
        return os.write(self.fd, bytes(data[:7]))

    def fileno(self) -> int:
        return self.fd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=10**9)
    p.add_argument("--no-close", action="store_true", help="exit without close(): atexit")
    p.add_argument("--choppy", action="store_true", help="write packets 7 bytes at a time")
    p.add_argument("--pace", type=float, default=0.0, help="sleep per 100 events")
    a = p.parse_args()
    target = ChoppyFile(a.path) if a.choppy else a.path
    w = TraceWriter(target, dict(META), packet_records=16, buffer_records=64, fsync="none",
                    flush_interval_s=0.005)
    ready = False
    for i, e in enumerate(synthetic_events(a.count, seed=a.seed)):
        w.on_event(e)
        if i % 100 == 99:
            if a.pace:
                time.sleep(a.pace)
            if not ready and os.path.getsize(a.path) > 4096:
                print("ready", flush=True)
                ready = True
    if not a.no_close:
        w.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

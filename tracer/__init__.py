"""Binary trace writer and reader: publication, loss, adoption and allocation events, with
packet sequence numbers, dropped-record counters and an END record that prove integrity.

Format and table columns: ``tracer/FORMAT.md``. Public API::

    TraceWriter(path, meta, policy="block"|"drop", buffer_records=..., fsync=...)
    TraceWriter.disabled() / NULL_WRITER      # the disabled path
    verify(path) -> Verdict                   # SPEC §6 acceptance
    read_events(path) -> iterator of (seq, ts_ns, Event)
    events_table(path) -> pyarrow.Table; write_parquet(path, out); write_perfetto(path, out)
"""

from tracer.errors import TraceError
from tracer.export import events_table, write_parquet, write_perfetto
from tracer.reader import TraceReader, read_events
from tracer.verdict import VERDICT_KEYS, Verdict, verify
from tracer.writer import NULL_WRITER, NullTraceWriter, TraceWriter, WriterStats

__all__ = [
    "TraceWriter", "NullTraceWriter", "NULL_WRITER", "WriterStats", "TraceError", "Verdict",
    "VERDICT_KEYS", "verify", "TraceReader", "read_events", "events_table", "write_parquet",
    "write_perfetto",
]

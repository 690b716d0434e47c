"""Write an event table (Parquet, ``tracer/schema.py`` columns) back out as a binary trace, so
the lineage benchmarks' synthetic runs can be read the way a serving run's trace is.

    PYTHONPATH=. python benchmarks/parquet_to_trace.py TABLE.parquet OUT.hmtrace

The table's run metadata (minus its verdict) becomes the trace header; every row but END goes
through ``TraceWriter.on_event`` (the writer stamps its own seq and ts_ns).
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow.parquet as pq

from hybridmem.events import Cause, Event, EventKind, Outcome, StateKind
from tracer.schema import META_KEY
from tracer.writer import TraceWriter

KIND = {m.name.lower(): m for m in EventKind}
STATE = {m.name.lower(): m for m in StateKind}
CAUSE = {m.name.lower(): m for m in Cause}
OUTCOME = {m.name.lower(): m for m in Outcome}


def convert(src: str, dst: str) -> int:
    f = pq.ParquetFile(src)
    meta = json.loads(f.schema_arrow.metadata[META_KEY])
    meta.pop("verdict", None)
    tmp = dst + ".tmp"
    n = 0
    with TraceWriter(tmp, meta=meta, handle_signals=False) as w:
        for batch in f.iter_batches(65_536):
            d = batch.to_pydict()
            for i in range(batch.num_rows):
                if d["kind"][i] == "end":
                    continue
                w.on_event(Event(
                    KIND[d["kind"][i]], d["step"][i], d["request_id"][i],
                    d["preemption_count"][i], d["hash"][i], d["depth"][i],
                    STATE[d["state_kind"][i]], d["page"][i], d["line"][i],
                    CAUSE[d["cause"][i]], d["requester"][i], d["need"][i],
                    d["free"][i], OUTCOME[d["outcome"][i]],
                    tuple(d["chain"][i] or ()), tuple(d["recurrent_chain"][i] or ())))
                n += 1
    os.replace(tmp, dst)
    return n


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[0].endswith(".parquet") or args[1] == args[0]:
        print("usage: parquet_to_trace.py TABLE.parquet OUT.hmtrace (OUT not the input)",
              file=sys.stderr)
        return 2
    print(f"wrote {convert(args[0], args[1]):,} events to {args[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

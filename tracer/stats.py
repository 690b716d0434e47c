"""Summary of a trace: counts by kind and by request, time span, and the verdict."""

from __future__ import annotations

import os
from typing import Any

from hybridmem.events import EventKind
from tracer.reader import TraceReader

BATCH_ROWS = 65_536


def trace_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Counts by kind and by request (events; episodes = highest preemption count + 1), the time
    span and the verdict, from the columnar decoder (``tracer.columnar``): per record batch, one
    count per kind and one grouping by request, merged in first-appearance order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tracer.columnar import record_batches
    from tracer.schema import arrow_schema

    reader = TraceReader(path)
    by_kind: dict[str, int] = {}
    by_request: dict[str, dict[str, int]] = {}
    first = last = None
    events = 0
    for batch in record_batches(reader, arrow_schema(), BATCH_ROWS):
        t = pa.Table.from_batches([batch])
        lo, hi = pc.min_max(t.column("ts_ns")).values()
        first = lo.as_py() if first is None else min(first, lo.as_py())
        last = hi.as_py() if last is None else max(last, hi.as_py())
        for kc in pc.value_counts(t.column("kind")).to_pylist():
            by_kind[kc["values"]] = by_kind.get(kc["values"], 0) + kc["counts"]
        t = t.filter(pc.not_equal(t.column("kind"), "end"))
        events += t.num_rows
        t = t.append_column("_row", pa.array(range(t.num_rows), pa.int64()))
        t = t.filter(pc.not_equal(t.column("request_id"), ""))
        groups = t.group_by("request_id").aggregate(
            [("_row", "count"), ("preemption_count", "max"), ("_row", "min")])
        groups = groups.sort_by("_row_min")  # first appearance, as the rows came
        for rid, n, pmax in zip(groups.column("request_id").to_pylist(),
                                groups.column("_row_count").to_pylist(),
                                groups.column("preemption_count_max").to_pylist(), strict=True):
            r = by_request.setdefault(rid, {"events": 0, "episodes": 0})
            r["events"] += n
            r["episodes"] = max(r["episodes"], pmax + 1)
    verdict = reader.verdict()
    assert verdict is not None, "stats before the reader finished: this indicates a stats bug"
    return {
        "path": os.fspath(path),
        "meta": reader.meta,
        "verdict": verdict.as_dict(),
        "events": events,
        "by_kind": {k.name.lower(): by_kind.get(k.name.lower(), 0) for k in EventKind},
        "requests": len(by_request),
        "episodes": sum(r["episodes"] for r in by_request.values()),
        "by_request": by_request,
        "first_ts_ns": first,
        "last_ts_ns": last,
        "span_s": None if first is None or last is None else (last - first) / 1e9,
    }


def format_stats(s: dict[str, Any], top: int = 10) -> str:
    v = s["verdict"]
    meta = s["meta"]
    lines = [
        f"trace {s['path']}: {v['reason']}",
        f"organization {meta.get('organization')}  engine {meta.get('engine')}  "
        f"seed {meta.get('seed')}  incarnation {meta.get('incarnation_id')}",
        f"{s['events']:,} events, {s['requests']:,} requests, {s['episodes']:,} episodes, "
        + ("no timestamps" if s["span_s"] is None else f"span {s['span_s']:.6f} s"),
        "by kind:",
    ]
    lines += [f"  {k:<14} {n:>12,}" for k, n in s["by_kind"].items() if n]
    busiest = sorted(s["by_request"].items(), key=lambda kv: (-kv[1]["events"], kv[0]))[:top]
    if busiest:
        lines.append(f"by request (top {len(busiest)} of {s['requests']:,} by events):")
        lines += [f"  {rid:<24} {r['events']:>8,} events  {r['episodes']} episodes"
                  for rid, r in busiest]
    return "\n".join(lines)

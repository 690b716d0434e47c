"""Summary of a trace: counts by kind and by request, time span, and the verdict."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from hybridmem.events import EventKind
from tracer.reader import TraceReader


def trace_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    reader = TraceReader(path)
    by_kind: Counter[str] = Counter()
    by_request: dict[str, dict[str, int]] = {}
    first = last = None
    events = 0
    for _, ts, e in reader.events():
        first = ts if first is None else min(first, ts)
        last = ts if last is None else max(last, ts)
        by_kind[e.kind.name.lower()] += 1
        if e.kind is EventKind.END:
            continue
        events += 1
        if e.request_id:
            r = by_request.setdefault(e.request_id, {"events": 0, "episodes": 0})
            r["events"] += 1
            r["episodes"] = max(r["episodes"], e.preemption_count + 1)
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

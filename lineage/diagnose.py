"""Why prefix reuse was lost: per INITIAL request, the shared prefix, the reused tokens and the
difference by cause (the ``reuse_diagnosis`` / ``reuse_causes`` views), with the run's own
prefix-cache counters beside them when the run directory has them.

The shared prefix is measured on prompt token ids when the run directory holds the workload
(``workload.json``, a ``hybridmem run`` output), else on the trace's attention hash chains (to
the attention block: a prefix shorter than one block then shows as 0). Everything else comes
from the trace and the views' SQL (lineage/sql/reuse_diagnosis.sql, the one definition).

    diag = diagnose(open_run("run/trace/trace.hmt"))
    print(format_text(diag))
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from hybridmem.errors import HybridMemError
from hybridmem.inputs import read_input_text
from lineage.source import Run
from lineage.views import NO_TOKEN_PREFIX, TokenPrefix, connect

CAUSES = ("grid", "never-published", "not-yet-published", "lost", "attention-lost", "cap",
          "other")
# vLLM appends "-" and 8 random characters to the caller's request id (the trace's id)
_ENGINE_SUFFIX = re.compile(r"-[A-Za-z0-9]{8}$")
WORKLOAD_NAME = "workload.json"
RESULTS_NAME = "results.parquet"
SUMMARY_NAME = "summary.json"
PREFIX_STATS_SUFFIX = ".prefix_cache.json"  # written beside a trace by the vLLM tracing hooks


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """What vLLM itself counted for the run, where the run directory or the trace's side file
    has it: per-request cached prompt tokens (``RequestOutput.num_cached_tokens``), their
    total, and the scheduler's ``PrefixCacheStats`` queries / hits."""

    source: str
    cached_tokens: Mapping[str, int] = field(default_factory=dict)  # trace request id -> tokens
    prefix_hit_tokens: int | None = None
    prefix_cache_stats: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Diagnosis:
    run: Run
    rows: list[dict[str, Any]]
    causes: list[dict[str, Any]]
    totals: dict[str, Any]
    shared_source: str
    counters: EngineCounters | None
    agreement: dict[str, Any] | None
    run_summary: Mapping[str, Any] = field(default_factory=dict)  # the run directory's


# --- the shared prefix on token ids -------------------------------------------------------------

def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_prefixes(order: Sequence[str], tokens: Mapping[str, Sequence[int]]
                    ) -> TokenPrefix:
    """For each request in entry ``order`` that has ``tokens``: the longest common prefix of
    its prompt with any earlier one, and an earlier request holding it (``""``: none).

    The longest common prefix with a set of sequences is reached at a lexicographic
    neighbour, so each request costs one bisection and two comparisons::

        r1 [5 9 9 3], r2 [5 9 9 4 7], r3 [5 9 1]: r1 0, r2 3 (r1), r3 2 (r1)
    """
    seen: list[tuple[tuple[int, ...], str]] = []
    ids: list[str] = []
    raw: list[int] = []
    holders: list[str] = []
    for rid in order:
        t = tokens.get(rid)
        if t is None:
            continue
        key = (tuple(t), rid)
        i = bisect.bisect_left(seen, key)
        best, holder = 0, ""
        for j in (i - 1, i):
            if 0 <= j < len(seen):
                n = _lcp(key[0], seen[j][0])
                if n > best:
                    best, holder = n, seen[j][1]
        seen.insert(i, key)
        ids.append(rid)
        raw.append(best)
        holders.append(holder)
    return ids, raw, holders


def initial_entry_order(table: pa.Table) -> list[str]:
    """Request ids of the INITIAL waiting entries, in seq order (first entry per request)."""
    import pyarrow.compute as pc

    mask = pc.and_(pc.equal(table.column("kind"), "waiting_entry"),
                   pc.equal(table.column("preemption_count"), 0))
    rows = table.filter(mask).select(["seq", "request_id"]).sort_by("seq")
    order, seen = [], set()
    for rid in rows.column("request_id").to_pylist():
        if rid and rid not in seen:
            seen.add(rid)
            order.append(rid)
    return order


# --- the run directory ----------------------------------------------------------------------------

def run_dir(trace_path: str | Path) -> Path | None:
    """The ``hybridmem run`` output directory of a trace (OUT/trace/trace.hmt, or a file in
    OUT itself): the nearest of its parent and grandparent holding ``workload.json``,
    ``results.parquet`` or ``summary.json``."""
    p = Path(trace_path).resolve().parent
    for d in (p, p.parent):
        if any((d / n).is_file() for n in (WORKLOAD_NAME, RESULTS_NAME, SUMMARY_NAME)):
            return d
    return None


def _caller_id(trace_id: str) -> str:
    return _ENGINE_SUFFIX.sub("", trace_id)


def _id_map(order: Sequence[str], directory: Path | None) -> dict[str, str]:
    """Trace request id -> workload request id: from results.parquet's (request_id,
    engine_request_id) when present, else by dropping vLLM's 8-character suffix."""
    mapping: dict[str, str] = {}
    for eid, rid in _results_pairs(directory, "engine_request_id", "request_id") or ():
        if eid:
            mapping[str(eid)] = str(rid)
    for rid in order:
        mapping.setdefault(rid, rid)
    return mapping


def _results_pairs(directory: Path | None, key: str, value: str) -> list[tuple[Any, Any]] | None:
    """``(key, value)`` per row of the run's results.parquet (None: no file, or no such
    columns)."""
    if directory is None or not (directory / RESULTS_NAME).is_file():
        return None
    import pyarrow.parquet as pq

    res = pq.read_table(directory / RESULTS_NAME)
    if not {key, value} <= set(res.column_names):
        return None
    return list(zip(res.column(key).to_pylist(), res.column(value).to_pylist(), strict=True))


def workload_tokens(order: Sequence[str], path: Path) -> dict[str, Sequence[int]]:
    """Prompt token ids by trace request id, from a workload manifest."""
    from hybridmem.workload import load_manifest

    directory = path.parent
    w = load_manifest(path)
    by_id = {r.request_id: r.prompt_token_ids for r in w.requests}
    ids = _id_map(order, directory)
    out: dict[str, Sequence[int]] = {}
    for rid in order:
        wid = ids.get(rid, rid)
        t = by_id.get(wid)
        if t is None:
            t = by_id.get(_caller_id(rid))
        if t is not None:
            out[rid] = t
    return out


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_input_text(path, "JSON file"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HybridMemError(f"{path}: not readable JSON ({exc})") from None


def engine_counters(trace_path: str | Path, order: Sequence[str],
                    directory: Path | None) -> EngineCounters | None:
    """vLLM's own counts for the run (None when there are none): results.parquet's
    ``cached_tokens`` per request, summary.json's ``prefix_hit_tokens``, and the tracing
    hooks' ``PrefixCacheStats`` totals beside the trace."""
    sources = []
    cached: dict[str, int] = {}
    hit_total = None
    stats = None
    side = Path(str(trace_path) + PREFIX_STATS_SUFFIX)
    if side.is_file():
        data = _read_json(side)
        if isinstance(data, dict):
            stats = {k: int(v) for k, v in data.items()
                     if isinstance(v, int) and not isinstance(v, bool)}
            sources.append(side.name)
    pairs = _results_pairs(directory, "engine_request_id", "cached_tokens")
    if pairs is not None:
        for eid, n in pairs:
            if eid:
                cached[str(eid)] = int(n or 0)
        sources.append(RESULTS_NAME)
    if directory is not None and (directory / SUMMARY_NAME).is_file():
        s = _read_json(directory / SUMMARY_NAME)
        if isinstance(s, dict) and isinstance(s.get("prefix_hit_tokens"), int):
            hit_total = int(s["prefix_hit_tokens"])
            sources.append(SUMMARY_NAME)
    if not sources:
        return None
    return EngineCounters(", ".join(sources), cached, hit_total, stats)


# --- the diagnosis ------------------------------------------------------------------------------

def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    rel = con.execute(sql)
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def diagnose(run: Run, workload: str | Path | None = None) -> Diagnosis:
    """The per-request rows and the per-cause totals of ``run``. Token ids come from
    ``workload`` (a manifest), else from the run directory's, else the chains are used."""
    order = initial_entry_order(run.table)
    directory = run_dir(run.path)
    manifest = Path(workload) if workload is not None else (
        directory / WORKLOAD_NAME
        if directory is not None and (directory / WORKLOAD_NAME).is_file() else None)
    prefix = NO_TOKEN_PREFIX
    source = "chain"
    if manifest is not None:
        if not manifest.is_file():
            raise HybridMemError(f"{manifest}: no such workload manifest")
        tokens = workload_tokens(order, manifest)
        if order and not tokens:
            raise HybridMemError(f"{manifest}: none of the trace's {len(order):,} requests is "
                                 "in this workload (another run's manifest?)")
        prefix = shared_prefixes(order, tokens)
        source = f"tokens ({manifest.name}: {len(tokens):,}/{len(order):,} requests)"
    con = connect(run.table, run.meta, source=run.path, materialize=True,
                  only=frozenset({"reuse_diagnosis", "reuse_causes"}), token_prefix=prefix)
    try:
        rows = _rows(con, "SELECT * FROM reuse_diagnosis ORDER BY adopt_step, request_id")
        causes = _rows(con, "SELECT cause, tokens, requests, share FROM reuse_causes "
                            "ORDER BY rank")
        never = con.execute(
            "SELECT count(*) FROM _entries WHERE preemption_count = 0 AND j_adopt IS NULL"
        ).fetchone()
    finally:
        con.close()
    kinds = run.table.column("kind").value_counts().to_pylist()
    kind_count = {k["values"]: int(k["counts"]) for k in kinds}
    totals = {
        "waiting_entries": kind_count.get("waiting_entry", 0),
        "publications": kind_count.get("publication", 0),
        "losses": kind_count.get("loss", 0),
        "requests": len(rows),
        "requests_never_adopted": int(never[0]) if never else 0,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows),
        "shared_tokens": sum(r["shared_tokens"] for r in rows),
        "reused_tokens": sum(r["reused_tokens"] for r in rows),
        "unreused_tokens": sum(r["unreused_tokens"] for r in rows),
        "explained_tokens": sum(c["tokens"] for c in causes if c["cause"] != "other"),
        "other_tokens": next(c["tokens"] for c in causes if c["cause"] == "other"),
    }
    counters = engine_counters(run.path, order, directory)
    summary: Any = {}
    if directory is not None and (directory / SUMMARY_NAME).is_file():
        summary = _read_json(directory / SUMMARY_NAME)
    return Diagnosis(run, rows, causes, totals, source, counters, _agreement(rows, counters),
                     summary if isinstance(summary, dict) else {})


def _agreement(rows: list[dict[str, Any]], c: EngineCounters | None) -> dict[str, Any] | None:
    """The trace's reused tokens against vLLM's own counts, per request and in total."""
    if c is None:
        return None
    out: dict[str, Any] = {"source": c.source}
    reused = sum(r["reused_tokens"] for r in rows)
    if c.cached_tokens:
        matched = [r for r in rows if r["request_id"] in c.cached_tokens]
        differ = [(r["request_id"], r["reused_tokens"], c.cached_tokens[r["request_id"]])
                  for r in matched if r["reused_tokens"] != c.cached_tokens[r["request_id"]]]
        out["requests_compared"] = len(matched)
        out["requests_differing"] = len(differ)
        out["first_differences"] = differ[:5]
        out["engine_cached_tokens"] = sum(c.cached_tokens[r["request_id"]] for r in matched)
        out["trace_reused_tokens_compared"] = sum(r["reused_tokens"] for r in matched)
    if c.prefix_hit_tokens is not None:
        out["engine_prefix_hit_tokens"] = c.prefix_hit_tokens
        out["trace_reused_tokens"] = reused
    if c.prefix_cache_stats is not None:
        out["prefix_cache_stats"] = dict(c.prefix_cache_stats)
        out["trace_prompt_tokens"] = sum(r["prompt_tokens"] or 0 for r in rows)
    checks = []
    if "requests_differing" in out:
        checks.append(out["requests_differing"] == 0)
    if "engine_prefix_hit_tokens" in out:
        checks.append(out["engine_prefix_hit_tokens"] == reused)
    if c.prefix_cache_stats is not None:
        # INITIAL lookups only: vLLM counts preempted requests' lookups apart
        st = c.prefix_cache_stats
        checks.append(st.get("hits") == reused)
        checks.append(st.get("queries") == out["trace_prompt_tokens"])
        checks.append(st.get("requests") == len(rows))
    out["agree"] = all(checks) if checks else None
    return out


# --- output ---------------------------------------------------------------------------------------

def conditions(d: Diagnosis) -> str:
    """The run's conditions, for titles: organization, model, grids, seed from the trace's
    metadata; simulated or not, device preset and workload from the run's summary.json."""
    m = d.run.meta
    x = m.extra
    parts = [str(m.organization)]
    model = x.get("model") or (x.get("geometry") if isinstance(x.get("geometry"), str) else None)
    if model:
        parts.append(f"model {Path(str(model)).name}")
    if x.get("engine_version"):
        parts.append(f"vLLM {x['engine_version']}")
    parts.append(f"grid {m.attention_grid_tokens}/{m.recurrent_grid_tokens} tokens")
    if x.get("mamba_cache_mode"):
        parts.append(f"mamba_cache_mode {x['mamba_cache_mode']}")
    if x.get("budget") is not None:
        parts.append(f"budget {x['budget']}")
    if x.get("seed") is not None:
        parts.append(f"seed {x['seed']}")
    s = d.run_summary
    if s.get("simulated"):
        cal = "calibrated" if s.get("calibrated") else "uncalibrated"
        parts.append(f"simulated ({s.get('device')} preset, {cal} cost model)")
    cfg = s.get("config")
    c = {**(cfg if isinstance(cfg, dict) else {}),
         **{k: s[k] for k in ("rate", "share", "cap") if k in s}}
    if s.get("requests") is not None and c.get("rate") is not None:
        parts.append(f"{s.get('requests')} requests at {c.get('rate')} req/s, share "
                     f"{c.get('share')}, cap {c.get('cap')}")
    return ", ".join(parts)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def format_text(d: Diagnosis, rows: int = 20) -> str:
    t = d.totals
    out = [f"diagnose {d.run.path}: {conditions(d)}; trace {d.run.verification}",
           f"  shared prefix measured on {d.shared_source}",
           *([f"  no waiting entries or adoptions: the table records the supply side only "
              f"({t['publications']:,} publications, {t['losses']:,} losses), as a vLLM "
              "KV-event stream does; run vLLM with HYBRIDMEM_TRACE for requests"]
             if t["waiting_entries"] == 0 else []),
           f"  INITIAL requests {t['requests']:,} (never adopted, left out: "
           f"{t['requests_never_adopted']:,}); prompt tokens {t['prompt_tokens']:,}",
           f"  shared {t['shared_tokens']:,} tokens, reused {t['reused_tokens']:,} "
           f"({_pct(t['reused_tokens'], t['shared_tokens']).strip()}), not reused "
           f"{t['unreused_tokens']:,}",
           "",
           f"  {'cause':<18} {'tokens':>10} {'share':>7} {'requests':>9}"]
    for c in d.causes:
        out.append(f"  {c['cause']:<18} {c['tokens']:>10,} "
                   f"{_pct(c['tokens'], t['unreused_tokens']):>7} {c['requests']:>9,}")
    out.append(f"  {'total':<18} {sum(c['tokens'] for c in d.causes):>10,} "
               f"{_pct(sum(c['tokens'] for c in d.causes), t['unreused_tokens']):>7}")
    a = d.agreement
    if a is None:
        out.append("  engine counters: none found beside the trace")
    else:
        out.append(f"  engine counters ({a['source']}):")
        if "requests_compared" in a:
            out.append(f"    vLLM num_cached_tokens {a['engine_cached_tokens']:,} vs trace "
                       f"J_adopt {a['trace_reused_tokens_compared']:,} over "
                       f"{a['requests_compared']:,} requests; differing "
                       f"{a['requests_differing']:,}"
                       + "".join(f"\n      {r}: trace {j:,}, vLLM {v:,}"
                                 for r, j, v in a["first_differences"]))
        if "engine_prefix_hit_tokens" in a:
            out.append(f"    run summary prefix_hit_tokens {a['engine_prefix_hit_tokens']:,} vs "
                       f"trace {a['trace_reused_tokens']:,}")
        if "prefix_cache_stats" in a:
            st = a["prefix_cache_stats"]
            out.append(f"    vLLM PrefixCacheStats queries {st.get('queries', 0):,} hits "
                       f"{st.get('hits', 0):,} (requests {st.get('requests', 0):,}) vs trace "
                       f"prompt {a['trace_prompt_tokens']:,} reused {t['reused_tokens']:,}")
        out.append(f"    agree: {a['agree']}")
    lost = [r for r in d.rows if r["unreused_tokens"] != 0]
    if lost and rows > 0:
        lost.sort(key=lambda r: -abs(r["unreused_tokens"]))
        out.append("")
        out.append(f"  requests with unreused shared tokens ({len(lost):,}; the "
                   f"{min(rows, len(lost))} largest):")
        out.append(f"  {'request':<22} {'L':>6} {'shared':>7} {'reused':>7} {'cause':<17} detail")
        for r in lost[:rows]:
            out.append(f"  {str(r['request_id'])[:22]:<22} {r['prompt_tokens']:>6} "
                       f"{r['shared_tokens']:>7} {r['reused_tokens']:>7} {r['cause']:<17} "
                       f"{r['detail']}")
    return "\n".join(out)


def to_json(d: Diagnosis) -> dict[str, Any]:
    return {
        "path": d.run.path,
        "conditions": conditions(d),
        "meta": d.run.meta.as_json(),
        "verification": d.run.verification,
        "shared_source": d.shared_source,
        "totals": d.totals,
        "causes": d.causes,
        "engine": d.agreement,
        "requests": d.rows,
    }


def plot(d: Diagnosis, out: str) -> None:
    """Bars of unreused shared-prefix tokens by cause, titled with the run's conditions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c["cause"] for c in d.causes]
    tokens = [c["tokens"] for c in d.causes]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    bars = ax.bar(names, tokens, color=["#6a1b9a", "#1565c0", "#0097a7", "#c62828", "#ef6c00",
                                        "#757575", "#212121"])
    for b, c in zip(bars, d.causes, strict=True):
        ax.annotate(f"{c['tokens']:,}\n{c['requests']:,} req", (b.get_x() + b.get_width() / 2,
                    b.get_height()), ha="center", va="bottom", fontsize=8)
    t = d.totals
    ax.set_ylabel("unreused shared-prefix tokens")
    import textwrap

    ax.set_title(f"{textwrap.fill(conditions(d), 110)}\nshared {t['shared_tokens']:,}, reused "
                 f"{t['reused_tokens']:,} tokens over {t['requests']:,} INITIAL requests "
                 f"(shared on {d.shared_source.split(' ', 1)[0]})", fontsize=9)
    ax.tick_params(axis="x", rotation=15)
    ax.margins(y=0.18)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def rows_csv(d: Diagnosis) -> str:
    import csv
    import io

    buf = io.StringIO()
    if d.rows:
        w = csv.DictWriter(buf, fieldnames=list(d.rows[0]))
        w.writeheader()
        for r in d.rows:
            w.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
                        for k, v in r.items()})
    return buf.getvalue()

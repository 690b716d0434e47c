"""What-if replay: a recorded run's workload under vllm, S0, S1, S2 and D0 at the same bytes.

A run directory (``hybridmem run`` or ``hybridmem sim``) holds the workload it served
(``workload.json``: token ids, planned arrivals, output targets), what vLLM counted per request
(``results.parquet``: ``cached_tokens``), its summary and, when traced, the trace, whose metadata
names the engine's block, pool size, running cap and step token budget. :func:`plan_replay`
turns that into one :class:`~hybridmem.sim.run.SimConfig` per organization::

    recorded run ──> workload.json (same requests)   ──> SimConfig(org=vllm|S0|S1|S2|D0,
                     trace meta / summary:                       replay=workload.json,
                       cap, model limit, step budget,            budget = the recorded bytes,
                       block x pool = the bytes                  stock_block = recorded block)
                                                     ──> run_sim per organization ──> compare

* **Geometry.** By default the recorded model's (the tiny model: its config is written beside
  the replay, ``model/config.json``; S0-S2 on its 64-token grid, as ``hybridmem run`` serves
  it), ``vllm`` on the recorded block (256 tokens for the tiny model on CPU) and pool, the
  organizations at the same per-layer bytes. With ``model`` named (a shipped config), the
  same requests run at that model's geometry, at ``budget`` (default b63), on the device
  preset's step budget and vLLM's GPU block.
* **Arrivals.** ``planned`` (default): each request at its planned arrival on virtual time,
  like any simulated run. ``steps``: each request enters when the scheduler has run as many
  steps as it had when the request entered the recorded run (the trace's WAITING_ENTRY step),
  so the ``vllm`` arm sees the recorded interleaving of arrivals and steps; the recorded
  run's wall-clock arrivals fell between steps whose lengths the cost model does not know.
* **Fidelity** (``vllm`` arm of a ``vllm`` recording at its own geometry): per request, the
  prefix-hit tokens vLLM recorded against the replay's, and the step each request was
  admitted at (the traces' ADOPTION events).

A D0 arm needs an attention fraction: the model preset's (Falcon-H1-7B, Granite-4.0-H-Micro)
or ``attention_fraction``; without one (the tiny model, Nemotron-H-8B) the arm is skipped and
the comparison says why.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.sim.run import SimConfig, check_budget
from hybridmem.workload import MANIFEST_NAME, load_manifest

ARRIVALS = ("planned", "steps")
COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
TINY_GRID = 64  # hybridmem.engines.tiny_model.TINY_GRID_TOKENS (serving imports stay lazy)
_ENGINE_SUFFIX = re.compile(r"-[A-Za-z0-9]{8}$")  # vLLM's id suffix (the trace's ids)


@dataclass(frozen=True)
class Recorded:
    """What a run directory says about the run it holds."""

    run_dir: Path
    manifest: Path
    summary: dict[str, Any]
    meta: dict[str, Any]            # the trace's run metadata ({} untraced)
    trace: Path | None
    cached: dict[str, int]          # workload request id -> prompt tokens vLLM found cached
    entry_steps: dict[str, int]     # request id -> scheduler steps before it entered ({} untraced)
    admit_steps: dict[str, int]     # request id -> step of its first admission ({} untraced)

    @property
    def org(self) -> str:
        return str(self.summary.get("org") or self.summary.get("organization") or "vllm")

    @property
    def config(self) -> dict[str, Any]:
        c = self.summary.get("config")
        return c if isinstance(c, dict) else {}

    @property
    def model(self) -> str:
        return str(self.summary.get("model") if self.summary.get("simulated")
                   else self.config.get("model", "tiny"))


def find_run_dir(path: str | Path) -> Path:
    """The run directory of ``path``: itself, or for a trace file the parent or grandparent
    holding ``workload.json`` (the layout ``hybridmem run`` and ``hybridmem sim`` write)."""
    p = Path(path)
    if not p.exists():
        raise HybridMemError(f"--replay {str(path)!r}: no such run directory or trace")
    for d in ([p] if p.is_dir() else [p.parent, p.parent.parent]):
        if (d / MANIFEST_NAME).is_file():
            return d
    raise HybridMemError(f"--replay {str(path)!r}: no {MANIFEST_NAME} there (the recorded "
                         "prompts' token ids); a trace alone records only their block hashes")


def _first_steps(trace: Path, results: list[dict[str, Any]]) -> tuple[dict[str, int],
                                                                     dict[str, int]]:
    """Per request: the steps run before it entered, and the step of its first admission."""
    from lineage.source import open_run

    run = open_run(trace, columns=("kind", "step", "request_id", "preemption_count"))
    by_engine = {r["engine_request_id"]: r["request_id"] for r in results
                 if r.get("engine_request_id")}
    entry: dict[str, int] = {}
    admit: dict[str, int] = {}
    cols = run.table.select(["kind", "step", "request_id", "preemption_count"]).to_pylist()
    for ev in cols:
        if ev["preemption_count"] not in (0, None):
            continue
        rid = str(ev["request_id"])
        rid = by_engine.get(rid, rid if rid in by_engine.values() else
                            _ENGINE_SUFFIX.sub("", rid))
        kind = str(ev["kind"]).lower()
        if kind == "waiting_entry":
            entry.setdefault(rid, int(ev["step"]))
        elif kind == "adoption":
            admit.setdefault(rid, int(ev["step"]))
    return entry, admit


def load_recorded(path: str | Path) -> Recorded:
    """Read a run directory (or a trace inside one)."""
    import pyarrow.parquet as pq

    run_dir = find_run_dir(path)
    manifest = run_dir / MANIFEST_NAME
    load_manifest(manifest)  # checks format and digest now: one line if it is bad
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        raise HybridMemError(f"--replay {str(run_dir)!r}: no readable summary.json "
                             f"({type(exc).__name__})") from None
    results: list[dict[str, Any]] = []
    if (run_dir / "results.parquet").is_file():
        results = pq.read_table(run_dir / "results.parquet",
                                columns=["request_id", "engine_request_id",
                                         "cached_tokens"]).to_pylist()
    cached = {str(r["request_id"]): int(r["cached_tokens"]) for r in results}
    trace_path = summary.get("trace_path")
    trace = Path(trace_path) if trace_path else None
    if trace is not None and not trace.is_file():
        local = run_dir / "trace" / trace.name
        trace = local if local.is_file() else None
    meta: dict[str, Any] = {}
    entry: dict[str, int] = {}
    admit: dict[str, int] = {}
    if trace is not None:
        from lineage.source import open_run

        m = open_run(trace, columns=("kind",)).meta
        meta = {**m.extra, "attention_grid_tokens": m.attention_grid_tokens,
                "recurrent_grid_tokens": m.recurrent_grid_tokens}
        entry, admit = _first_steps(trace, results)
    return Recorded(run_dir, manifest, summary, meta, trace, cached, entry, admit)


def tiny_config_dir(out: Path) -> Path:
    """The tiny model's config.json (architecture only) written into ``out/model``."""
    from transformers import FalconH1Config

    from hybridmem.engines.tiny_model import config_kwargs

    d = out / "model"
    d.mkdir(parents=True, exist_ok=True)
    cfg = FalconH1Config(**config_kwargs())
    cfg.architectures = ["FalconH1ForCausalLM"]
    cfg.save_pretrained(d)
    return d


def _is_tiny(model: str) -> bool:
    """The tiny model by name, or a directory `hybridmem model build` wrote."""
    if model == "tiny":
        return True
    try:
        meta = json.loads((Path(model) / "hybridmem.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == "hybridmem-model"


def recorded_bytes(rec: Recorded, attn_bytes_per_token: int) -> str:
    """The recorded run's per-layer budget: its label or bytes (an organization or a simulated
    run), or vLLM's pool (blocks x block tokens x bytes per token) for a real ``vllm`` run."""
    budget = rec.summary.get("budget")
    if budget:
        return str(budget)
    blocks, block = rec.meta.get("num_blocks"), rec.meta.get("attention_grid_tokens")
    if not blocks or not block:
        raise HybridMemError(f"--replay {str(rec.run_dir)!r}: the run names no budget and has "
                             "no trace metadata giving vLLM's pool (num_blocks, block size); "
                             "pass --budget")
    return str(int(blocks) * int(block) * attn_bytes_per_token)


@dataclass(frozen=True)
class Arm:
    org: str
    config: SimConfig | None
    skipped: str | None = None     # why this organization cannot run (None: it runs)


def plan_replay(rec: Recorded, arms: list[str], out: Path, *, model: str | None = None,
                budget: str | None = None, device: str = "a100-40gb",
                attention_fraction: float | None = None, trace: bool = True,
                base: SimConfig | None = None) -> tuple[list[Arm], dict[str, Any]]:
    """One :class:`Arm` per organization, and the replay's conditions (for the comparison)."""
    from hybridmem.geometry import SHIPPED
    from hybridmem.sim.model_shape import load_shape

    recorded_geometry = model is None
    name = rec.model if model is None else model
    if _is_tiny(name):
        model_dir = str(tiny_config_dir(out))
        grid: int | None = TINY_GRID
        label = "tiny"
    elif name in SHIPPED or Path(name).exists():
        model_dir, grid, label = name, None, name
    else:
        raise HybridMemError(f"recorded model {name!r} is neither a shipped config "
                             f"({', '.join(SHIPPED)}) nor a config here; name one with --model")
    shape = load_shape(model_dir)
    a1 = shape.geometry.attn_bytes_per_token
    if budget is None:
        budget = recorded_bytes(rec, a1) if recorded_geometry else "b63"
    cfg = rec.config
    cap = int(rec.meta.get("max_num_seqs") or cfg.get("cap") or 63)
    limit = int(rec.meta.get("max_model_len") or cfg.get("max_model_len") or 8192)
    step_budget: int | None = None
    stock_block: int | None = None
    if recorded_geometry:
        step_budget = (rec.meta.get("max_num_batched_tokens") or cfg.get("chunk_tokens")
                       or rec.summary.get("max_num_batched_tokens"))
        if rec.org == "vllm" and rec.meta.get("attention_grid_tokens"):
            stock_block = int(rec.meta["attention_grid_tokens"])
    admit_first = bool(cfg.get("admit_first_chunk", False))
    if "scheduler_reserve_full_isl" in rec.meta:
        admit_first = not rec.meta["scheduler_reserve_full_isl"]
    seed = int(rec.summary.get("seed") or 0)
    common = base or SimConfig()
    frac = attention_fraction if attention_fraction is not None else \
        shape.geometry.attention_fraction
    planned: list[Arm] = []
    for org in arms:
        if org == "D0" and frac is None:
            planned.append(Arm(org, None, f"{label} has no attention-fraction preset (D0 splits "
                               "the budget between its pools by it); pass --attention-fraction"))
            continue
        c = replace(common, model=model_dir, device=device, org=org, budget=budget, cap=cap,
                    seed=seed, requests=len(load_manifest(rec.manifest).requests),
                    max_model_len=limit, admit_first_chunk=admit_first,
                    grid=grid if org in ("S0", "S1", "S2") else None,
                    attention_fraction=(attention_fraction if org == "D0" else None),
                    headroom=common.headroom if org != "vllm" else 0.0,
                    pin_k=common.pin_k if org != "vllm" else None,
                    retention=common.retention if org != "vllm" else False,
                    replay=rec.manifest, max_num_batched_tokens=(
                        int(step_budget) if step_budget else None),
                    stock_block=stock_block if org == "vllm" else None,
                    out=out / org, trace_dir=(out / org / "trace") if trace else None)
        planned.append(Arm(org, check_budget(c.check())))  # every arm before any runs
    conditions = {
        "recorded_run": str(rec.run_dir), "recorded_org": rec.org,
        "recorded_model": rec.model, "model": label, "geometry": (
            "recorded" if recorded_geometry else "named"),
        "budget": budget, "cap": cap, "max_model_len": limit,
        "max_num_batched_tokens": int(step_budget) if step_budget else None,
        "stock_block_tokens": stock_block, "device": device,
        "admission_gate": "first chunk" if admit_first else "whole sequence",
        "requests": len(load_manifest(rec.manifest).requests),
    }
    return planned, conditions


ROW_KEYS = ("completed", "throughput_tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "preemptions",
            "prefix_hit_tokens", "recorded_prompt_full_tokens", "num_blocks", "block_tokens",
            "steps")


def _row(org: str, summary: dict[str, Any]) -> dict[str, Any]:
    return {"org": org, **{k: summary.get(k) for k in ROW_KEYS}}


def fidelity(rec: Recorded, arm_dir: Path, arrivals: str) -> dict[str, Any]:
    """The ``vllm`` arm against the recorded run: per-request prefix-hit tokens and admission
    steps (where both runs were traced)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(arm_dir / "results.parquet",
                         columns=["request_id", "cached_tokens"]).to_pylist()
    replayed = {str(r["request_id"]): int(r["cached_tokens"]) for r in rows}
    ids = [rid for rid in replayed if rid in rec.cached]
    differ = [{"request_id": rid, "recorded": rec.cached[rid], "replay": replayed[rid]}
              for rid in ids if rec.cached[rid] != replayed[rid]]
    total_rec = sum(rec.cached[rid] for rid in ids)
    total_rep = sum(replayed[rid] for rid in ids)
    out: dict[str, Any] = {
        "arrivals": arrivals, "requests": len(ids), "requests_differing": len(differ),
        "recorded_hit_tokens": total_rec, "replay_hit_tokens": total_rep,
        "relative_difference": ((total_rep - total_rec) / total_rec if total_rec
                                else (0.0 if total_rep == 0 else math.inf)),
        "differing": differ[:50],
    }
    replay_trace = arm_dir / "trace" / "trace.hmt"
    if rec.admit_steps and replay_trace.is_file():
        _, admit = _first_steps(replay_trace, [{"request_id": r, "engine_request_id": r}
                                               for r in replayed])
        same = [rid for rid in ids if rid in admit and admit[rid] == rec.admit_steps.get(rid)]
        order_rec = sorted(rec.admit_steps, key=lambda r: (rec.admit_steps[r], r))
        order_rep = sorted(admit, key=lambda r: (admit[r], r))
        out.update(admissions_same_step=len(same), admissions_compared=len(ids),
                   admission_order_same=order_rec == order_rep)
    return out


def replay(rec: Recorded, arms: list[Arm], conditions: dict[str, Any], out: Path,
           arrivals: str = "planned", progress: bool = False) -> dict[str, Any]:
    """Run every arm, then write ``comparison.json`` and ``comparison.md`` into ``out``."""
    from hybridmem.outputs import write_text_atomic
    from hybridmem.sim.run import run_sim

    if arrivals not in ARRIVALS:
        raise HybridMemError(f"unknown arrivals {arrivals!r}; expected one of "
                             f"{', '.join(ARRIVALS)}")
    if arrivals == "steps" and not rec.entry_steps:
        raise HybridMemError(f"--replay-arrivals steps needs the recorded run's trace (entry "
                             f"steps); {str(rec.run_dir)!r} has none")
    steps = rec.entry_steps if arrivals == "steps" else None
    rows = []
    skipped = {}
    fid = None
    for arm in arms:
        if arm.config is None:
            skipped[arm.org] = arm.skipped
            continue
        result = run_sim(arm.config, progress=progress, entry_steps=steps)
        rows.append(_row(arm.org, result.summary))
        same_geometry = conditions["geometry"] == "recorded"
        if arm.org == "vllm" and rec.org == "vllm" and same_geometry and rec.cached:
            fid = fidelity(rec, Path(arm.config.out), arrivals)
    recorded_row = _row(f"recorded {rec.org}", rec.summary)
    doc = {"conditions": {**conditions, "arrivals": arrivals}, "recorded": recorded_row,
           "arms": rows, "skipped": skipped, "fidelity": fid}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / COMPARISON_JSON, json.dumps(doc, indent=2, default=str) + "\n",
                      [rec.manifest], what="comparison")
    write_text_atomic(out / COMPARISON_MD, format_comparison(doc) + "\n", [rec.manifest],
                      what="comparison")
    return doc


def _fmt(v: Any, spec: str = ",") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec if spec != "," else ",.1f")
    return format(v, spec) if isinstance(v, int) else str(v)


def format_comparison(doc: dict[str, Any]) -> str:
    """The comparison as a markdown table with its conditions, and the fidelity line."""
    c = doc["conditions"]
    head = (f"Replay of {c['recorded_run']} ({c['recorded_org']}, model {c['recorded_model']}): "
            f"{c['requests']} requests at {c['model']} geometry ({c['geometry']}), budget "
            f"{c['budget']} per layer, cap {c['cap']}, step budget "
            f"{c['max_num_batched_tokens'] or 'the device preset'}, arrivals {c['arrivals']}; "
            f"simulated on the {c['device']} preset (uncalibrated cost model), vLLM's scheduler")
    lines = [head, "",
             "| arm | completed | tok/s | TTFT p50 s | TTFT p99 s | preemptions | prefix-hit "
             "tokens | reused % of prompt | blocks x tokens | steps |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]

    def line(r: dict[str, Any], note: str = "") -> str:
        prompt = r.get("recorded_prompt_full_tokens")
        hits = r.get("prefix_hit_tokens")
        share = f"{100 * hits / prompt:.1f}" if prompt and hits is not None else "-"
        grid = (f"{r['num_blocks']} x {r['block_tokens']}" if r.get("num_blocks") else "-")
        return (f"| {r['org']}{note} | {_fmt(r['completed'])} | {_fmt(r['throughput_tok_s'])} | "
                f"{_fmt(r['ttft_p50'], '.3f')} | {_fmt(r['ttft_p99'], '.3f')} | "
                f"{_fmt(r['preemptions'])} | {_fmt(hits)} | {share} | {grid} | "
                f"{_fmt(r['steps'])} |")
    for r in doc["arms"]:
        lines.append(line(r))
    rec = doc["recorded"]
    lines.append(line(rec, " (its own clock)"))
    for org, why in doc["skipped"].items():
        lines.append(f"\n{org} skipped: {why}")
    f = doc.get("fidelity")
    if f:
        text = (f"\nvllm arm against the recorded run ({f['arrivals']} arrivals): prefix-hit "
                f"tokens {f['replay_hit_tokens']:,} vs recorded {f['recorded_hit_tokens']:,} "
                f"({100 * f['relative_difference']:+.2f}%), {f['requests_differing']} of "
                f"{f['requests']} requests differ")
        if "admissions_same_step" in f:
            text += (f"; admitted at the recorded step: {f['admissions_same_step']} of "
                     f"{f['admissions_compared']}, admission order "
                     f"{'the same' if f['admission_order_same'] else 'differs'}")
        lines.append(text)
    return "\n".join(lines)

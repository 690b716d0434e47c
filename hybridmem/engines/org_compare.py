"""S0, S1, S2 and D0 side by side: one workload, one budget, one traced run each (``make demo``).

Each organization serves the same workload (Poisson arrivals, greedy) inside
vLLM's scheduler at the same per-layer budget; its own trace is verified and analysed by the
lineage report. One row per organization::

    org  pages/units  done  tok/s  preempt  hit tok  J_adopt  losses by cause      tokens
    S2   55           24/24 ...    ...      ...      ...      ALLOCATION 120, ...  = S0

This is a CPU wall-clock illustration, not a measurement of the organizations: tok/s is this
machine's. With ``arrivals="step"`` (the demo's) requests are submitted by engine step, so the
counted columns (done, preemptions, prefix-hit tokens, J_adopt, losses) repeat on any machine.
J_adopt is the mean adopted joint depth over INITIAL episodes (first admissions; resumes after a
preemption are left out).

``tokens`` compares each organization's greedy token ids with the first organization's (they
must be equal: the organizations change where state lives, not what the model computes). D0
runs with attention fraction 0.5 unless the model's preset gives one. A bar plot of throughput,
preemptions, prefix-hit tokens and J_adopt goes to ``compare.png``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORGS = ("S0", "S1", "S2", "D0")


@dataclass(frozen=True)
class OrgRow:
    org: str
    capacity: str
    completed: int
    requests: int
    throughput_tok_s: float
    preemptions: int
    prefix_hit_tokens: int
    j_adopt_mean: float | None
    losses: dict[str, int]
    accepted: bool
    sql_equals_replay: bool
    tokens: list[list[int]]


def run_org(org: str, out: Path, requests: int, share: float, seed: int, budget: str,
            model: str = "tiny", rate: float = 1e6, chunk_tokens: int | None = None,
            arrivals: str = "wall") -> OrgRow:
    import pyarrow.parquet as pq

    from hybridmem.engines.vllm_run import RunConfig, run_serving
    from lineage.report import analyse
    from lineage.source import open_run

    cfg = RunConfig(model=model, requests=requests, rate=rate, share=share, seed=seed, cap=8,
                    out=out, trace_dir=out / "trace", org=org, budget=budget,
                    attention_fraction=0.5 if org == "D0" else None, chunk_tokens=chunk_tokens,
                    arrivals=arrivals)
    result = run_serving(cfg, progress=False)
    s = result.summary
    cap = s.get("org_plan", {}).get("capacity", {})
    rep = analyse(open_run(s["trace_path"]))
    losses: dict[str, int] = {}
    for row in rep.loss_causes:
        losses[str(row["cause"])] = losses.get(str(row["cause"]), 0) + int(row["losses"])
    return OrgRow(org, "/".join(str(v) for v in cap.values()), s["completed"], s["requests"],
                  float(s["throughput_tok_s"] or 0.0), int(s["preemptions"]),
                  int(s["prefix_hit_tokens"]), rep.summary.get("mean_j_adopt"), losses,
                  bool((s["trace_verdict"] or {}).get("accepted")),
                  bool(rep.agreement.complete),
                  pq.read_table(result.results_path).column("output_token_ids").to_pylist())


def format_rows(rows: list[OrgRow]) -> str:
    head = (f"{'org':<4} {'pages/units':>11} {'done':>7} {'tok/s':>7} {'preempt':>7} "
            f"{'hit tok':>7} {'J_adopt':>8}  {'trace':<8} {'tokens':<8} losses by cause")
    lines = [head]
    for r in rows:
        j = "-" if r.j_adopt_mean is None else f"{r.j_adopt_mean:.1f}"
        same = "equal" if r.tokens == rows[0].tokens else "DIFFER"
        trace = ("ok" if r.accepted and r.sql_equals_replay else "FAIL")
        causes = ", ".join(f"{k} {v}" for k, v in sorted(r.losses.items(), key=lambda kv: -kv[1]))
        lines.append(f"{r.org:<4} {r.capacity:>11} {r.completed:>3}/{r.requests:<3} "
                     f"{r.throughput_tok_s:7.1f} {r.preemptions:7d} {r.prefix_hit_tokens:7d} "
                     f"{j:>8}  {trace:<8} {same:<8} {causes or '-'}")
    lines.append("trace ok = verified accepted and lineage SQL == replay on every episode; "
                 f"tokens: greedy token ids against {rows[0].org}'s; J_adopt: mean adopted "
                 "joint depth over INITIAL episodes (tokens); tok/s: this CPU's wall clock")
    return "\n".join(lines)


def plot_rows(rows: list[OrgRow], png: Path, title: str = "") -> None:
    """Bars per organization; ``title`` names the conditions (workload, budget, seed, clock)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics: list[tuple[str, Any]] = [
        ("throughput (tok/s, this CPU's wall clock)", lambda r: r.throughput_tok_s),
        ("preemptions", lambda r: r.preemptions),
        ("prefix-hit tokens", lambda r: r.prefix_hit_tokens),
        ("mean J_adopt, INITIAL episodes (tokens)", lambda r: r.j_adopt_mean or 0.0),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(13, 3.6))
    names = [r.org for r in rows]
    for ax, (label, get) in zip(axes, metrics, strict=True):
        ax.bar(names, [get(r) for r in rows], color="#4a7fb5")
        ax.set_title(label, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    tmp = png.with_name(png.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.rename(png)


def compare_orgs(out: Path, requests: int, share: float, seed: int, budget: str,
                 rate: float = 1e6, orgs: tuple[str, ...] = ORGS,
                 arrivals: str = "wall") -> tuple[bool, Path]:
    """Run, print the table, plot; (every trace accepted, lineage agreed, tokens equal; png).
    ``rate``: Poisson arrivals per second (1e6: all at t = 0, so only resumes adopt)."""
    rows = []
    for org in orgs:
        print(f"  serving under {org} ...", file=sys.stderr, flush=True)
        rows.append(run_org(org, out / org, requests, share, seed, budget, rate=rate,
                            arrivals=arrivals))
    print(format_rows(rows))
    out.mkdir(parents=True, exist_ok=True)
    png = out / "compare.png"
    how = "arrivals by engine step" if arrivals == "step" else "arrivals by wall clock"
    plot_rows(rows, png, f"{', '.join(orgs)} at budget {budget}: tiny Falcon-H1, {requests} "
              f"requests at {rate:g}/s, q={share:g}, seed {seed}, {how} | served by vLLM on "
              "CPU: an illustration (tok/s measures this machine), not a measurement")
    ok = all(r.accepted and r.sql_equals_replay and r.completed == r.requests
             and r.tokens == rows[0].tokens for r in rows)
    return ok, png


# -- the organizations' serving goals on one workload (python -m hybridmem.engines.org_compare)
FAULT_ORGS = {"swap-members": ("S1", "S2"), "stale-checkpoint": ORGS,
              "skip-invalidate": ORGS}


def _hf_tokens(model: Path, manifest: Path) -> list[list[int]]:
    import json

    import torch
    from transformers import AutoModelForCausalLM

    reqs = json.loads(manifest.read_text())["requests"]
    lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    lm.generation_config.eos_token_id = None  # like vLLM's ignore_eos
    out = []
    with torch.no_grad():
        for r in reqs:
            ids = torch.tensor([r["prompt_token_ids"]])
            gen = lm.generate(ids, max_new_tokens=r["max_output_tokens"], do_sample=False,
                              attention_mask=torch.ones_like(ids), pad_token_id=0)
            out.append(gen[0, ids.shape[1]:].tolist())
    return out


def goals(out: Path, requests: int, share: float, seed: int, budget: str,
          with_hf: bool, chunk_tokens: int | None = 256) -> int:
    """Token equality (vs --org vllm and transformers), invariants, traces, lineage, faults.
    ``chunk_tokens`` (vLLM max_num_batched_tokens, every run): 256 admits several requests at
    once at a small budget, so running requests preempt each other under every organization."""
    import pyarrow.parquet as pq

    from hybridmem.engines.tiny_model import resolve_model
    from hybridmem.engines.vllm_run import RunConfig, run_serving

    ref_cfg = RunConfig(requests=requests, rate=1e6, share=share, seed=seed, cap=8,
                        out=out / "vllm", trace_dir=out / "vllm" / "trace",
                        chunk_tokens=chunk_tokens)
    ref = run_serving(ref_cfg, progress=False)
    ref_tokens = pq.read_table(ref.results_path).column("output_token_ids").to_pylist()
    ok = True
    if with_hf:
        hf = _hf_tokens(resolve_model("tiny", None), ref.manifest_path)
        same = sum(a == b for a, b in zip(hf, ref_tokens, strict=True))
        print(f"--org vllm vs transformers: {same}/{len(hf)} requests equal")
        ok = ok and same == len(hf)
    rows = [run_org(o, out / o, requests, share, seed, budget, chunk_tokens=chunk_tokens)
            for o in ORGS]
    print(format_rows(rows))
    for r in rows:
        same = sum(a == b for a, b in zip(r.tokens, ref_tokens, strict=True))
        print(f"{r.org} vs --org vllm: {same}/{len(ref_tokens)} requests equal")
        ok = ok and same == len(ref_tokens) and r.accepted and r.sql_equals_replay
    print("fault          org  exercised  completed  changed  stop")
    for fault, orgs in FAULT_ORGS.items():
        for org in orgs:
            d = out / f"{org}-{fault}"
            cfg = RunConfig(requests=requests, rate=1e6, share=share, seed=seed, cap=8, out=d,
                            trace_dir=d / "trace", org=org, budget=budget, fault=fault,
                            attention_fraction=0.5 if org == "D0" else None,
                            chunk_tokens=chunk_tokens)
            s = run_serving(cfg, progress=False).summary
            toks = pq.read_table(d / "results.parquet").column("output_token_ids").to_pylist()
            changed = sum(a != b for a, b in zip(toks, ref_tokens, strict=True))
            stop = s["invariant_checks"] if s["invariant_checks"].startswith("violated") else "-"
            print(f"{fault:<16} {org:<3} {s.get('fault_count', 0):>9} "
                  f"{s['completed']:>5}/{s['requests']:<4} {changed:>7}  {stop[:90]}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    p = argparse.ArgumentParser(description="S0/S1/S2/D0 against --org vllm (and transformers) "
                                "on one shared-prefix workload at one budget, and the faults")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--share", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--budget", default="b20")
    p.add_argument("--max-num-batched-tokens", type=int, default=256, dest="chunk_tokens",
                   help="tokens per engine step in every run (default 256)")
    p.add_argument("--hf", action="store_true", help="also compare with transformers")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return goals(args.out, args.requests, args.share, args.seed, args.budget, args.hf,
                 args.chunk_tokens)


if __name__ == "__main__":
    sys.exit(main())

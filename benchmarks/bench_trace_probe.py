"""Trace probe cost measured side by side: one in-process vLLM engine alternates traced and
untraced rounds of the same work, so both arms share the process, the engine and the machine's
moment-to-moment load.

    PYTHONPATH=. python benchmarks/bench_trace_probe.py [--pairs 6] [--requests 60]
        [--share 0.5] [--seed 0] [--cap 8] [--model tiny] [--out DIR] [--json OUT.json]

A round resets the prefix cache, submits the whole workload at once (no arrival timing: only the
engine's work is timed), steps the engine until every request is done, and records wall-clock
and process CPU seconds. A traced round attaches the vLLM plugin's hooks and a fresh binary trace
(``hybridmem.vllm_plugin.tracing.attach``), an untraced round runs with them removed
(``detach``), so the methods are vLLM's own. Rounds go in ABBA order per pair of pairs (traced
first in even pairs) to cancel drift. After a warm-up round of each arm, per pair it prints

    cost = 100 ln(traced seconds / untraced seconds)    (log points; ~ percent; > 0: slower)

for wall-clock and CPU time, then the mean and the two-sided 90% paired-t interval of each,
and checks every traced round's trace with the tracer's verdict. This is the hook and writer cost
on CPU with the tiny model, where a step is milliseconds; it is not the fidelity rule, which
pairs whole serving runs by seed (``hybridmem fidelity``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_round(engine: Any, requests: list[Any], tag: str) -> tuple[float, float, int]:
    """Serve ``requests`` to completion; (wall s, CPU s, output tokens)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine.reset_prefix_cache()
    t0, c0 = time.perf_counter(), time.process_time()
    for r in requests:
        prompt: dict[str, Any] = {"prompt_token_ids": list(r.prompt_token_ids)}
        params = SamplingParams(max_tokens=r.max_output_tokens, temperature=0.0,
                                ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        engine.add_request(f"{tag}-{r.request_id}", prompt, params)
    tokens = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens += len(o.outputs[0].token_ids)
    return time.perf_counter() - t0, time.process_time() - c0, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6, help="timed traced/untraced pairs (>= 2)")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cap", type=int, default=8)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--out", type=Path, default=None, help="where the traces go (default: temp)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.pairs < 2:
        print(f"bench_trace_probe: --pairs must be >= 2, got {args.pairs}", file=sys.stderr)
        return 2
    if args.requests < 1:
        print(f"bench_trace_probe: --requests must be >= 1, got {args.requests}", file=sys.stderr)
        return 2

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hybridmem.engines.tiny_model import resolve_model
    from hybridmem.engines.vllm_run import (
        RunConfig,
        build_engine,
        engine_scheduler,
        make_requests,
        vocab_size,
    )
    from hybridmem.stats import paired_t_interval
    from hybridmem.vllm_plugin import tracing
    from tracer import verify

    cfg = RunConfig(model=args.model, requests=args.requests, share=args.share, seed=args.seed,
                    cap=args.cap, rate=math.inf)
    model = resolve_model(cfg.model, cfg.data_dir)
    requests = list(make_requests(cfg, vocab_size(model)).requests)
    engine = build_engine(cfg, model)
    scheduler = engine_scheduler(engine)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-trace-probe-"))
    out.mkdir(parents=True, exist_ok=True)

    def run(arm: str, k: int) -> tuple[float, float, int]:
        if arm == "traced":
            tracing.attach(scheduler, str(out / f"round-{k}.hmt"))
        try:
            return one_round(engine, requests, f"{arm}{k}")
        finally:
            tracing.detach(scheduler)

    print(f"# model {model.name}, {len(requests)} requests (all at once), cap {cfg.cap}, "
          f"share {cfg.share}, seed {cfg.seed}; traces under {out}", flush=True)
    run("traced", -2)  # warm-up of both arms (first-call costs land here)
    run("untraced", -1)
    print(f"{'pair':>4} {'traced_s':>9} {'untraced_s':>10} {'cost_wall':>9} {'cost_cpu':>8} "
          f"{'tokens':>7}")
    wall, cpu, rows = [], [], []
    for k in range(args.pairs):
        order = ("traced", "untraced") if k % 2 == 0 else ("untraced", "traced")
        got = {arm: run(arm, k) for arm in order}
        (tw, tc, tt), (uw, uc, ut) = got["traced"], got["untraced"]
        if tt != ut:
            print(f"bench_trace_probe: pair {k}: traced round made {tt} tokens, untraced {ut}",
                  file=sys.stderr)
            return 1
        wall.append(100 * math.log(tw / uw))
        cpu.append(100 * math.log(tc / uc))
        rows.append(dict(pair=k, traced_s=tw, untraced_s=uw, traced_cpu_s=tc, untraced_cpu_s=uc,
                         tokens=tt, cost_wall=wall[-1], cost_cpu=cpu[-1]))
        print(f"{k:>4} {tw:>9.3f} {uw:>10.3f} {wall[-1]:>+9.2f} {cpu[-1]:>+8.2f} {tt:>7}",
              flush=True)
    engine.engine_core.shutdown()

    verdicts = [verify(str(out / f"round-{k}.hmt")) for k in range(args.pairs)]
    accepted = sum(1 for v in verdicts if v.accepted)
    events = sum(v.records for v in verdicts)
    summary: dict[str, Any] = {"pairs": rows, "traces_accepted": accepted,
                               "trace_events": events}
    for name, xs in (("wall", wall), ("cpu", cpu)):
        ci = paired_t_interval(xs, level=0.90)
        summary[name] = dict(mean=ci.mean, low=ci.low, high=ci.high)
        print(f"cost ({name}): mean {ci.mean:+.2f} log points, 90% paired-t interval "
              f"[{ci.low:+.2f}, {ci.high:+.2f}] over {ci.n} pairs")
    print(f"traces: {accepted}/{len(verdicts)} accepted, {events} events in the timed rounds "
          f"({events / args.pairs:.0f} per round)")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if accepted == len(verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The simulated executor: vLLM's scheduler steps on a virtual clock priced by the cost model.

One loop stands in for the engine core and the GPU worker::

    now = 0
    loop:
        submit every request whose planned arrival <= now        (Scheduler.add_request)
        idle and nothing running: now = next arrival, continue
        out  = scheduler.schedule()                              (admission, preemption, reuse:
                                                                  vLLM's own code and the KV-cache
                                                                  manager it was built with)
        now += cost.step(scheduled sequences).seconds
        one synthetic token for every sequence whose prefill is complete after this step
        scheduler.update_from_output(out, ModelRunnerOutput)     (finishing, freeing, caching)
        first token / finish of a request: stamped at the new ``now``

Output tokens are synthetic (``ignore_eos``, ``max_tokens`` = the workload's output target), so
every request ends with finish reason ``length`` after exactly its target. Token ids are one
fixed id; they enter block hashes of output blocks exactly as real tokens would, but no request
can share them with another (prompts differ before them).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridmem.engines.run_results import RequestRecord
from hybridmem.errors import HybridMemError
from hybridmem.sim.cost import CostModel, Seq, StepFeatures
from hybridmem.workload import WorkloadRequest

SYNTHETIC_TOKEN = 42
MAX_IDLE_STEPS = 10_000   # schedule() calls in a row that run nothing before we call it stuck


@dataclass
class StepLog:
    """Per-step features (the columns calibration fits against) and simulated durations."""

    columns: dict[str, list[float]] = field(default_factory=lambda: {
        name: [] for name in (*StepFeatures._fields, "seconds")})

    def add(self, f: StepFeatures, seconds: float) -> None:
        for name, value in zip(StepFeatures._fields, f, strict=True):
            self.columns[name].append(value)
        self.columns["seconds"].append(seconds)


@dataclass
class SimOutcome:
    records: dict[str, RequestRecord]
    end_s: float          # virtual time of the last step
    steps: int
    preemptions: int
    wall_s: float
    step_log: StepLog
    time_parts_s: dict[str, float]   # simulated seconds by cost-model part, summed over steps
    polls: list[tuple[int, int]] = field(default_factory=list)  # (running, waiting) each 1 s
    record_steps: int = 0  # steps that produced a token: vLLM's stats records (App. B.4's K)


def make_request(r: WorkloadRequest, hasher: Any, arrival: float) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=r.max_output_tokens, temperature=0.0, ignore_eos=True)
    return Request(request_id=r.request_id, prompt_token_ids=list(r.prompt_token_ids),
                   sampling_params=params, pooling_params=None, arrival_time=arrival,
                   cache_salt=r.cache_salt, block_hasher=hasher)


def _due(r: WorkloadRequest, now: float, steps: int, entry_steps: dict[str, int] | None,
         busy: bool) -> bool:
    """Whether ``r`` is submitted before the next step: at its planned arrival, or (replaying
    recorded entry steps) once the scheduler has run its step count; an idle engine takes the
    next request at once (a recorded engine does not step while idle)."""
    if entry_steps is None:
        return r.arrival_s <= now
    return entry_steps[r.request_id] <= steps or not busy


def _count_preemptions(scheduler: Any) -> list[int]:
    counter = [0]
    orig = scheduler._preempt_request

    def preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return orig(request, *args, **kwargs)

    scheduler._preempt_request = preempt
    return counter


def simulate(scheduler: Any, requests: Sequence[WorkloadRequest], cost: CostModel,
             hasher: Any, progress: bool = False,
             entry_steps: dict[str, int] | None = None) -> SimOutcome:
    """Serve ``requests`` (open loop, planned arrivals) through ``scheduler`` on virtual time.

    ``entry_steps`` (a replay of a recorded run, :mod:`hybridmem.sim.replay`): submit each
    request when the scheduler has run as many steps as it had in the recorded run when the
    request entered (its trace's WAITING_ENTRY step), instead of at its planned arrival; its
    TTFT and E2E then count from the virtual time it was submitted.

    ``polls``: the running and waiting request counts at every whole virtual second, as the
    paper's one-second poller sampled vLLM's gauges (the counts the step spanning that second
    scheduled with; waiting includes preempted requests, as vLLM's gauge does)."""
    from vllm.v1.outputs import ModelRunnerOutput

    wall0 = time.perf_counter()
    records = {r.request_id: RequestRecord(r) for r in requests}
    for rec in records.values():
        rec.engine_id = rec.spec.request_id
    if entry_steps is None:
        pending = sorted(requests, key=lambda r: r.arrival_s)
    else:
        missing = [r.request_id for r in requests if r.request_id not in entry_steps]
        if missing:
            raise HybridMemError(f"no recorded entry step for {len(missing)} requests "
                                 f"(first {missing[0]!r})")
        pending = sorted(requests, key=lambda r: (entry_steps[r.request_id], r.arrival_s))
    preempts = _count_preemptions(scheduler)
    log = StepLog()
    parts = dict.fromkeys(("gemm_s", "attention_s", "recurrent_s", "checkpoint_s", "overhead_s",
                           "idle_s"), 0.0)
    now, nxt, steps, idle, done = 0.0, 0, 0, 0, 0
    total = len(pending)
    last_report = wall0
    live = scheduler.requests  # request id -> vLLM Request (the scheduler's own dict)
    gemm_s = attention_s = recurrent_s = checkpoint_s = overhead_s = 0.0
    polls: list[tuple[int, int]] = []
    tick = 1.0
    record_steps = 0
    while nxt < total or scheduler.has_unfinished_requests():
        while nxt < total and _due(pending[nxt], now, steps, entry_steps,
                                   scheduler.has_unfinished_requests()):
            r = pending[nxt]
            if entry_steps is not None:  # submitted now: times count from here
                r = records[r.request_id].spec = dataclasses.replace(r, arrival_s=now)
            scheduler.add_request(make_request(r, hasher, r.arrival_s))
            records[r.request_id].submitted = r.arrival_s
            nxt += 1
        if not scheduler.has_unfinished_requests():
            parts["idle_s"] += pending[nxt].arrival_s - now
            now = pending[nxt].arrival_s
            while tick <= now:
                polls.append((0, 0))
                tick += 1.0
            continue
        out = scheduler.schedule()
        steps += 1
        gauge = (len(scheduler.running), len(scheduler.waiting))
        seqs: list[Seq] = []
        sampled: list[list[int]] = []
        for rid, n in out.num_scheduled_tokens.items():
            req = live[rid]
            computed = req.num_computed_tokens
            seqs.append(Seq(int(n), int(computed) - int(n)))
            sampled.append([SYNTHETIC_TOKEN] if computed >= req.num_tokens else [])
        if not seqs:
            idle += 1
            if idle > MAX_IDLE_STEPS and nxt >= total:
                raise HybridMemError(
                    f"the scheduler runs nothing with {len(scheduler.waiting)} requests waiting "
                    "and none running: the KV cache is too small for one request at this budget")
            if (entry_steps is None and nxt < total
                    and pending[nxt].arrival_s > now):  # wait for it rather than spin
                parts["idle_s"] += pending[nxt].arrival_s - now
                now = pending[nxt].arrival_s
        else:
            idle = 0
        feats = cost.features(seqs)
        c = cost.time(feats)
        now += c.seconds
        if seqs:
            log.add(feats, c.seconds)
        gemm_s += c.gemm_s
        attention_s += c.attention_s
        recurrent_s += c.recurrent_s
        checkpoint_s += c.checkpoint_s
        overhead_s += c.overhead_s
        if any(sampled):
            record_steps += 1
        ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        for eco in scheduler.update_from_output(out, mro).values():
            for o in eco.outputs:
                rec = records[o.request_id]
                if o.new_token_ids and math.isnan(rec.first_token):
                    rec.first_token = now
                    if o.prefill_stats is not None:
                        rec.cached_tokens = int(o.prefill_stats.num_cached_tokens)
                rec.token_ids.extend(o.new_token_ids)
                if o.finish_reason is not None:
                    rec.finished = now
                    rec.finish_reason = str(o.finish_reason)
                    done += 1
        while tick <= now:
            polls.append(gauge)
            tick += 1.0
        if progress and time.perf_counter() - last_report > 2.0:
            last_report = time.perf_counter()
            print(f"sim: {done}/{total} done, virtual {now:.1f} s, {steps} steps",
                  file=sys.stderr)
    parts.update(gemm_s=gemm_s, attention_s=attention_s, recurrent_s=recurrent_s,
                 checkpoint_s=checkpoint_s, overhead_s=overhead_s)
    return SimOutcome(records, now, steps, preempts[0], time.perf_counter() - wall0, log, parts,
                      polls, record_steps)

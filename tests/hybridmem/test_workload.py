"""ShareGPT-V3-like workloads: determinism, sharing by q, arrivals, isolation, scaling, manifest."""

import json
import math
from collections import defaultdict

import numpy as np
import pytest

from hybridmem.workload import (
    LengthPlan,
    WorkloadError,
    WorkloadSpec,
    arrival_times,
    load_manifest,
    make_workload,
    sample_lengths,
    save_manifest,
)

TINY = dict(vocab_size=1000, model_limit=512)  # the CPU tiny model


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_same_seed_same_workload_other_seed_differs():
    a = make_workload(WorkloadSpec(num_requests=40, seed=3, **TINY))
    b = make_workload(WorkloadSpec(num_requests=40, seed=3, **TINY))
    c = make_workload(WorkloadSpec(num_requests=40, seed=4, **TINY))
    assert a == b
    assert [r.prompt_token_ids for r in a.requests] != [r.prompt_token_ids for r in c.requests]
    assert [r.arrival_s for r in a.requests] != [r.arrival_s for r in c.requests]


def test_q_and_isolate_keep_lengths_contexts_targets_and_arrivals():
    # "Recorded prompt lengths, contexts, and output targets match within seeds" (§4.5)
    ws = [make_workload(WorkloadSpec(num_requests=60, seed=9, share=q, isolate=iso, **TINY))
          for q in (0.0, 0.5, 1.0) for iso in (False, True)]
    key = [[(r.num_input_tokens, r.context_id, r.max_output_tokens, r.arrival_s)
            for r in w.requests] for w in ws]
    assert all(k == key[0] for k in key)


def test_q1_prompts_are_context_prefixes_and_q0_shares_nothing():
    w1 = make_workload(WorkloadSpec(num_requests=80, share=1.0, **TINY))
    w0 = make_workload(WorkloadSpec(num_requests=80, share=0.0, **TINY))
    by_ctx = defaultdict(list)
    for r in w1.requests:
        assert r.shared_prefix_tokens == r.num_input_tokens
        by_ctx[r.context_id].append(r.prompt_token_ids)
    assert len(by_ctx) == 8  # eight shared contexts, all used with 80 requests
    for prompts in by_ctx.values():  # same context: the shorter prompt is a prefix of the longer
        for a, b in zip(prompts, prompts[1:], strict=False):
            assert common_prefix(a, b) == min(len(a), len(b))
    heads = [p[0][:16] for p in by_ctx.values()]
    assert len(set(heads)) == 8  # distinct contexts differ from their first block
    # q = 0: no request shares even 4 leading tokens with another
    heads0 = [r.prompt_token_ids[:4] for r in w0.requests]
    assert len(set(heads0)) == len(heads0)
    assert all(r.shared_prefix_tokens == 0 for r in w0.requests)


def test_half_share_prefix_length_and_unique_tail():
    w = make_workload(WorkloadSpec(num_requests=50, share=0.5, **TINY))
    full = make_workload(WorkloadSpec(num_requests=50, share=1.0, **TINY))
    for r, f in zip(w.requests, full.requests, strict=True):
        assert r.shared_prefix_tokens == round(0.5 * r.num_input_tokens)
        # the shared part is the context's prefix, the same tokens as under q = 1
        assert r.prompt_token_ids[:r.shared_prefix_tokens] == f.prompt_token_ids[
            :r.shared_prefix_tokens]


def test_poisson_rate_and_first_arrival():
    spec = WorkloadSpec(num_requests=4000, rate=3.0, seed=1, **TINY)
    t = arrival_times(spec)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps > 0)
    # 3,999 exponential gaps of mean 1/3 s: the sample mean has sd 0.333/sqrt(3999) = 0.0053
    assert gaps.mean() == pytest.approx(1 / 3, abs=4 * 0.0053)
    assert gaps.std() == pytest.approx(1 / 3, rel=0.1)  # exponential: sd equals mean
    assert np.all(arrival_times(WorkloadSpec(num_requests=5, rate=math.inf, **TINY)) == 0.0)


def test_isolate_salts_unique_and_absent_when_sharing():
    iso = make_workload(WorkloadSpec(num_requests=100, isolate=True, **TINY))
    salts = [r.cache_salt for r in iso.requests]
    assert None not in salts and len(set(salts)) == 100
    assert len({r.request_id for r in iso.requests}) == 100
    share = make_workload(WorkloadSpec(num_requests=10, **TINY))
    assert all(r.cache_salt is None for r in share.requests)


def test_reference_limit_lengths_match_paper_mean():
    spec = WorkloadSpec(vocab_size=65536, num_requests=20000, seed=5)
    plan = LengthPlan(spec)
    assert (plan.output_cap, plan.max_input) == (1024, 7168)
    inputs, outputs = sample_lengths(spec)
    # mean ~3,332 input tokens (§4.2); sample sd ~1,500 -> standard error ~11 tokens
    assert inputs.mean() == pytest.approx(3332, abs=50)
    assert inputs.max() <= 7168 and outputs.max() <= 1024 and outputs.min() >= 1
    assert np.all(inputs + outputs <= 8192)


def test_scaled_to_tiny_model_limit():
    spec = WorkloadSpec(num_requests=300, seed=2, **TINY)
    plan = LengthPlan(spec)
    # 512 / 8192 = 1/16: output cap 64, prompts up to 448, mean 3332/16 = 208.25
    assert (plan.output_cap, plan.max_input, plan.mean_input) == (64, 448, 208.25)
    w = make_workload(spec)
    tokens = np.concatenate([r.prompt_token_ids for r in w.requests])
    assert tokens.min() >= 16 and tokens.max() < 1000
    assert all(r.num_input_tokens + r.max_output_tokens <= 512 for r in w.requests)
    assert np.mean([r.num_input_tokens for r in w.requests]) == pytest.approx(208.25, rel=0.1)
    big, _ = sample_lengths(WorkloadSpec(num_requests=20000, seed=2, **TINY))
    assert big.mean() == pytest.approx(208.25, abs=3)


def test_manifest_round_trip_and_tamper_detection(tmp_path):
    w = make_workload(WorkloadSpec(num_requests=30, rate=math.inf, isolate=True, **TINY))
    path = w.save_manifest(tmp_path)  # a directory gets workload.json
    assert path.name == "workload.json"
    assert load_manifest(path) == w and load_manifest(tmp_path) == w
    data = json.loads(path.read_text())
    assert data["derived"]["output_cap"] == 64 and len(data["requests"]) == 30
    data["requests"][3]["prompt_token_ids"][0] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(WorkloadError, match="digest"):
        load_manifest(bad)
    save_manifest(w, tmp_path / "named.json")
    assert load_manifest(tmp_path / "named.json") == w


@pytest.mark.parametrize("kw,needle", [
    (dict(num_requests=0), "requests"),
    (dict(rate=0.0), "rate"),
    (dict(share=1.5), "fraction"),
    (dict(model_limit=16, output_cap=16), "output cap"),
    (dict(vocab_size=17), "usable ids"),
    (dict(mean_input=1000.0), "mean input"),
])
def test_bad_specs_name_the_value(kw, needle):
    with pytest.raises(WorkloadError, match=needle):
        make_workload(WorkloadSpec(**{**TINY, **kw}))


def test_system_prompts_cap_the_shared_prefix_per_context(tmp_path):
    """Chat-like sharing: each context's system prompt S_c in [lo, hi]; a request shares
    min(q L_i, S_c) tokens; lengths, contexts, targets and arrivals stay the seed's."""
    base = WorkloadSpec(num_requests=120, share=1.0, seed=5, **TINY)
    plain = make_workload(base)
    chat = make_workload(WorkloadSpec(**{**base.__dict__, "system_prompt_min": 60,
                                         "system_prompt_max": 150}))
    key = [[(r.num_input_tokens, r.context_id, r.max_output_tokens, r.arrival_s)
            for r in w.requests] for w in (plain, chat)]
    assert key[0] == key[1]
    system: dict[int, int] = {}
    for r in chat.requests:
        system[r.context_id] = max(system.get(r.context_id, 0), r.shared_prefix_tokens)
    assert all(60 <= s <= 150 for s in system.values()) and len(set(system.values())) > 1
    for r in chat.requests:
        s = system[r.context_id]
        assert r.shared_prefix_tokens == min(r.num_input_tokens, s)
    by_ctx = defaultdict(list)
    for r in chat.requests:
        by_ctx[r.context_id].append(r)
    for rs in by_ctx.values():  # two long requests share exactly the system prompt
        long = [r for r in rs if r.num_input_tokens > system[r.context_id]]
        for a, b in zip(long, long[1:], strict=False):
            assert common_prefix(a.prompt_token_ids, b.prompt_token_ids) == system[a.context_id]
    # negative control: without system prompts the same requests share their whole prompts
    assert any(r.shared_prefix_tokens > 150 for r in plain.requests)
    assert load_manifest(chat.save_manifest(tmp_path)) == chat


@pytest.mark.parametrize("kw", [dict(system_prompt_min=10),
                                dict(system_prompt_min=50, system_prompt_max=40),
                                dict(system_prompt_min=0, system_prompt_max=40)])
def test_bad_system_prompt_ranges(kw):
    with pytest.raises(WorkloadError, match="system prompt"):
        make_workload(WorkloadSpec(**{**TINY, **kw}))

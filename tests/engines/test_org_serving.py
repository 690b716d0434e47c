"""S0/S1/S2/D0 serve real requests inside vLLM's scheduler: tokens, traces, faults.

Every run is the same shared-prefix workload (12 requests arriving together, prompts up to ~900
tokens on a 1,024 model limit, share 0.8) at a small budget, on each organization's own grid (S0-S2
the model's, 64 tokens for the tiny model v2: one page 32 KiB, an 80 KiB SSM state over 3 member
pages, 4 conv slots per S2 slab; D0 its native 16-token unit with a 256-token checkpoint interval,
CPU attention on its 16-token kernel path), so the organizations reclaim, share and reclaim slabs,
preempt and resume (a resumed request adopts its own published checkpoints). The recurrent state
lives at the organization's addresses (S1/S2: in vLLM's own KV buffer, org page p = block p + 1;
S0/D0: a private arena). Greedy token ids must equal ``--org vllm``'s and transformers'; each fault
is shown to change outputs or stop on an invariant.

The model is whatever ``tiny_model`` builds (the default tiny model), so the tests still hold when
that model changes. Runs cost ~10 s each on 2 CPUs: S2 and the vLLM reference run by default,
the other organizations and most faults only with HYBRIDMEM_SLOW=1.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hybridmem.events import Cause, EventKind, StateKind

pytestmark = pytest.mark.vllm

K = EventKind
BUDGET = "b20"  # tiny model v2 on its 64-token grid: 55 pages (S1/S2), 21 (S0); forces reclaim
# D0 at its native 16 / 256 wastes less per request and chunks stop at its interval: b20 (110
# attention units, 10 composites at fraction 0.5) never preempts this workload. At b10 with
# fraction 0.7 (77 units of 16 tokens, 3 composites) admissions wait (8 rejected), one request
# is preempted and resumes, and a waiting request adopts a published 256-token prefix.
D0_RUN: dict[str, Any] = {"budget": "b10", "attention_fraction": 0.7}
# 256-token steps: a prefill chunk crosses up to 4 boundaries (their states exported during the
# forward), and several requests are admitted at once on their first chunk (vLLM's whole-prompt
# admission gate off), so running requests preempt each other
WORKLOAD = dict(requests=12, rate=10_000.0, share=0.8, seed=5, cap=8, max_model_len=1024,
                chunk_tokens=256, admit_first_chunk=True)
SLOW_ORGS = {"S0", "S1", "D0"}
# one policy run serves the admission and the pin/retention checks; retention may hold every
# checkpoint of a request (the longest needs 56 pages) plus headroom 0.05: b22 (60 pages);
# measured: 78 rejected admissions, 3 preemptions with pins, 73 RETENTION events
POLICY: dict[str, Any] = {"headroom": 0.05, "pin_k": 1, "pin_budget": 4, "retention": True,
                          "budget": "b22"}
NATIVE = {"S0": (64, 64), "S1": (64, 64), "S2": (64, 64), "D0": (16, 256)}  # tiny model
SHARED_ARENA = {"S1", "S2"}  # page G x a = vLLM's page; S0's page max(r, P) and D0's r are not


class Runs:
    """Module-scoped, lazily computed runs keyed by a name."""

    def __init__(self, model: Path, root: Path) -> None:
        self.model, self.root = model, root
        self.done: dict[str, Any] = {}

    def get(self, name: str, **org: Any) -> dict[str, Any]:
        if name not in self.done:
            import pyarrow.parquet as pq

            from hybridmem.engines.vllm_run import RunConfig, run_serving

            out = self.root / name
            cfg = RunConfig(model=str(self.model), out=out, trace_dir=out / "trace",
                            **WORKLOAD, **org)  # type: ignore[arg-type]
            result = run_serving(cfg, progress=False)
            self.done[name] = {
                "summary": result.summary, "workload": result.manifest_path,
                "tokens": pq.read_table(result.results_path).column("output_token_ids")
                .to_pylist(),
            }
        return self.done[name]


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tiny_model, tmp_path_factory.mktemp("org-runs"))


def org_run(runs: Runs, org: str, **extra: Any) -> dict[str, Any]:
    """A run of ``org`` at BUDGET; the App. D.2 invariant checks run unless a test turns them
    off, so every organization's serving run is also an invariant run."""
    extra.setdefault("check_invariants", True)
    kw: dict[str, Any] = {"org": org, "budget": BUDGET, **extra}
    if org == "D0":
        kw = {**kw, **D0_RUN, **extra}
    name = org + "".join(f"-{k}={v}" for k, v in sorted(extra.items()))
    return runs.get(name, **kw)


def budget(org: str) -> str:
    return str(D0_RUN["budget"]) if org == "D0" else BUDGET


def events(run: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from hybridmem.engines.trace_sink import read_trace

    return read_trace(run["summary"]["trace_path"])


ORGS = [pytest.param(o, marks=pytest.mark.slow) if o in SLOW_ORGS else o
        for o in ("S0", "S1", "S2", "D0")]


@pytest.fixture(scope="module")
def hf_tokens(runs: Runs) -> list[list[int]]:
    """transformers' greedy tokens for the workload (~11 s on 2 CPUs)."""
    import torch
    from transformers import AutoModelForCausalLM

    manifest = json.loads(Path(runs.get("vllm")["workload"]).read_text())
    model = AutoModelForCausalLM.from_pretrained(str(runs.model), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like vLLM's ignore_eos
    out = []
    with torch.no_grad():
        for r in manifest["requests"]:
            ids = torch.tensor([r["prompt_token_ids"]])
            gen = model.generate(ids, max_new_tokens=r["max_output_tokens"], do_sample=False,
                                 attention_mask=torch.ones_like(ids), pad_token_id=0)
            out.append(gen[0, ids.shape[1]:].tolist())
    return out


def changed(run: dict[str, Any], ref: dict[str, Any]) -> int:
    return sum(a != b for a, b in zip(run["tokens"], ref["tokens"], strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("org", ("vllm", "S0", "S1", "S2", "D0"))
def test_greedy_tokens_equal_transformers(runs: Runs, org: str,
                                          hf_tokens: list[list[int]]) -> None:
    """transformers' greedy tokens (~60 s with its reference Mamba kernels on 2 busy CPUs)."""
    run = runs.get("vllm") if org == "vllm" else org_run(runs, org)
    assert run["summary"]["completed"] == WORKLOAD["requests"]
    assert run["tokens"] == hf_tokens


@pytest.mark.parametrize("org", ORGS)
def test_greedy_tokens_equal_vllm_under_pressure(runs: Runs, org: str) -> None:
    ref = runs.get("vllm")
    run = org_run(runs, org)
    s = run["summary"]
    assert s["completed"] == s["requests"] == WORKLOAD["requests"]
    assert s["organization"] == org and s["budget"] == budget(org) and s["budget_bytes"] > 0
    assert s["invariant_checks"] == "passed" and s["fault"] is None
    c = s["org_counters"]
    assert c["preemptions"] >= 1 and c["adopted_tokens"] > 0, c  # pressure and reuse happened
    # each organization's own grid: S0-S2 the model's (not vLLM's 256), D0 its native 16 / 256
    plan = s["org_plan"]
    assert (plan["attention_grid_tokens"], plan["recurrent_grid_tokens"]) == NATIVE[org]
    _, evs = events(run)
    reclaims = [e for e in evs if e["kind"] == K.LOSS and e["cause"] == Cause.ALLOCATION]
    assert reclaims  # cached storage was reclaimed for other requests
    assert run["tokens"] == ref["tokens"]


@pytest.mark.parametrize("org", ORGS)
def test_state_lives_at_the_organizations_addresses(runs: Runs, org: str) -> None:
    """S1/S2 keep recurrent state in vLLM's own KV buffer (org page p = block p + 1), S0/D0 in
    a private arena; vLLM's Mamba rows are a 1-element dummy per block (the grid is on)."""
    s = org_run(runs, org)["summary"]
    st = s["state_storage"]
    want = "shared" if org in SHARED_ARENA else "private"
    assert st["arena"] == want and st["org_grid"] is True
    assert st["observed"] and set(st["observed"]) == {want}, st  # what the worker really used
    if org in ("S1", "S2"):
        assert st["members"] == 3 and st["page_bytes"] == 64 * 512
    # rows stay resident across steps: fewer rows read than written would be without it
    # (resident.py; the state tests above compare the tokens with it on)
    assert st["rows"] == "resident" and 0 < st["rows_read"] and 0 < st["rows_written"]
    meta, _ = events(org_run(runs, org))
    assert meta["state_storage"]["arena"] == want


def test_s2_slabs_are_shared_and_reclaimed(runs: Runs) -> None:
    """S2's conv lines: several checkpoints' lines on one slab page (4 slots per slab)."""
    run = org_run(runs, "S2")
    meta, evs = events(run)
    spp = meta["units"]["slots_per_slab"]
    lines: dict[int, set[int]] = {}
    for e in evs:
        if e["kind"] == K.PUBLICATION and e["state_kind"] == StateKind.RECURRENT:
            lines.setdefault(e["line"] // spp, set()).add(e["line"])
    assert spp == 4 and max(len(v) for v in lines.values()) >= 2, lines


def test_poisoned_vllm_rows_change_nothing(runs: Runs) -> None:
    """--poison-vllm-state: NaN in vLLM's own Mamba rows before every forward; tokens equal.
    (Negative control, organization mode off: test_org_state_engine's poison test.)"""
    run = org_run(runs, "S2", poison_vllm_state=True)
    s = run["summary"]
    assert s["poison_vllm_state"] is True and s["state_storage"]["poison_vllm_state"] is True
    assert s["completed"] == WORKLOAD["requests"] and s["invariant_checks"] == "passed"
    assert run["tokens"] == runs.get("vllm")["tokens"]


def test_swap_members_changes_outputs(runs: Runs) -> None:
    """Worker-side negative control: S2 reads member pages 0 and 1 swapped."""
    run = org_run(runs, "S2", fault="swap-members", check_invariants=False)
    s = run["summary"]
    assert s["fault"] == "swap-members" and s["completed"] == WORKLOAD["requests"]
    assert events(run)[0]["fault"] == "swap-members"
    assert changed(run, runs.get("vllm")) >= WORKLOAD["requests"] // 2


@pytest.mark.parametrize("org", ORGS)
def test_trace_is_the_organizations_own_history(runs: Runs, org: str) -> None:
    import tracer

    run = org_run(runs, org)
    path = run["summary"]["trace_path"]
    assert tracer.verify(path).accepted
    meta, evs = events(run)
    plan = run["summary"]["org_plan"]
    assert meta["organization"] == org
    assert meta["attention_grid_tokens"] == plan["attention_grid_tokens"]
    assert meta["recurrent_grid_tokens"] == plan["recurrent_grid_tokens"]
    assert meta["budget"] == budget(org) and meta["fault"] is None
    kinds = Counter(K(e["kind"]) for e in evs)
    for k in (K.WAITING_ENTRY, K.ADOPTION, K.ALLOCATION, K.PUBLICATION, K.RELEASE, K.LOSS,
              K.PREEMPTION, K.RESUME, K.FINISH):
        assert kinds[k] >= 1, (k, kinds)
    n_ids = plan["num_block_ids"]
    pubs = [e for e in evs if e["kind"] == K.PUBLICATION]
    # real page ids: every published unit is a page of the organization's pool(s)
    assert all(0 <= e["page"] < n_ids - 1 for e in pubs)
    rec = [e for e in pubs if e["state_kind"] == StateKind.RECURRENT]
    assert rec and all(e["depth"] % meta["recurrent_grid_tokens"] == 0 for e in rec)
    if org == "S2":  # conv line ids 4p + s of real slab pages
        slots = meta["units"]["slots_per_slab"]
        assert all(0 <= e["line"] and e["line"] // slots < n_ids - 1 for e in rec)
    adopted = [e["depth"] for e in evs if e["kind"] == K.ADOPTION]
    assert any(d > 0 for d in adopted)


@pytest.mark.parametrize("org", ORGS)
def test_lineage_sql_equals_replay_on_an_org_trace(runs: Runs, org: str) -> None:
    from lineage.report import analyse
    from lineage.source import open_run

    report = analyse(open_run(org_run(runs, org)["summary"]["trace_path"]))
    assert report.agreement.episodes > WORKLOAD["requests"]  # resumes are episodes too
    assert report.agreement.complete, report.agreement.disagreements


def test_skip_invalidate_trips_the_reuse_invariant(runs: Runs) -> None:
    """Negative control of the invariant checks (and of the equality above)."""
    run = org_run(runs, "S2", fault="skip-invalidate")
    s = run["summary"]
    assert s["fault"] == "skip-invalidate" and s["fault_count"] >= 1
    assert s["invariant_checks"].startswith("violated")
    assert "[invalidate before reuse]" in s["invariant_checks"]
    assert "unit shared page" in s["invariant_checks"] and "entry " in s["invariant_checks"]
    meta, _ = events(run)
    assert meta["fault"] == "skip-invalidate"
    assert run["summary"]["trace_verdict"]["accepted"]


@pytest.mark.slow
def test_skip_invalidate_changes_outputs(runs: Runs) -> None:
    """Without the checkers the fault either changes tokens or the organization's own
    accounting stops the run (a stale entry adopted on a page that is free again)."""
    run = org_run(runs, "S2", fault="skip-invalidate", check_invariants=False)
    s = run["summary"]
    assert s["fault_count"] >= 1
    if s["invariant_checks"].startswith("violated"):
        assert "page" in s["invariant_checks"]
        return
    ref = runs.get("vllm")["tokens"]
    assert sum(a != b for a, b in zip(run["tokens"], ref, strict=True)) >= 1


@pytest.mark.parametrize("org", ORGS)
def test_stale_checkpoint_changes_outputs_or_stops(runs: Runs, org: str) -> None:
    """An adopter's Mamba table holds a shallower checkpoint: tokens change, or the worker
    stops when that checkpoint's storage is released while the id is still in use."""
    run = org_run(runs, org, fault="stale-checkpoint", check_invariants=False)
    s = run["summary"]
    assert s["fault"] == "stale-checkpoint" and s["fault_count"] >= 1
    if s["invariant_checks"].startswith("violated"):
        assert "[live address]" in s["invariant_checks"], s["invariant_checks"]
        return
    assert changed(run, runs.get("vllm")) >= 1


def test_failed_admissions_never_adopt(runs: Runs) -> None:
    """Every ADOPTION follows a successful admission: per episode at most one, and no
    REJECTED allocation of a waiting episode is followed by a RELEASE before its adoption."""
    run = org_run(runs, "S2", **POLICY)
    s = run["summary"]
    assert s["completed"] == WORKLOAD["requests"] and s["policy"]["headroom"] == 0.05
    assert s["org_counters"]["admission_rejections"] >= 1
    _, evs = events(run)
    adoptions = Counter((e["request_id"], e["preemption_count"])
                        for e in evs if e["kind"] == K.ADOPTION)
    assert adoptions and max(adoptions.values()) == 1
    waiting: set[tuple[str, int]] = set()
    for e in evs:
        key = (e["request_id"], e["preemption_count"])
        if e["kind"] == K.WAITING_ENTRY:
            waiting.add(key)
        elif e["kind"] == K.ADOPTION:
            waiting.discard(key)
        elif e["kind"] == K.RELEASE and key in waiting:
            raise AssertionError(f"{key} released storage while waiting: adopt-and-release")
    assert run["tokens"] == runs.get("vllm")["tokens"]


def test_summary_and_results_record_the_organization(runs: Runs) -> None:
    run = org_run(runs, "S2")
    s = run["summary"]
    for key in ("organization", "budget_bytes", "fault", "invariant_checks", "policy"):
        assert key in s, key
    assert json.dumps(s)  # serialisable
    assert all(isinstance(t, list) and t for t in run["tokens"])


def test_pinning_and_retention_show_in_trace_and_summary(runs: Runs) -> None:
    run = org_run(runs, "S2", **POLICY)
    s = run["summary"]
    assert s["completed"] == WORKLOAD["requests"] and s["invariant_checks"] == "passed"
    assert s["policy"]["pin_k"] == 1 and s["policy"]["pin_budget"] == 4
    assert s["policy"]["retention"] is True
    meta, evs = events(run)
    assert meta["policy"]["pin_k"] == 1 and meta["policy"]["retention"] is True
    kinds = Counter(K(e["kind"]) for e in evs)
    assert kinds[K.PIN] >= 1 and kinds[K.RETENTION] >= 1, kinds
    pins = [e for e in evs if e["kind"] == K.PIN]
    assert all(e["need"] == 1 and e["page"] >= 0 for e in pins)  # K and a real page
    assert run["tokens"] == runs.get("vllm")["tokens"]


@pytest.mark.slow
def test_isolation_salts_every_chain(runs: Runs) -> None:
    """--isolate: no request adopts another request's prefix (only its own, on resume)."""
    run = org_run(runs, "S2", isolate=True)
    _, evs = events(run)
    initial = [e["depth"] for e in evs if e["kind"] == K.ADOPTION and e["preemption_count"] == 0]
    assert initial and all(d == 0 for d in initial)
    chains = [tuple(e["chain"]) for e in evs
              if e["kind"] == K.WAITING_ENTRY and e["preemption_count"] == 0]
    firsts = [c[0] for c in chains if c]
    assert len(set(firsts)) == len(firsts)  # shared prefixes, yet every first key differs


@pytest.mark.slow
def test_server_mode_serves_through_the_organization(runs: Runs) -> None:
    """`vllm serve` gets the scheduler seam and settings; its engine core runs S2."""
    import pyarrow.parquet as pq

    from hybridmem.engines.http_run import run_serving_http
    from hybridmem.engines.vllm_run import RunConfig

    out = runs.root / "http-S2"
    cfg = RunConfig(model=str(runs.model), out=out, trace_dir=out / "trace", org="S2",
                    budget=BUDGET, check_invariants=True, **WORKLOAD)  # type: ignore[arg-type]
    result = run_serving_http(cfg, progress=False)
    s = result.summary
    assert s["completed"] == WORKLOAD["requests"] and s["server_exit_code"] == 0
    assert s["organization"] == "S2" and s["invariant_checks"] == "passed"
    assert s["budget_bytes"] and s["trace_verdict"]["accepted"]
    meta, _ = events({"summary": s})
    assert meta["organization"] == "S2" and meta["driver"] == "http"
    tokens = pq.read_table(result.results_path).column("output_token_ids").to_pylist()
    assert tokens == runs.get("vllm")["tokens"]

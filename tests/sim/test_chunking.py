"""Prefill chunking as a stated condition: each named split cuts where it says, the aligned one
equals vLLM's own method at the scheduler's block, and a run records its split."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hybridmem.errors import HybridMemError
from hybridmem.sim import schedulers
from hybridmem.sim.schedulers import CHUNKINGS, aligned_split, chunk_split

BUDGET = 2048  # max_num_batched_tokens of the A100 preset


@pytest.mark.parametrize(("start", "n", "prompt", "align", "cut"), [
    (0, 2048, 3000, 512, 2048),      # ends on the grid already
    (0, 2048, 3000, 1792, 1792),     # aligned down to the interval
    (0, 1900, 3000, 512, 1536),      # budget left by decodes: down to the grid
    (0, 1700, 3000, 1792, 0),        # nothing aligned and A <= budget: wait for a bigger budget
    (1792, 1208, 3000, 512, 256),    # starts off the grid: stops at the next boundary
    (2048, 952, 3000, 512, 512),     # the prompt's tail: stops at the last boundary (2,560)
    (2560, 440, 3000, 512, 440),     # the tail itself runs to the prompt's end
    (0, 1000, 1000, 1568, 1000),     # a short prompt is one chunk
    (3000, 1, 3000, 512, 1),         # decode: untouched
])
def test_aligned_split_cuts_where_it_says(start: int, n: int, prompt: int, align: int,
                                          cut: int) -> None:
    assert aligned_split(start, n, prompt, prompt, align, BUDGET) == cut


def test_named_splits_resolve_their_alignment() -> None:
    # arm with a 16-token scheduler block and a 1,792-token checkpoint interval (native D0)
    got = {name: chunk_split(name, 16, 1792)["align_tokens"] for name in CHUNKINGS}
    assert got == {"interval": 1792, "block": 16, "grid512": 512, "budget": None}
    default = schedulers.DEFAULT_CHUNKING
    assert schedulers.resolve_chunking(schedulers.OrgChoice("S2", "b63")) == default
    with pytest.raises(HybridMemError, match="unknown chunking"):
        schedulers.resolve_chunking(schedulers.OrgChoice("S2", "b63", chunking="tiles"))
    with pytest.raises(HybridMemError, match="--org vllm"):
        schedulers.resolve_chunking(schedulers.OrgChoice("vllm", "b63", chunking="budget"))


def _request(computed: int, prompt: int, tokens: int) -> Any:
    return SimpleNamespace(num_computed_tokens=computed, num_prompt_tokens=prompt,
                           num_tokens=tokens, shared_prefix_boundary=0)


@pytest.mark.vllm
@pytest.mark.parametrize("org", ["vllm", "S2"])
def test_aligned_split_equals_vllms_method_at_the_block(org: str) -> None:
    """The mirror equals ``Scheduler._mamba_block_aligned_split`` on the simulator's scheduler
    (block 1,568 for vllm, 512 for S2) over starts, budgets and prompt lengths; the same cases
    at another alignment (negative control) differ."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from hybridmem.sim import vllm_env
    from hybridmem.sim.model_shape import load_shape

    shape = load_shape("falcon-h1-7b")
    vc = vllm_env.engine_config(shape, 63, 8192, BUDGET, 0)
    sched = schedulers.build(schedulers.OrgChoice(org, "b63"), vc, shape).scheduler
    try:
        block = sched.cache_config.block_size
        assert block == (1568 if org == "vllm" else 512)
        limit = sched.max_num_scheduled_tokens
        same = other = 0
        for prompt in (40, 511, 512, 513, 1568, 2000, 3137, 7000):
            for start in sorted({0, 16, 512, 1024, 1568, 1600, 3136, prompt - 1, prompt}):
                if start > prompt:
                    continue
                for n in (1, 100, 512, 1000, 1567, 1568, 2000, 2048):
                    n = min(n, max(prompt - start, 1))
                    ours = aligned_split(start, n, prompt, prompt, block, limit)
                    vllms = Scheduler._mamba_block_aligned_split(
                        sched, _request(start, prompt, prompt), n)
                    assert ours == vllms, (prompt, start, n)
                    same += 1
                    other += aligned_split(start, n, prompt, prompt, block + 16, limit) != vllms
        assert same > 300 and other > 10
    finally:
        sched.shutdown()


@pytest.mark.vllm
@pytest.mark.parametrize(("org", "chunking", "align", "vllms"), [
    ("S2", None, 512, True),         # default: the interval, which is S2's block
    ("S2", "grid512", 512, True),
    ("S2", "budget", None, False),
    ("vllm", "grid512", 512, False),
    ("vllm", "interval", 1568, True),
    ("D0", None, 1792, False),       # native D0: its interval, not its 16-token block
    ("D0", "block", 16, True),
])
def test_each_arm_gets_the_named_split(org: str, chunking: str | None, align: int | None,
                                       vllms: bool) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from hybridmem.sim import vllm_env
    from hybridmem.sim.model_shape import load_shape

    shape = load_shape("falcon-h1-7b")
    vc = vllm_env.engine_config(shape, 63, 8192, BUDGET, 0)
    built = schedulers.build(schedulers.OrgChoice(org, "b63", chunking=chunking), vc, shape)
    try:
        assert built.detail["chunking"] == {"name": chunking or schedulers.DEFAULT_CHUNKING,
                                            "align_tokens": align}
        method = type(built.scheduler)._mamba_block_aligned_split
        assert (method is Scheduler._mamba_block_aligned_split) is vllms
        req = _request(0, 3000, 3000)
        expect = {512: 1536, 1568: 1568, None: 1900, 1792: 1792, 16: 1888}[align]
        assert built.scheduler._mamba_block_aligned_split(req, 1900) == expect
    finally:
        built.scheduler.shutdown()


@pytest.mark.vllm
def test_the_split_is_recorded_in_summary_and_trace(tmp_path: Path) -> None:
    from hybridmem.engines.trace_sink import read_trace
    from hybridmem.sim.run import SimConfig, run_sim

    small = dict(requests=6, rate=4.0, max_model_len=2048, cap=4, budget="b12")
    s = run_sim(SimConfig(org="S2", out=tmp_path / "a", trace_dir=tmp_path / "a" / "t",
                          chunking="budget", **small)).summary  # type: ignore[arg-type]
    on_disk = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (on_disk["chunking"], on_disk["chunk_align_tokens"]) == ("budget", None)
    assert on_disk["admission_gate"] == "whole sequence"
    meta, _ = read_trace(s["trace_path"])
    assert meta["chunking"] == {"name": "budget", "align_tokens": None}
    d = run_sim(SimConfig(org="S2", out=tmp_path / "b", **small)).summary  # type: ignore[arg-type]
    assert (d["chunking"], d["chunk_align_tokens"]) == ("interval", 512)


@pytest.mark.vllm
def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hybridmem.cli.main import main

    base = ["sim", "--json", "--quiet", "--no-trace", "--requests", "6", "--cap", "4",
            "--budget", "b12", "--max-model-len", "2048"]
    assert main([*base, "--out", str(tmp_path / "v"), "--org", "vllm", "--chunking",
                 "budget"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--org vllm" in err
    out = tmp_path / "s"
    assert main([*base, "--out", str(out), "--org", "S2", "--chunking", "grid512",
                 "--admit-first-chunk"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["chunking"], printed["chunk_align_tokens"]) == ("grid512", 512)
    assert json.loads((out / "summary.json").read_text())["admission_gate"] == "first chunk"

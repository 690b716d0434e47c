"""benchmarks/bench_kernels.py: clean exit without CUDA, and its code paths on CPU.

The CPU run goes through the Triton interpreter with a one-shot timer: it checks that the
script builds valid pools and tables for the Falcon-H1-7B geometry and calls every kernel, not
any timing (a GPU is needed for those).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_kernels.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit path")
def test_exits_cleanly_without_cuda():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "no CUDA device present; nothing measured" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_batches_exit_2():
    r = subprocess.run([sys.executable, str(SCRIPT), "--batches", "1,0"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2 and "batch sizes must be >= 1, got [1, 0]" in r.stderr


def one_shot(fn, rep_ms: int) -> float:
    t = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t)


@pytest.fixture
def cpu_bench(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke run is for machines without CUDA")
    mod = load_bench()
    monkeypatch.setattr(mod, "DEV", "cpu")
    monkeypatch.setattr(mod, "bench_ms", one_shot)
    return mod


def test_conv_bench_runs_on_cpu(cpu_bench):
    row = cpu_bench.bench_conv(2, 1, torch.Generator().manual_seed(0))
    # 2 sequences x (2 x 3,584 x 3 state + 2 x 3,584 x/out) bf16 + 5 x 3,584 weights/bias
    assert row.bytes_moved == 2 * (2 * 3584 * 3 + 2 * 3584) * 2 + 5 * 3584 * 2
    assert row.t_paged_us > 0 and row.t_contig_us > 0


@pytest.mark.slow
def test_ssm_and_gather_bench_run_on_cpu(cpu_bench):
    gen = torch.Generator().manual_seed(0)
    row = cpu_bench.bench_ssm(1, torch.bfloat16, 1, gen)
    assert row.bytes_moved == 2 * 786_432 * 2 + (3 * 3072 + 24 + 2 * 256) * 2
    row = cpu_bench.bench_gather(1, torch.float32, 1, gen)
    assert row.bytes_moved == 2 * 786_432 * 4

"""GPU sweep: paged Mamba2 state update time by tile shape, Falcon-H1-7B geometry.

    PYTHONPATH=. python benchmarks/sweep_ssm_tiles.py [--batches 64,256] [--rep-ms 50]

For each state dtype (bf16, fp32) and batch it times ``paged_selective_state_update`` over
random member pages with every ``block_m`` x ``num_warps`` pair and prints time, bandwidth
(state read + write plus activations over time) and the ratio to the current default, so the
default tile (``default_block_m``) can be chosen from measurements. Exits 0 without CUDA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_kernels import SsmCase  # noqa: E402
from hybridmem.geometry import PRESETS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--rep-ms", type=int, default=50)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sweep_ssm_tiles: no CUDA device present; nothing measured")
        return 0
    import triton.testing

    from benchmarks.bench_kernels import ssm_call, ssm_case
    from hybridmem.kernels.paged_ssm_update.kernel import default_block_m, default_num_warps

    geo = PRESETS["falcon-h1-7b"]
    n = geo.d_state
    print(f"# {torch.cuda.get_device_name()}: heads {geo.mamba_heads}, head_dim "
          f"{geo.mamba_head_dim}, d_state {n}, groups {geo.n_groups}; default block_m "
          f"{default_block_m(n)}, {default_num_warps(n)} warps")
    print(f"{'state':>5} {'batch':>5} {'block_m':>7} {'warps':>5} {'us':>8} {'GB/s':>6} "
          f"{'vs_default':>10}")
    gen = torch.Generator().manual_seed(0)
    for state_dtype in (torch.bfloat16, torch.float32):
        tag = "bf16" if state_dtype == torch.bfloat16 else "fp32"
        for batch in (int(b) for b in args.batches.split(",")):
            case = ssm_case(batch, state_dtype, gen)

            def timed(bm: int | None, nw: int | None, case: SsmCase = case) -> float:
                fn = ssm_call(case, case.paged_pool, case.paged, block_m=bm, num_warps=nw)
                return float(triton.testing.do_bench(fn, rep=args.rep_ms))

            base = timed(None, None)
            moved = case.bytes_moved
            print(f"{tag:>5} {batch:>5} {'dflt':>7} {'dflt':>5} {1e3 * base:>8.1f} "
                  f"{moved / base / 1e6:>6.0f} {1.0:>10.3f}", flush=True)
            for bm in (1, 2, 4, 8, 16, 32):
                for nw in (1, 2, 4, 8):
                    if bm * n < 32 * nw:
                        continue  # fewer elements than threads
                    t = timed(bm, nw)
                    print(f"{tag:>5} {batch:>5} {bm:>7} {nw:>5} {1e3 * t:>8.1f} "
                          f"{moved / t / 1e6:>6.0f} {t / base:>10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

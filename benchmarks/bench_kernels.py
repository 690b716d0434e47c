"""GPU benchmark: paged vs contiguous state access for the three kernels, Falcon-H1-7B geometry.

    PYTHONPATH=. python benchmarks/bench_kernels.py [--batches 1,2,4,...,256]
        [--state-dtype bf16|fp32] [--peak-gbps 4800] [--rep-ms 100]

Per batch size and op it times the same Triton kernel twice:
  paged       state in member pages / slot lines at random real ids of a pool twice the size
  contiguous  the identity table over a dense pool (what a non-paged layout would read)
and prints time, effective bandwidth = bytes moved / time, the paged/contiguous time ratio and,
when the device's peak HBM bandwidth is known (or given), the fraction of it. Bytes moved count
every state byte read and written plus the activations, parameters and outputs.

Goals: bandwidth >= 80% of HBM peak at batch >= 64, paged <= 5% slower than contiguous.
With no CUDA device the script prints why and exits 0 without measuring anything.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybridmem.geometry import PRESETS  # noqa: E402
from hybridmem.units import derive_units  # noqa: E402

# Peak HBM bandwidth by device-name fragment, GB/s (vendor data sheets).
PEAK_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100 PCIe": 2000.0, "H100": 3350.0,
             "A100-SXM4-80GB": 2039.0, "A100 80GB": 1935.0, "A100": 1555.0, "L40S": 864.0}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Row(NamedTuple):
    op: str
    batch: int
    bytes_moved: int
    t_paged_us: float
    t_contig_us: float


Timer = Callable[[Callable[[], object], int], float]  # (fn, rep_ms) -> milliseconds


def do_bench_ms(fn: Callable[[], object], rep_ms: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms))


bench_ms: Timer = do_bench_ms  # replaced by a one-shot timer in the CPU smoke test
DEV = "cuda"  # the tests' CPU smoke run sets "cpu"


def shuffled_table(batch: int, width: int, pool_rows: int, gen: torch.Generator) -> torch.Tensor:
    ids = torch.randperm(pool_rows, generator=gen)[: batch * width]
    return ids.view(batch, width).to(torch.int32).to(DEV)


class SsmCase(NamedTuple):
    """One Falcon-H1-7B decode step's inputs over a pool twice the working set."""

    params: tuple[torch.Tensor, ...]  # x, dt, A, B, C, D, z, dt_bias
    out: torch.Tensor
    paged_pool: torch.Tensor
    paged: torch.Tensor  # random real member pages
    dense_pool: torch.Tensor
    ident: torch.Tensor  # identity table over the dense pool
    bytes_moved: int  # state read + written plus activations, parameters and outputs


def ssm_case(batch: int, state_dtype: torch.dtype, gen: torch.Generator) -> SsmCase:
    from hybridmem.kernels.paging import elems_per_page, num_members

    geo = PRESETS["falcon-h1-7b"]
    units = derive_units(geo)
    heads, dim, n, groups = geo.mamba_heads, geo.mamba_head_dim, geo.d_state, geo.n_groups
    epp = elems_per_page(units, state_dtype)
    width = num_members(heads * dim * n, epp)
    act = torch.bfloat16
    x = torch.randn(batch, heads, dim, device=DEV, dtype=act)
    dt = torch.randn(batch, heads, device=DEV, dtype=act)
    A = -torch.rand(heads, device=DEV)
    B = torch.randn(batch, groups, n, device=DEV, dtype=act)
    C = torch.randn(batch, groups, n, device=DEV, dtype=act)
    D = torch.randn(heads, device=DEV)
    z = torch.randn(batch, heads, dim, device=DEV, dtype=act)
    dt_bias = torch.randn(heads, device=DEV)
    paged_pool = torch.randn(2 * batch * width, epp, device=DEV).to(state_dtype)
    state_bytes = 2 * heads * dim * n * state_dtype.itemsize  # read + write
    act_bytes = (3 * heads * dim + heads + 2 * groups * n) * act.itemsize  # x, z, out, dt, B, C
    return SsmCase(
        params=(x, dt, A, B, C, D, z, dt_bias), out=torch.empty_like(x), paged_pool=paged_pool,
        paged=shuffled_table(batch, width, paged_pool.shape[0], gen),
        dense_pool=torch.randn(batch * width, epp, device=DEV).to(state_dtype),
        ident=torch.arange(batch * width, dtype=torch.int32, device=DEV).view(batch, width),
        bytes_moved=batch * (state_bytes + act_bytes))


def ssm_call(case: SsmCase, pool: torch.Tensor, table: torch.Tensor,
             **tuning: int | None) -> Callable[[], object]:
    """The timed call: one in-place decode step of ``case`` on ``pool`` through ``table``."""
    from hybridmem.kernels.paged_ssm_update import paged_selective_state_update

    x, dt, A, B, C, D, z, dt_bias = case.params
    return lambda: paged_selective_state_update(
        pool, table, None, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True, out=case.out,
        validate=False, **tuning)


def bench_ssm(batch: int, state_dtype: torch.dtype, rep_ms: int, gen: torch.Generator) -> Row:
    case = ssm_case(batch, state_dtype, gen)
    t_p = bench_ms(ssm_call(case, case.paged_pool, case.paged), rep_ms)
    t_c = bench_ms(ssm_call(case, case.dense_pool, case.ident), rep_ms)
    return Row("ssm_update", batch, case.bytes_moved, 1e3 * t_p, 1e3 * t_c)


def bench_conv(batch: int, rep_ms: int, gen: torch.Generator) -> Row:
    from hybridmem.kernels.conv_slot_update import conv_slot_update
    from hybridmem.kernels.paging import slab_lines, slot_elems

    geo = PRESETS["falcon-h1-7b"]
    units = derive_units(geo)
    dtype = torch.bfloat16
    conv_dim = geo.mamba_heads * geo.mamba_head_dim + 2 * geo.n_groups * geo.d_state
    k = geo.d_conv
    slot = slot_elems(units, dtype)
    slabs = -(-2 * batch // units.slots_per_slab)
    lines_pool = slab_lines(
        torch.randn(slabs, units.slots_per_slab * slot, device=DEV).to(dtype),
        units.slots_per_slab)
    lines = torch.randperm(lines_pool.shape[0], generator=gen)[:batch].to(torch.int32).to(DEV)
    dense = torch.randn(batch, conv_dim * (k - 1), device=DEV).to(dtype)
    ident = torch.arange(batch, dtype=torch.int32, device=DEV)
    x = torch.randn(batch, conv_dim, device=DEV, dtype=dtype)
    w = torch.randn(conv_dim, k, device=DEV, dtype=dtype)
    bias = torch.randn(conv_dim, device=DEV, dtype=dtype)
    out = torch.empty_like(x)

    def run(pool: torch.Tensor, table: torch.Tensor) -> Callable[[], object]:
        return lambda: conv_slot_update(pool, table, None, x, w, bias, out=out, validate=False)

    per_seq = (2 * conv_dim * (k - 1) + 2 * conv_dim) * dtype.itemsize
    moved = batch * per_seq + (k + 1) * conv_dim * dtype.itemsize
    t_p = bench_ms(run(lines_pool, lines), rep_ms)
    t_c = bench_ms(run(dense, ident), rep_ms)
    return Row("conv_update", batch, moved, 1e3 * t_p, 1e3 * t_c)


def bench_gather(batch: int, state_dtype: torch.dtype, rep_ms: int,
                 gen: torch.Generator) -> Row:
    from hybridmem.kernels.checkpoint_copy import gather_pages
    from hybridmem.kernels.paging import elems_per_page, num_members

    geo = PRESETS["falcon-h1-7b"]
    units = derive_units(geo)
    n_elems = geo.mamba_heads * geo.mamba_head_dim * geo.d_state
    epp = elems_per_page(units, state_dtype)
    width = num_members(n_elems, epp)
    pool = torch.randn(2 * batch * width, epp, device=DEV).to(state_dtype)
    table = shuffled_table(batch, width, pool.shape[0], gen)
    dense = torch.randn(batch * width, epp, device=DEV).to(state_dtype)
    ident = torch.arange(batch * width, dtype=torch.int32, device=DEV).view(batch, width)
    arena = torch.empty(batch, n_elems, device=DEV, dtype=state_dtype)

    def run(p: torch.Tensor, t: torch.Tensor) -> Callable[[], object]:
        return lambda: gather_pages(p, t, arena, validate=False)

    t_p = bench_ms(run(pool, table), rep_ms)
    t_c = bench_ms(run(dense, ident), rep_ms)
    return Row("gather_ckpt", batch, 2 * batch * n_elems * state_dtype.itemsize,
               1e3 * t_p, 1e3 * t_c)


def peak_for(name: str) -> float | None:
    for frag, gbps in PEAK_GBPS.items():
        if frag in name:
            return gbps
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256",
                    help="comma-separated batch sizes (default 1..256, powers of two)")
    ap.add_argument("--state-dtype", choices=sorted(DTYPES), default="bf16",
                    help="SSM state dtype (bf16: 3 members per checkpoint, fp32: 6)")
    ap.add_argument("--peak-gbps", type=float, default=None,
                    help="device HBM peak in GB/s (default: looked up from the device name)")
    ap.add_argument("--rep-ms", type=int, default=100, help="timing window per measurement")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        print(f"bench_kernels: --batches must be integers, got {args.batches!r}", file=sys.stderr)
        return 2
    if any(b < 1 for b in batches):
        print(f"bench_kernels: batch sizes must be >= 1, got {batches}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device present; nothing measured (this benchmark times "
              "Triton kernels on a GPU).", file=sys.stderr)
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("bench_kernels: TRITON_INTERPRET=1 is set; interpreter timings are meaningless, "
              "unset it.", file=sys.stderr)
        return 2

    name = torch.cuda.get_device_name()
    peak = args.peak_gbps or peak_for(name)
    state_dtype = DTYPES[args.state_dtype]
    gen = torch.Generator().manual_seed(0)
    print(f"# device: {name}; HBM peak: {f'{peak:.0f} GB/s' if peak else 'unknown'}; "
          f"Falcon-H1-7B, state {args.state_dtype}, activations bf16")
    print(f"{'op':<12} {'batch':>5} {'MB':>8} {'paged_us':>9} {'contig_us':>9} "
          f"{'paged/contig':>12} {'paged_GB/s':>10} {'contig_GB/s':>11} {'paged/peak':>10}")
    for batch in batches:
        rows = [bench_ssm(batch, state_dtype, args.rep_ms, gen),
                bench_conv(batch, args.rep_ms, gen),
                bench_gather(batch, state_dtype, args.rep_ms, gen)]
        for r in rows:
            bw_p = r.bytes_moved / r.t_paged_us / 1e3
            bw_c = r.bytes_moved / r.t_contig_us / 1e3
            frac = f"{bw_p / peak:10.3f}" if peak else f"{'n/a':>10}"
            print(f"{r.op:<12} {r.batch:>5} {r.bytes_moved / 1e6:>8.2f} {r.t_paged_us:>9.1f} "
                  f"{r.t_contig_us:>9.1f} {r.t_paged_us / r.t_contig_us:>12.3f} {bw_p:>10.0f} "
                  f"{bw_c:>11.0f} {frac}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# One GPU session for the kernels: the kernel tests (slow ones included) compiled for the device
# instead of the Triton interpreter, then the paged-vs-contiguous benchmark at both state dtypes.
#
#   bash benchmarks/gpu_check.sh [OUTDIR]     # default OUTDIR: ./gpu-check
#
# Runs with whatever python3 holds torch + triton on the machine (no vLLM needed: the vLLM
# cross-check tests skip themselves). Logs land in OUTDIR.
set -uo pipefail
out=${1:-gpu-check}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HYBRIDMEM_SLOW=1
unset TRITON_INTERPRET
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$out/env.txt"
rc=0
timeout 360 python3 -m pytest tests/kernels -q -p no:cacheprovider -rs 2>&1 | tee "$out/kernel_tests.log" || rc=1
for dt in bf16 fp32; do
  timeout 120 python3 benchmarks/bench_kernels.py --state-dtype "$dt" 2>&1 | tee "$out/bench_kernels_$dt.log" || rc=1
done
exit $rc

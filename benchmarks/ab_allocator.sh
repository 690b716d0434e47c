#!/bin/bash
# A/B of the organizations of two checkouts on one allocator mix, alternating runs:
#   benchmarks/ab_allocator.sh OLD_CHECKOUT NEW_CHECKOUT [RUNS] [extra bench_allocator args]
# Both runs use this checkout's benchmarks/bench_allocator.py under python -O (checks off); only
# PYTHONPATH (whose hybridmem is imported) differs. Each run prints its own within-run ratios
# against vLLM's BlockPool, so runs can be compared ratio to ratio.
set -euo pipefail
old=$1 new=$2 runs=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
bench=$(cd "$(dirname "$0")" && pwd)/bench_allocator.py
py=${PYTHON:-python}
export OMP_NUM_THREADS=1
for i in $(seq "$runs"); do
  for who in old new; do
    if [ "$who" = old ]; then src=$old; else src=$new; fi
    echo "== $who ($src) run $i"
    (cd /tmp && PYTHONPATH=$src "$py" -O "$bench" "$@" 2>/dev/null | grep -E "^(S0|S1|S2|D0|vLLM)")
  done
done

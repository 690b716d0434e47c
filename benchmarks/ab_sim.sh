#!/bin/bash
# A/B of simulated runs of two checkouts, alternating processes:
#   benchmarks/ab_sim.sh OLD_CHECKOUT NEW_CHECKOUT [ROUNDS] [extra bench_sim args]
# Each process imports once and runs every cell of the bench_sim arguments (default: S2 b63
# seed 42000, twice: the first run of a process also pays vLLM's lazy imports). Only PYTHONPATH
# (whose hybridmem is imported) differs; both use this checkout's benchmarks/bench_sim.py. Lines
# print wall and CPU seconds per run and a digest of its outcome: the same cell must print the
# same digest (and with --trace the same event digest) on both sides.
set -euo pipefail
old=$1 new=$2 rounds=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
[ $# -gt 0 ] || set -- --org S2 --runs 2
bench=$(cd "$(dirname "$0")" && pwd)/bench_sim.py
py=${PYTHON:-python}
export OMP_NUM_THREADS=1
for i in $(seq "$rounds"); do
  for who in old new; do
    if [ "$who" = old ]; then src=$old; else src=$new; fi
    echo "== $who ($src) round $i"
    (cd /tmp && PYTHONPATH=$src "$py" "$bench" "$@" 2>/dev/null | grep -E "^(imports|run)")
  done
done

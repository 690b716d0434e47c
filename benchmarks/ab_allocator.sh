#!/bin/bash
# A/B of the organizations of two checkouts on one allocator mix, alternating runs (ABBA order):
#   benchmarks/ab_allocator.sh OLD_CHECKOUT NEW_CHECKOUT [RUNS] [extra bench_allocator args]
# Both runs use this checkout's benchmarks/bench_allocator.py under python -O (checks off); only
# PYTHONPATH (whose hybridmem is imported) differs. Each run prints its own within-run ratios
# against vLLM's BlockPool, so runs can be compared ratio to ratio. CHECKS=on runs plain python
# (the organizations' assert invariant checks active) instead of python -O.
set -euo pipefail
old=$1 new=$2 runs=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
bench=$(cd "$(dirname "$0")" && pwd)/bench_allocator.py
py=${PYTHON:-python}
export OMP_NUM_THREADS=1
opt=-O
[ "${CHECKS:-off}" = on ] && opt=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for i in $(seq "$runs"); do
  order="old new"
  [ $((i % 2)) -eq 0 ] && order="new old"  # ABBA: each side runs first in every other pair
  for who in $order; do
    if [ "$who" = old ]; then src=$old; else src=$new; fi
    echo "== $who ($src) run $i" | tee -a "$log"
    (cd /tmp && PYTHONPATH=$src "$py" $opt "$bench" "$@" 2>/dev/null \
      | grep -E "^(S0|S1|S2|D0|vLLM)") | tee -a "$log"
  done
done
# medians over runs of each row's within-run ratios ("vs vLLM", "vs vLLM@grid")
"$py" - "$log" <<'PY'
import statistics, sys
got = {}
who = None
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith("=="):
        who = f[1]
    elif f and f[0] in ("S0", "S1", "S2", "D0") and len(f) >= 11:
        got.setdefault((f[0], who), []).append((float(f[-2]), float(f[-1])))
print("medians over runs (vs vLLM@512 / vs vLLM at the organization's own grid):")
for (org, who), rs in sorted(got.items()):
    print(f"  {org} {who:<4} {statistics.median(r[0] for r in rs):.2f} / "
          f"{statistics.median(r[1] for r in rs):.2f}   runs: "
          + " ".join(f"{r[0]:.2f}" for r in rs))
PY

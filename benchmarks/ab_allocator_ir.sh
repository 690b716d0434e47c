#!/bin/bash
# Deterministic A/B of the organizations of two checkouts: instructions executed (valgrind
# cachegrind, no cache simulation) by one allocator mix, minus the same process with no mix
# (imports, workload), checks off, PYTHONHASHSEED=0. Independent of the machine's load.
#   benchmarks/ab_allocator_ir.sh OLD_CHECKOUT NEW_CHECKOUT [ORGS (default "S0 S1 S2 D0")]
#                                 [REQUESTS (default 300)]
# Prints "ORG old_M new_M change" per organization (millions of instructions).
set -euo pipefail
old=$1 new=$2 orgs=${3:-"S0 S1 S2 D0"} requests=${4:-300}
command -v valgrind >/dev/null || { echo "valgrind not found: this A/B needs it" >&2; exit 2; }
py=${PYTHON:-python}
here=$(cd "$(dirname "$0")/.." && pwd)
driver=$(mktemp --suffix=.py)
trap 'rm -f "$driver"' EXIT
cat > "$driver" <<PY
import gc, sys
from benchmarks.bench_allocator import run_mix, workload
from hybridmem.events import NullObserver
from hybridmem.geometry import load_geometry
from hybridmem.units import derive_units
units = derive_units(load_geometry("falcon-h1-7b"))
prompts = workload($requests)
gc.collect()
for _ in range(int(sys.argv[2])):
    run_mix(sys.argv[1], units, "b63", prompts, NullObserver())
PY
ir() {  # checkout org runs -> instructions
  (cd /tmp && PYTHONHASHSEED=0 OMP_NUM_THREADS=1 PYTHONPATH=$1:$here valgrind --tool=cachegrind \
    --cache-sim=no --cachegrind-out-file=/dev/null "$py" -O "$driver" "$2" "$3" 2>&1 >/dev/null \
    | awk '/I *refs:/ {gsub(",", "", $NF); print $NF}')
}
for org in $orgs; do
  a=$(( $(ir "$old" "$org" 1) - $(ir "$old" "$org" 0) ))
  b=$(( $(ir "$new" "$org" 1) - $(ir "$new" "$org" 0) ))
  awk -v o="$org" -v a="$a" -v b="$b" \
    'BEGIN { printf "%s %.1f M -> %.1f M instructions (%+.1f%%)\n", o, a / 1e6, b / 1e6, 100 * (b - a) / a }'
done

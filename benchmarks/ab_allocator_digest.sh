#!/bin/bash
# A/B of the organizations' behaviour: the same operation sequences under two checkouts must give
# the same event and result digests (benchmarks/allocator_digest.py, this checkout's copy):
#   benchmarks/ab_allocator_digest.sh OLD_CHECKOUT NEW_CHECKOUT [extra allocator_digest args]
# Prints the two digest tables' diff and "IDENTICAL" (exit 0) or "DIFFERENT" (exit 1). Run with
# --fault appended to see the negative control: the NEW side gets the LRU fault injected.
set -euo pipefail
old=$1 new=$2
shift 2
fault=""
args=()
for a in "$@"; do
  if [ "$a" = "--fault" ]; then fault="--fault"; else args+=("$a"); fi
done
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
(cd /tmp && PYTHONPATH=$old "$py" "$here/allocator_digest.py" ${args[@]+"${args[@]}"}) > "$tmp/old"
(cd /tmp && PYTHONPATH=$new "$py" "$here/allocator_digest.py" ${args[@]+"${args[@]}"} $fault) > "$tmp/new"
if diff "$tmp/old" "$tmp/new"; then
  echo "IDENTICAL: $(wc -l < "$tmp/old") digests"
else
  echo "DIFFERENT"
  exit 1
fi

#!/usr/bin/env bash
# Trace probe effect (SPEC §6) on this machine: trace-ON / trace-OFF serving runs paired by seed,
# one process per run, the order alternating by seed (ON first for odd seeds), then
# `hybridmem fidelity` over all pairs with a plot.
#
#   benchmarks/fidelity_pairs.sh OUTROOT SEED [SEED...]
#   REQUESTS=300 RATE=100 SHARE=0.5 CAP=8 MODEL=tiny ORG=S2 benchmarks/fidelity_pairs.sh out/fid 1 2 3
#
# ORG is the serving path (default S2, `hybridmem run`'s default; the 2026-11-29 figures in
# benchmarks/RESULTS.md were measured on vLLM's own manager: ORG=vllm).
#
# Writes OUTROOT/{on,off}-SEED (each a `hybridmem run` directory), OUTROOT/fidelity.txt, .json
# and .png. Exit status: fidelity's (0 PASS, 1 FAIL, 2 unusable runs).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUTROOT SEED [SEED...]  (at least two seeds for an interval)" >&2
  exit 2
fi
root=$1; shift
cd "$(dirname "$0")/.."
hm=.venv/bin/hybridmem; [ -x "$hm" ] || hm=hybridmem
req=${REQUESTS:-300}; rate=${RATE:-100}; share=${SHARE:-0.5}; cap=${CAP:-8}; model=${MODEL:-tiny}; org=${ORG:-S2}
mkdir -p "$root"
total=$((2 * $#)); k=0
for s in "$@"; do
  case $s in ''|*[!0-9]*) echo "$0: seeds must be non-negative integers, got '$s'" >&2; exit 2;; esac
  if [ $((s % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
  for arm in $order; do
    k=$((k + 1)); out=$root/$arm-$s; rm -rf "$out"
    if [ "$arm" = on ]; then flag=(--trace "$out/trace"); else flag=(--no-trace); fi
    if ! "$hm" run --model "$model" --requests "$req" --rate "$rate" --share "$share" \
        --seed "$s" --cap "$cap" --org "$org" "${flag[@]}" --out "$out" --quiet > "$out.log" 2>&1; then
      echo "[$k/$total] seed $s $arm: run failed, see $out.log" >&2; exit 2
    fi
    echo "[$k/$total] seed $s $arm: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['throughput_tok_s']:.1f} tok/s\")" "$out/summary.json")"
  done
done
"$hm" fidelity --on "$root"/on-*/ --off "$root"/off-*/ --json > "$root/fidelity.json"
"$hm" fidelity --on "$root"/on-*/ --off "$root"/off-*/ --plot "$root/fidelity.png" | tee "$root/fidelity.txt"

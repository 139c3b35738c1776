#!/usr/bin/env bash
# Every CPU instruction-set level this machine runs gives the portable level's
# bits (core/cpu_features.hpp): the fixed-case hash program (bench/bits/
# same_bits.c: every algorithm x state format x normalisation x param dtype,
# and the 1-bit optimizers through every phase at 2 ranks) under each
# LOWBIT_CPU_KERNELS, compared line for line with LOWBIT_CPU_KERNELS=portable.
# A level the CPU cannot run is reported and left out (the library says so on
# stderr and runs another level).
#   check_levels_same_bits.sh SAME_BITS_BINARY [MPIEXEC]
set -euo pipefail
bin=$1 mpiexec=${2:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # run LEVEL MODE: the hashes into $out/LEVEL.MODE, the library's notes into $out/LEVEL.MODE.err
  local level=$1 mode=$2
  if [ "$mode" = onebit ]; then
    [ -n "$mpiexec" ] || return 0
    LOWBIT_CPU_KERNELS=$level "$mpiexec" -np 2 --oversubscribe -x LOWBIT_CPU_KERNELS "$bin" onebit \
      > "$out/$level.$mode" 2> "$out/$level.$mode.err"
  else
    LOWBIT_CPU_KERNELS=$level "$bin" fused > "$out/$level.$mode" 2> "$out/$level.$mode.err"
  fi
}
status=0
for mode in fused onebit; do
  run portable $mode
  [ -s "$out/portable.$mode" ] || { [ "$mode" = onebit ] && [ -z "$mpiexec" ] && continue; echo "portable $mode: no output"; cat "$out/portable.$mode.err"; exit 1; }
  for level in avx2 avx512 neon; do
    run $level $mode
    if grep -q "cannot run" "$out/$level.$mode.err"; then
      echo "$level: not run on this CPU"
      continue
    fi
    if cmp -s "$out/portable.$mode" "$out/$level.$mode"; then
      echo "$level $mode: $(wc -l < "$out/$level.$mode") cases, the portable level's bits"
    else
      echo "$level $mode: DIFFERENT bits from the portable level:"
      diff "$out/portable.$mode" "$out/$level.$mode" | head -20 || true
      status=1
    fi
  done
done
exit $status

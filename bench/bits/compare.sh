#!/usr/bin/env bash
# Same bits before and after a change: runs bench_same_bits (built in BUILD)
# against two liblowbit builds and diffs the hashes; with the emulated CUDA
# binary also against the CPU hashes of the new build.
#   bash bench/bits/compare.sh OLD_LIB_DIR NEW_BUILD_DIR [OUT_DIR]
# OLD_LIB_DIR holds the liblowbit.so* of the reference build (copy it aside
# before the change). Exits non-zero on any difference.
set -euo pipefail
old=$1 new=$2 out=${3:-$(mktemp -d)}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=$new/bench/bench_same_bits
status=0
run() {  # run NAME LIBDIR ARGS...
  local name=$1 lib=$2; shift 2
  LD_LIBRARY_PATH=$lib "$@" > "$out/$name.txt"
}
for lib in old new; do
  dir=$old; [ $lib = new ] && dir=$new
  run fused_$lib "$dir" "$bin" fused
  for np in 2 3; do run onebit${np}_$lib "$dir" mpirun -np $np -x LD_LIBRARY_PATH "$bin" onebit; done
done
for t in fused onebit2 onebit3; do
  if diff -q "$out/${t}_old.txt" "$out/${t}_new.txt" >/dev/null; then
    echo "$t: $(wc -l < "$out/${t}_new.txt") cases, same bits"
  else
    echo "$t: DIFFERENT bits:"; diff "$out/${t}_old.txt" "$out/${t}_new.txt" | head -20 || true; status=1
  fi
done
emu=$new/bench/bench_same_bits_emulated
if [ -x "$emu" ]; then
  "$emu" fused cuda > "$out/fused_emu.txt"
  mpirun -np 2 "$emu" onebit cuda > "$out/onebit2_emu.txt"
  for t in fused onebit2; do
    if diff -q <(awk '{print $NF}' "$out/${t}_new.txt") <(awk '{print $NF}' "$out/${t}_emu.txt") >/dev/null; then
      echo "$t: emulated CUDA = CPU"
    else
      echo "$t: emulated CUDA DIFFERS from the CPU"; status=1
    fi
  done
fi
exit $status

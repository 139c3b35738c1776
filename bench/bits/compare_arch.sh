#!/usr/bin/env bash
# The same bits on two architectures: `same_bits fused` of a cross build (run
# under its emulator, e.g. qemu-aarch64-static -cpu max) against the same
# program built here with the host's C compiler against an x86-64 build's
# liblowbit, line for line. CTest bench.same_bits_x86 of the aarch64 build
# (scripts/test_arm.sh) runs it. Exits non-zero on any difference.
#   bash bench/bits/compare_arch.sh X86_BUILD_DIR CROSS_SAME_BITS [EMULATOR [ARGS...]]
set -euo pipefail
x86=$(cd "$1" && pwd) cross=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -f "$x86/liblowbit.so" ] || { echo "compare_arch: no liblowbit.so in $x86 (build it first)"; exit 1; }
cc -O2 -DLOWBIT_SAME_BITS_NO_MPI -I"$here/../../capi" -I"$x86/include" "$here/same_bits.c" \
  -L"$x86" -llowbit -Wl,-rpath,"$x86" -o "$tmp/same_bits_x86"
"$tmp/same_bits_x86" fused > "$tmp/x86.txt"
"$@" "$cross" fused > "$tmp/cross.txt"
cases=$(wc -l < "$tmp/x86.txt")
if [ "$cases" -eq 0 ]; then
  echo "compare_arch: the x86-64 run printed nothing"
  exit 1
fi
if cmp -s "$tmp/x86.txt" "$tmp/cross.txt"; then
  echo "same_bits fused: $cases cases, the same bits on x86-64 ($x86) and under '$* $cross'"
  exit 0
fi
echo "same_bits fused: DIFFERENT bits ($(diff "$tmp/x86.txt" "$tmp/cross.txt" | grep -c '^<') of $cases cases; < x86-64, > cross):"
diff "$tmp/x86.txt" "$tmp/cross.txt" | head -40 || true
exit 1

#!/usr/bin/env bash
# Instructions executed per 256-element tile by each codec function, the
# portable loops and the NEON forms, both compiled for aarch64 (the aarch64
# build of scripts/test_arm.sh, bench/arm/codec_insns.cpp), counted under
# qemu-user: one instruction per translation block (-singlestep) and exec
# logging write one line per executed instruction; -dfilter keeps the lines of
# the codec's code only (codec.cpp, codec_avx512*.cpp, codec_neon.cpp,
# qmap_wide, the harness's case bodies; the link map and nm give their
# addresses). A case run 9 times minus the case run once, over 8, minus the
# harness's own per-call instructions (case "none"). No speed is measured:
# emulation says nothing about an Arm core's timing.
#   bash bench/arm/count_insns.sh [ARM_BUILD_DIR [QEMU]]     (default build-arm)
set -euo pipefail
build=${1:-build-arm}
qemu=${2:-$(command -v qemu-aarch64-static || command -v qemu-aarch64)}
bin=$build/bench/bench_codec_insns
map=$bin.map
[ -x "$bin" ] && [ -f "$map" ] || { echo "count_insns: no $bin or $map (build the aarch64 tree with LOWBIT_BUILD_BENCH=ON)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# .text of the codec objects and of the harness (not its .text.startup: main's
# setup), as START+LENGTH.
ranges=$(awk '
  /^ \.text/ {
    name = $1
    if (NF >= 4) { addr = $2; len = $3; obj = $4 } else { getline; addr = $1; len = $2; obj = $3 }
    if ((obj ~ /\((codec|codec_avx512|codec_avx512_sr|codec_neon)\.cpp\.o\)$/ || (obj ~ /codec_insns\.cpp\.o$/ && name == ".text")) &&
        len !~ /^0x0+$/) printf "%s+%s,", addr, len
  }' "$map")
ranges+=$(aarch64-linux-gnu-nm -S -C "$bin" 2>/dev/null | awk '/ T lowbit::qmap_wide\(/ { printf "0x%s+0x%s", $1, $2 }')
[ -n "$ranges" ] || { echo "count_insns: no codec sections in $map" >&2; exit 1; }

count() {  # count CASE REPS: the logged instructions of the whole run
  "$qemu" -cpu max -singlestep -d exec,nochain -dfilter "${ranges%,}" -D "$tmp/log" "$bin" "$1" "$2" >/dev/null
  grep -c '^Trace' "$tmp/log" || true
}
per_call() { echo $((($(count "$1" 9) - $(count "$1" 1)) / 8)); }
overhead=$(per_call none)
for c in $("$qemu" -cpu max "$bin" list); do
  [ "$c" = none ] && continue
  echo "$c $(($(per_call "$c") - overhead))"
done > "$tmp/counts"
echo "instructions per call, harness overhead ($overhead per call) subtracted; ranges ${ranges%,}"
# One row per function: portable, NEON, and their ratio.
echo "| function (one 256-element tile) | portable | NEON | portable / NEON |"
echo "|---|---:|---:|---:|"
awk '{ split($1, p, "[.]"); key = p[2] " " p[3] " " p[4]; n[key, p[1]] = $2; if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
     END { for (i = 1; i <= k; ++i) { key = order[i]; a = n[key, "portable"]; b = n[key, "neon"];
           printf "| %s | %d | %d | %.1f |\n", key, a, b, (b > 0 ? a / b : 0) } }' "$tmp/counts"

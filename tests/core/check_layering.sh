#!/usr/bin/env bash
# The layers of docs/ARCHITECTURE.md point down only:
#   capi -> distributed -> core, comm;  capi -> muon -> core;  capi -> trust -> core;
#   cuda implements core's engine;
#   core knows nothing of comm, distributed, muon, trust, cuda or the C boundary;
#   comm names no optimizer algorithm and knows nothing of distributed or capi;
#   cuda knows nothing of comm, distributed or capi;
#   distributed, muon and trust know nothing of capi or of each other;
#   bindings/ includes the public headers only.
# Checked on the sources (#include lines; comm's code for optimizer names)
# and on the built objects (no undefined symbol of a lower layer's objects
# is defined by a higher one's).
# Usage: check_layering.sh <source dir> <liblowbit_core.a> <dir of liblowbit's objects (CMakeFiles/lowbit.dir)>
set -euo pipefail
src=$1 core_lib=$2 objs=$3
status=0

# includes FOLDER FORBIDDEN_REGEX WHY: every #include of FOLDER's sources that
# names a forbidden path.
includes() {
  local folder=$1 forbidden=$2 why=$3 bad
  bad=$(grep -nE '^\s*#\s*include\s*[<"]' "$src/$folder"/*.cpp "$src/$folder"/*.hpp "$src/$folder"/*.cu* 2>/dev/null |
    grep -E "$forbidden" || true)
  if [ -n "$bad" ]; then
    echo "$folder/ $why:"
    echo "$bad" | sed "s|$src/||"
    status=1
  fi
}
# capi/ headers other than the public ones (and the generated version header).
capi_private='capi/|"(boundary|comm_handle|struct_abi)\.hpp"'
includes core "comm/|distributed/|muon/|trust/|cuda/|$capi_private" "includes comm/, distributed/, muon/, trust/, cuda/ or capi/ internals"
includes cuda "comm/|distributed/|muon/|trust/|$capi_private" "includes comm/, distributed/, muon/, trust/ or capi/ internals"
includes comm "distributed/|core/optimizer|core/engine|core/pass|$capi_private" \
  "includes distributed/, core's optimizer or engine, or capi/ internals"
includes distributed "muon/|trust/|$capi_private" "includes muon/, trust/ or capi/ internals"
includes muon "comm/|distributed/|trust/|$capi_private" "includes comm/, distributed/, trust/ or capi/ internals"
includes trust "comm/|distributed/|muon/|$capi_private" "includes comm/, distributed/, muon/ or capi/ internals"

# bindings/ (the JAX handlers, the Rust crate, any other caller) uses the
# public headers only: what another framework's custom call could do.
bad=$(grep -rnE '^\s*#\s*include\s*[<"]' "$src/bindings" --include='*.cpp' --include='*.hpp' --include='*.h' \
  --include='*.c' --include='*.cc' 2>/dev/null | grep -vE '/lowbit_cdef\.h:' |
  grep -E '[<"](\.\./)*(core|cuda|comm|distributed|muon|trust)/|"(boundary|comm_handle|struct_abi)\.hpp"' || true)
if [ -n "$bad" ]; then
  echo "bindings/ includes library internals (core/, cuda/, comm/, distributed/ or capi/'s private headers):"
  echo "$bad" | sed "s|$src/||"
  status=1
fi

# comm/ names no optimizer algorithm (code and strings; comments aside).
named=$(for f in "$src"/comm/*.cpp "$src"/comm/*.hpp "$src"/comm/*.cu*; do
  sed -E 's|//.*$||' "$f" | grep -nE 'Adam|LAMB|Lamb|Lion|SGD|LOWBIT_ALGORITHM_|freeze_step' | sed "s|^|${f#$src/}:|"
done || true)
if [ -n "$named" ]; then
  echo "comm/ names an optimizer algorithm:"
  echo "$named"
  status=1
fi

# Objects: a layer's undefined symbols that a higher layer defines.
defined() { nm --defined-only -g "$@" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TWVB]/ {print $3}' | sort -u; }
undefined() { nm -u "$@" 2>/dev/null | awk '{print $NF}' | sort -u; }
calls_up() {  # calls_up NAME LOWER_SYMBOLS HIGHER_DIR...
  local name=$1 lower=$2; shift 2
  local higher=""
  for d in "$@"; do higher+=$(defined "$objs/$d"/*.o); higher+=$'\n'; done
  local up
  up=$(comm -12 <(echo "$lower" | sed '/^$/d') <(echo "$higher" | sed '/^$/d' | sort -u))
  if [ -n "$up" ]; then
    echo "$name calls functions of a higher layer:"
    echo "$up" | c++filt
    status=1
  fi
}
core_undefined=$(undefined "$core_lib")
calls_up "core/" "$core_undefined" capi comm distributed muon trust
calls_up "comm/" "$(undefined "$objs"/comm/*.o)" capi distributed
calls_up "distributed/" "$(undefined "$objs"/distributed/*.o)" capi muon trust
calls_up "muon/" "$(undefined "$objs"/muon/*.o)" capi distributed comm trust
calls_up "trust/" "$(undefined "$objs"/trust/*.o)" capi distributed comm muon

if [ "$status" -eq 0 ]; then
  echo "layers point down: core, cuda, comm, distributed, muon and trust include and call nothing above them, comm names no optimizer, bindings/ includes the public headers only"
fi
exit "$status"

#!/usr/bin/env bash
# core/ stays below the C boundary: it includes no header of capi/ other than
# the public lowbit.h / lowbit_comm.h (and the generated lowbit_version.h),
# and calls no function defined in capi/*.cpp.
# Usage: check_layering.sh <source dir> <liblowbit_core.a> <dir of the capi objects of liblowbit>
set -euo pipefail
src=$1 core_lib=$2 capi_objs=$3
status=0

bad_includes=$(grep -nE '^\s*#\s*include\s*[<"]' "$src"/core/*.cpp "$src"/core/*.hpp |
  grep -E 'capi/|"(boundary|comm_handle)\.hpp"' || true)
if [ -n "$bad_includes" ]; then
  echo "core/ includes headers of capi/ other than lowbit.h / lowbit_comm.h:"
  echo "$bad_includes"
  status=1
fi

defined=$(nm --defined-only -g "$capi_objs"/*.o | awk 'NF == 3 && $2 ~ /[TW]/ {print $3}' | sort -u)
undefined=$(nm -u "$core_lib" | awk '{print $NF}' | sort -u)
calls=$(comm -12 <(echo "$defined") <(echo "$undefined"))
if [ -n "$calls" ]; then
  echo "core/ calls functions defined in capi/*.cpp:"
  echo "$calls" | c++filt
  status=1
fi
[ "$status" -eq 0 ] && echo "core/: no capi/ header but the public ones, no call into capi/*.cpp ($(echo "$defined" | wc -l) capi symbols checked)"
exit "$status"

#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a
# consumer through find_package(lowbit) and through pkg-config.
# Usage: check_install.sh <build dir> <source dir of this test>
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
cmake -S "$src" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
cmake --build "$tmp/cmake" > /dev/null
"$tmp/cmake/consumer"
libdir=$(dirname "$(find "$tmp/prefix" -name lowbit.pc)")
flags=$(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs lowbit)
cc "$src/consumer.c" $flags -o "$tmp/pc_consumer"
LD_LIBRARY_PATH="$tmp/prefix/lib:$tmp/prefix/lib64" "$tmp/pc_consumer"
echo "install, find_package(lowbit) and pkg-config: ok"

# The declarations for the Python package (built when the build had Python)
# are installed in share/lowbit, where the package finds them for
# LOWBIT_LIBRARY=<prefix>/<libdir>/liblowbit.so.
if [ -f "$build/lowbit_cdef.h" ]; then
  cdef="$tmp/prefix/share/lowbit/lowbit_cdef.h"
  cmp -s "$build/lowbit_cdef.h" "$cdef" || { echo "check_install: $cdef is missing or differs from the build's"; exit 1; }
  bindings=$(cd "$src/../../bindings" && pwd)
  if python3 -c "import cffi, numpy" 2>/dev/null; then
    lib=$(find "$tmp/prefix" -name liblowbit.so | head -1)
    report=$(cd "$tmp" && LOWBIT_LIBRARY="$lib" PYTHONPATH="$bindings" python3 -m lowbit)
    grep -q "^declarations: *$cdef " <<<"$report" || { echo "check_install: python -m lowbit did not use $cdef:"; echo "$report"; exit 1; }
    echo "installed lowbit_cdef.h used by the Python package: ok"
  fi
fi

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

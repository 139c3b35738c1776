#!/usr/bin/env bash
# Runs the GPU suites that go through the C API (test_cuda_vs_cpu,
# test_cuda_graph_capi) on the host emulation, without a GPU: builds the
# library's C++ sources with the emulated kernels and runtime into one
# executable per suite. Not part of CTest (the full vs_cpu sweep takes about
# two minutes emulated); run it after changing the engine, the kernels or the
# suites, before spending GPU time:
#   bash tests/cuda/emu/run_capi_suites.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
out="${1:-$root/build-cuda-emu}"
cuda_inc="${CUDA_INCLUDE:-/usr/local/cuda/include}"
mkdir -p "$out/obj"
flags=(-std=c++17 -O2 -ffp-contract=off -fopenmp -Wno-unknown-pragmas -DLOWBIT_CUDA_ENGINE -I"$root" -I"$root/capi" -I"$cuda_inc")
srcs=("$root"/core/*.cpp "$root"/comm/*.cpp "$root"/capi/*.cpp "$root/cuda/cuda_engine.cpp" "$root"/tests/cuda/emu/*.cpp)
objs=()
cmds=()
for s in "${srcs[@]}"; do
  o="$out/obj/$(echo "${s#$root/}" | tr / _).o"
  objs+=("$o")
  cmds+=("g++ ${flags[*]} -c $s -o $o")
done
printf '%s\n' "${cmds[@]}" | xargs -P "$(nproc)" -I{} sh -c "{}"
for t in test_cuda_vs_cpu test_cuda_graph_capi; do
  gcc -std=c11 -O2 -I"$root/capi" -I"$root/tests/cuda" -I"$cuda_inc" -c "$root/tests/cuda/$t.c" -o "$out/$t.o"
  g++ -fopenmp "$out/$t.o" "${objs[@]}" -lcmocka -lm -o "$out/${t}_emulated"
  echo "== $t (emulated)"
  "$out/${t}_emulated"
done

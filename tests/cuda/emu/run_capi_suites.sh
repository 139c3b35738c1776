#!/usr/bin/env bash
# Runs the GPU suites that go through the C API (test_cuda_vs_cpu,
# test_cuda_graph_capi) on the host emulation, without a GPU: configures a
# CMake build (or reuses one) and builds their emulated executables, which
# link lowbit_emulated (the whole library on the emulation, see
# tests/cuda/CMakeLists.txt). Not part of CTest (the full vs_cpu sweep takes
# about two minutes emulated); run it after changing the engine, the kernels
# or the suites, before spending GPU time:
#   bash tests/cuda/emu/run_capi_suites.sh [build-dir]
# Extra CMake arguments: LOWBIT_EMU_CMAKE_ARGS="-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined ..."
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
out="${1:-$root/build-cuda-emu}"
if [ ! -f "$out/CMakeCache.txt" ]; then
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=Release -DLOWBIT_BUILD_BENCH=OFF -DLOWBIT_BUILD_EXAMPLES=OFF \
    ${LOWBIT_EMU_CMAKE_ARGS:-}
fi
cmake --build "$out" -j "$(nproc)" --target test_cuda_vs_cpu_emulated test_cuda_graph_capi_emulated
for t in test_cuda_vs_cpu test_cuda_graph_capi; do
  echo "== $t (emulated)"
  "$out/tests/cuda/${t}_emulated"
done

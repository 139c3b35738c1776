#!/usr/bin/env bash
# Runs the Python suite against liblowbit built with AddressSanitizer.
#
#   bash scripts/test_asan.sh                      # tests/python
#   bash scripts/test_asan.sh tests/python/test_copy.py -k deepcopy   # any pytest arguments
#   bash scripts/test_asan.sh tests/python/test_handles.py   # the Python handles' repros (issue 32:
#        a torch tensor whose storage moved after registration, threads sharing a handle, ...)
#   bash scripts/test_asan.sh tests/python/test_torch_in_backward.py -k moved   # issue 45 (1): params
#        whose storage moved, refused by step_in_backward, opt.step, the compile op and CPUOffload
#        (CTest python.asan_moved_storage, labelled exhaustive, runs it)
#
# The library is built into build-asan (LOWBIT_ASAN_BUILD_DIR) with
# -fsanitize=address, CPU only (no CUDA, no JAX handlers: the sanitizer
# runtime and the CUDA driver do not mix), and the ASan runtime is preloaded
# into the (uninstrumented) Python interpreter. Leak detection is off: the
# interpreter and its extension modules keep memory until exit by design, so
# only memory errors (out-of-bounds, use-after-free, double free) are reported;
# the first one aborts the run with its stack (in the log_path files named
# below, since pytest captures the tests' stderr). The mpirun tests run their
# ranks under the same preload.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${LOWBIT_ASAN_BUILD_DIR:-build-asan}
flags="-fsanitize=address -fno-omit-frame-pointer"
mkdir -p "$build"
build=$(cd "$build" && pwd)  # relative to the checkout, or absolute (CTest: under its build directory)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOWBIT_WITH_CUDA=OFF -DLOWBIT_WITH_JAX=OFF \
  -DLOWBIT_BUILD_TESTS=OFF -DLOWBIT_BUILD_BENCH=OFF -DLOWBIT_BUILD_EXAMPLES=OFF \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
  "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address" > "$build/configure.log" \
  || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target lowbit

cxx=$(grep -E '^CMAKE_CXX_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)
asan=$("${cxx:-g++}" -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "test_asan: the ASan runtime was not found ($asan)"; exit 1; }

# libstdc++ is preloaded with the runtime: ASan intercepts __cxa_throw, and
# finds the real one only if libstdc++ is loaded when it starts (else the first
# C++ exception inside liblowbit, e.g. any error status, aborts with
# "CHECK failed: ... real___cxa_throw").
stdcxx=$("${cxx:-g++}" -print-file-name=libstdc++.so.6)
export LD_PRELOAD="$asan:$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}"
logs="$build/asan-logs"
rm -rf "$logs" && mkdir -p "$logs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:print_summary=1:strict_string_checks=1:detect_stack_use_after_return=1:log_path=$logs/asan}
export LOWBIT_LIBRARY="$build/liblowbit.so"
export OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if [ $# -eq 0 ]; then
  set -- tests/python
fi
status=0
python3 -m pytest -q -p no:cacheprovider "$@" || status=$?
if compgen -G "$logs/asan.*" > /dev/null; then
  echo "test_asan: AddressSanitizer reports (in $logs):"
  cat "$logs"/asan.*
  [ "$status" -ne 0 ] || status=1
else
  echo "test_asan: no AddressSanitizer report"
fi
exit "$status"

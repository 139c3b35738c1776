#!/usr/bin/env bash
# The README's test command. Sets up a fresh machine (scripts/setup.sh), builds
# lowbit and runs its tests: the cmocka suites and the mpirun communicator tests
# (CTest), and pytest (tests/python, tests/jax).
#
#   bash scripts/test.sh          the fast set: every suite, every module and every
#                                 component, without the tests labelled exhaustive
#                                 (ctest -LE exhaustive; pytest -m "not exhaustive")
#   bash scripts/test.sh --all    everything, the exhaustive tests included, and the
#                                 benchmarks built too (what .ci/run runs);
#                                 LOWBIT_TEST_ALL=1 does the same
#
# Then the aarch64 build under qemu-user with the same selection
# (scripts/test_arm.sh: cross compilers and qemu from Debian, the C suites, the
# NEON codec, the same bits as this build); LOWBIT_TEST_ARM=0 leaves it out.
#
# Exhaustive: the sweeps (every float through the AVX-512 codecs, the full
# CUDA-vs-CPU comparison on the emulation, split by algorithm), the 3- and 4-rank
# variants of the MPI and torchrun tests, and the torchrun training comparisons.
#
# CTest and pytest run at the same time (pytest keeps about one core busy, CTest
# fills the others); pytest reports as it goes, CTest's log (BUILD/ctest.log)
# is printed when both are done. The exit status is non-zero if either failed.
# Environment: LOWBIT_BUILD_DIR (default build), LOWBIT_TEST_SEED (README,
# "Testing"), CI (a missing test framework fails instead of skipping),
# LOWBIT_TEST_ARM (0: no aarch64 run), LOWBIT_ARM_BUILD_DIR (default build-arm).
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
case "${LOWBIT_TEST_ALL:-0}" in 0 | "" | false | no) ;; *) all=1 ;; esac
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (--all, --help)" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Tests step tiny models back to back: idle OpenMP workers should sleep, not spin.
export OMP_WAIT_POLICY=PASSIVE

build=${LOWBIT_BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$all" = 1 ]; then
  what="everything (--all)"
  bench=ON
  ctest_select=()
  pytest_select=()
else
  what="the fast set (--all: the exhaustive tests too)"
  bench=OFF  # no test runs the benchmarks
  ctest_select=(-LE exhaustive)
  pytest_select=(-m "not exhaustive")
fi
echo "scripts/test.sh: $what; build directory $build"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOWBIT_BUILD_BENCH=$bench
cmake --build "$build" -j"$jobs"

# CTest in the background, in its own session (so that an interrupted run stops
# its tests too), pytest in the foreground.
ctest_log="$build/ctest.log"
setsid -w ctest --test-dir "$build" --output-on-failure -j"$jobs" ${ctest_select[@]+"${ctest_select[@]}"} \
  >"$ctest_log" 2>&1 &
ctest_pid=$!
stop_ctest() { kill -TERM -- "-$ctest_pid" 2>/dev/null || true; }
trap 'stop_ctest; exit 130' INT
trap 'stop_ctest; exit 143' TERM
echo "scripts/test.sh: CTest runs in the background (log: $ctest_log); pytest:"

pytest_rc=0
LOWBIT_LIBRARY="$(cd "$build" && pwd)/liblowbit.so" python3 -m pytest -q tests/python tests/jax \
  ${pytest_select[@]+"${pytest_select[@]}"} ||
  pytest_rc=$?
ctest_rc=0
wait "$ctest_pid" || ctest_rc=$?
trap - INT TERM

echo
echo "==================================== CTest ($ctest_log)"
cat "$ctest_log"

# The aarch64 build under qemu-user, checked against this build's bits.
arm_rc=0 arm_status="left out (LOWBIT_TEST_ARM=0)"
case "${LOWBIT_TEST_ARM:-1}" in
  0 | false | no) ;;
  *)
    echo
    echo "==================================== aarch64 under qemu-user (scripts/test_arm.sh)"
    arm_args=(--x86-build "$build")
    [ "$all" = 1 ] && arm_args+=(--all)
    bash scripts/test_arm.sh "${arm_args[@]}" || arm_rc=$?
    arm_status=$([ $arm_rc = 0 ] && echo passed || echo "FAILED (rc $arm_rc)")
    if [ $arm_rc = 77 ]; then arm_rc=0 arm_status="skipped (no cross tools; CI=true fails instead)"; fi
    ;;
esac
echo "scripts/test.sh: $what: CTest $([ $ctest_rc = 0 ] && echo passed || echo "FAILED (rc $ctest_rc)"), pytest $([ $pytest_rc = 0 ] && echo passed || echo "FAILED (rc $pytest_rc)"), aarch64 $arm_status"
[ "$ctest_rc" = 0 ] && [ "$pytest_rc" = 0 ] && [ "$arm_rc" = 0 ]

#!/usr/bin/env bash
# The Arm (AArch64) build of lowbit and its C suites under qemu-user, on an
# x86-64 Debian machine: installs Debian's cross compilers, qemu-user-static
# and the arm64 packages the suites link (multiarch), cross-configures with
# cmake/toolchain-aarch64-linux-gnu.cmake (no CUDA, MPI, JAX or Rust: see
# below), builds liblowbit, the cmocka suites and the same-bits program, and
# runs them through CTest, every test command under `qemu-aarch64-static -cpu
# max` (NEON, and SVE where code has it).
#
#   bash scripts/test_arm.sh [--all] [--x86-build DIR]
#
#   (default)          the fast set: ctest -LE exhaustive
#   --all              everything, the exhaustive tests too (the NEON codec's
#                      every-float sweeps); LOWBIT_TEST_ALL=1 does the same
#   --x86-build DIR    an x86-64 build of this tree (scripts/test.sh passes its
#                      own): CTest bench.same_bits_x86 then checks that
#                      `same_bits fused` prints the same lines on both
#
# scripts/test.sh runs it after its own tests. Not built here: CUDA (no arm64
# toolkit), MPI (Debian's arm64 OpenMPI would replace the host's: the two
# cannot be installed side by side), the JAX handlers and the Rust crate (the
# host's jax and cargo build for the host); examples.train_softmax is left out
# (a demo: about 3 minutes of float work under emulation, passes when run by
# hand; the suites cover what it calls). Environment: LOWBIT_ARM_BUILD_DIR (default build-arm), CI (a
# tool that cannot be installed fails instead of skipping: exit 1; elsewhere
# the skip exits 77), LOWBIT_TEST_SEED.
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
x86_build=""
case "${LOWBIT_TEST_ALL:-0}" in 0 | "" | false | no) ;; *) all=1 ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    --all) all=1 ;;
    --x86-build) x86_build=${2:?--x86-build needs a directory}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/test_arm.sh: unknown argument '$1' (--all, --x86-build DIR, --help)" >&2; exit 2 ;;
  esac
  shift
done
in_ci() { case "${CI:-}" in "" | 0 | false | no) return 1 ;; *) return 0 ;; esac; }
# Without the tools: a failure in CI, a skip elsewhere.
give_up() {
  if in_ci; then
    echo "scripts/test_arm.sh: $1 (CI must run the Arm suites)" >&2
    exit 1
  fi
  echo "scripts/test_arm.sh: skipped: $1"
  exit 77
}

# ---- tools and arm64 packages (Debian)
need_host=() need_arm=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need_host+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need_host+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null 2>&1 || command -v qemu-aarch64 >/dev/null 2>&1 || need_host+=(qemu-user-static)
command -v cmake >/dev/null 2>&1 || need_host+=(cmake)
for p in libc6 libstdc++6 libgomp1 libcmocka-dev; do  # the arm64 loader and libraries qemu runs the tests with
  dpkg -s "$p:arm64" >/dev/null 2>&1 || need_arm+=("$p:arm64")
done
if [ ${#need_host[@]} -gt 0 ] || [ ${#need_arm[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || give_up "no apt-get to install ${need_host[*]} ${need_arm[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || give_up "not root and no sudo to install ${need_host[*]} ${need_arm[*]}"
    SUDO="sudo"
  fi
  echo "scripts/test_arm.sh: installing ${need_host[*]} ${need_arm[*]}"
  if [ ${#need_arm[@]} -gt 0 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64 || give_up "dpkg --add-architecture arm64 failed"
  fi
  $SUDO apt-get update -qq || give_up "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_host[@]}" "${need_arm[@]}" ||
    give_up "apt-get install ${need_host[*]} ${need_arm[*]} failed"
fi
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64)

# ---- configure, build
build=${LOWBIT_ARM_BUILD_DIR:-build-arm}
if [ "$all" = 1 ]; then what="everything (--all)"; else what="the fast set (--all: the exhaustive tests too)"; fi
echo "scripts/test_arm.sh: aarch64 under $qemu -cpu max, $what; build directory $build"
x86_arg=()
if [ -n "$x86_build" ]; then
  [ -f "$x86_build/liblowbit.so" ] || { echo "scripts/test_arm.sh: --x86-build $x86_build has no liblowbit.so" >&2; exit 2; }
  x86_arg=(-DLOWBIT_SAME_BITS_X86_BUILD="$(cd "$x86_build" && pwd)")
fi
start=$SECONDS
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake -DLOWBIT_QEMU_AARCH64="$qemu" \
  -DCMAKE_BUILD_TYPE=Release -DLOWBIT_WITH_CUDA=OFF -DLOWBIT_WITH_MPI=OFF -DLOWBIT_WITH_JAX=OFF -DLOWBIT_TEST_TIMEOUT_SCALE=4 \
  -DLOWBIT_BUILD_BENCH=ON -DLOWBIT_BUILD_EXAMPLES=ON "${x86_arg[@]+"${x86_arg[@]}"}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep -E "^-- lowbit:" "$build/configure.log" || true
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$build" -j"$jobs"
echo "scripts/test_arm.sh: configured and built in $((SECONDS - start)) s"

# ---- run: the fast set, then (--all) the exhaustive tests on their own (the
# NEON sweeps use every core: beside other tests they would only slow both).
# Idle OpenMP workers sleep: spinning ones cost the emulator dearly.
export OMP_WAIT_POLICY=PASSIVE
start=$SECONDS
rc=0
ctest --test-dir "$build" --output-on-failure -j"$jobs" -LE exhaustive -E '^examples\.train_softmax$' || rc=$?
echo "scripts/test_arm.sh: the fast set: CTest $([ $rc = 0 ] && echo passed || echo "FAILED (rc $rc)") in $((SECONDS - start)) s"
if [ "$all" = 1 ]; then
  start=$SECONDS
  ctest --test-dir "$build" --output-on-failure -L exhaustive || rc=$?
  echo "scripts/test_arm.sh: the exhaustive tests: CTest $([ $rc = 0 ] && echo passed || echo "FAILED (rc $rc)") in $((SECONDS - start)) s"
fi
exit $rc

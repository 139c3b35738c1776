#!/usr/bin/env bash
# Every check lowbit runs on a GPU, in one call of a lent GPU machine (it keeps
# nothing between calls, so one prepared script does the whole round):
#   1. the GPU C suites (cuda.vs_cpu with 4BIT_SR and Muon's momentum,
#      cuda.graph_capi, cuda.engine_graph, cuda.functional_step,
#      cuda.step_params, cuda.muon, cuda.extremes);
#   2. alone on the card, the timings: bench_gpu_step (every config, both
#      layouts: 4BIT_SR's preset and Lion 4bit-sr on the fast loops, Muon on
#      llama1b's matrices with fp32, 8-bit, 4-bit and 4BIT_SR momentum), the
#      element-wise configs built with --use_fast_math (the cost of
#      exactness; needs FAST_BUILD), bench/gpu/compare_peers.py (torch fused
#      AdamW, bitsandbytes), bench_comm_cuda (pack/unpack bandwidth, NCCL at
#      world size 1), bench/gpu/compare_jax.py (optax), bench/gpu/offload_1b.py
#      (memory and time of the step inside backward and of CPU offload);
#   3. side by side: compute-sanitizer memcheck, racecheck, initcheck and
#      synccheck over the C suites, the PyTorch CUDA tests, the JAX tests on
#      the GPU, the demo on the GPU, lowbit.torch.OneBitAdam under torchrun
#      with NCCL on CUDA params; where BUILD has the MPI suites and an
#      mpirun is found (LOWBIT_MPIRUN, else PATH), the communicator with CUDA
#      buffers at 1 and 2 ranks and the 1-bit optimizers with CUDA params at
#      2 ranks (bench/NOTES.md says how to carry an MPI to a machine without
#      one).
# Each stage has a time limit; its log and a summary line go under OUTDIR
# (summary.txt and all.log, the two files to read first).
#
#   bash bench/gpu/device_checks.sh BUILD [FAST_BUILD|-] OUTDIR
#
# BUILD holds liblowbit, liblowbit_jax, lowbit_cdef.h, tests/cuda/*,
# tests/comm/test_comm_cuda and bench/*. bench/gpu/prepare_carry.sh builds
# it here for sm_90 and gathers what the device machine lacks (cmocka, cffi,
# bitsandbytes, Open MPI) into one folder to carry; there,
# `source DIR/env.sh` first. bindings/ and LOWBIT_LIBRARY are set here.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "$1" && pwd)
FB=""
if [ "${2:--}" != "-" ]; then FB=$(cd "$2" && pwd); fi
O=$3
mkdir -p "$O/logs"
SUM=$O/summary.txt
: >"$SUM"

nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=$B${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LOWBIT_LIBRARY=$B/liblowbit.so
export PYTHONPATH=$ROOT/bindings${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false OMP_NUM_THREADS=8

# stage NAME LIMIT_S CMD...: runs CMD with a time limit, log in logs/NAME.log
stage() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$O/logs/$name.log" 2>&1
  local rc=$?
  printf '%-26s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$O/logs/$name.log" | tail -n 1 | cut -c1-110)" | tee -a "$SUM"
  return 0
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.default_backend())"
  echo "nccl: ${nccl_dir:-not found}"
  ldd "$B/tests/cuda/test_cuda_vs_cpu" | grep -E "not found|cmocka|cudart|gomp" || true
} >"$O/logs/env.log" 2>&1
cat "$O/logs/env.log" >>"$SUM"

T=$B/tests/cuda
# 1. correctness of the C suites
stage vs_cpu 150 "$T/test_cuda_vs_cpu"  # 370 cases + Muon's momentum (16)
stage graph_capi 45 "$T/test_cuda_graph_capi"
stage engine_graph 45 "$T/test_cuda_engine_graph"
stage functional_step 60 "$T/test_functional_step_cuda"
stage step_params 60 "$T/test_step_params_cuda"
stage muon 60 "$T/test_muon_cuda"
stage extremes 60 "$T/test_extremes_vs_cpu"  # rank-1 one-read pass 1 and fast pass 2, bf16, vs the CPU

# 2. timings, alone on the card
stage bench_gpu_step 180 "$B/bench/gpu/bench_gpu_step" all all 20
if [ -n "$FB" ]; then
  # the element-wise configs (Muon's steps are mostly cuBLAS products, which fast math does not change)
  EW=adamw8,adamw4,adamw4_sr,lion8,lion4_sr,adamw32,adamw8_sr,adamw8_ecc,adamwfp8,adamw8_check,adamw4_rank1,adamw4_factor
  stage bench_fastmath 90 env LD_LIBRARY_PATH="$FB:$LD_LIBRARY_PATH" "$B/bench/gpu/bench_gpu_step" llama1b "$EW" 20
fi
stage compare_peers 120 python3 "$ROOT/bench/gpu/compare_peers.py" --steps 10 --rounds 3
stage bench_comm_cuda 40 "$B/bench/comm/bench_comm_cuda"
stage compare_jax 100 python3 "$ROOT/bench/gpu/compare_jax.py" --steps 10 --rounds 3
stage offload_1b 90 python3 "$ROOT/bench/gpu/offload_1b.py"
stage muon_llama1b 60 python3 "$ROOT/bench/gpu/muon_llama1b.py"

# 3. side by side
export LOWBIT_TEST_QUICK=1
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin:$(ls -d /opt/nvidia/compute-sanitizer* /usr/local/cuda/compute-sanitizer 2>/dev/null | tr "\n" ":")
CS="compute-sanitizer --error-exitcode 9"
stage memcheck_vs_cpu 150 $CS --tool memcheck "$T/test_cuda_vs_cpu" &
stage memcheck_graph 100 $CS --tool memcheck --leak-check full "$T/test_cuda_graph_capi" &
stage racecheck_engine 150 $CS --tool racecheck "$T/test_cuda_engine_graph" &
stage initcheck_graph 100 $CS --tool initcheck "$T/test_cuda_graph_capi" &
stage synccheck_engine 100 $CS --tool synccheck "$T/test_cuda_engine_graph" &
stage memcheck_functional 120 $CS --tool memcheck "$T/test_functional_step_cuda" &
stage pytest_torch_cuda 150 python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_torch_cuda.py" \
  "$ROOT/tests/python/test_torch.py" "$ROOT/tests/python/test_arrays.py" "$ROOT/tests/python/test_main.py" \
  "$ROOT/tests/python/test_torch_compile.py" -k "cuda or Cuda or CUDA or stream or captured" &
stage pytest_jax_gpu 150 python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/jax" &
stage demo_cuda 150 python3 "$ROOT/examples/demo.py" --device cuda --steps 400 --no-plot &
# lowbit.torch.OneBitAdam under torchrun with NCCL on CUDA params (one rank per GPU)
stage torchrun_nccl 150 python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_torch_onebit.py" -k nccl &
MPIRUN=${LOWBIT_MPIRUN:-$(command -v mpirun || true)}
if [ -n "$MPIRUN" ] && [ -x "$B/tests/comm/test_comm_cuda" ] && [ -x "$T/test_onebit_cuda" ]; then
  M="$MPIRUN --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x PATH"
  (
    stage comm_cuda_np1 100 $M -n 1 "$B/tests/comm/test_comm_cuda"
    stage comm_cuda_np2 100 $M -n 2 "$B/tests/comm/test_comm_cuda"
    stage onebit_cuda_np2 150 $M -n 2 "$T/test_onebit_cuda"
  ) &
else
  echo "MPI suites skipped: ${MPIRUN:-no mpirun} (BUILD needs tests/comm/test_comm_cuda and tests/cuda/test_onebit_cuda)" | tee -a "$SUM"
fi
wait

{
  for f in "$O"/logs/*.log; do
    echo "=================== $(basename "$f")"
    cat "$f"
  done
} >"$O/all.log"
echo "device checks done" | tee -a "$SUM"

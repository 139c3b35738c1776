#!/usr/bin/env bash
# Training-step time of DDP + torch.optim.Adam against DDP + a lowbit.torch 1-bit
# optimizer (OneBitAdam by default; onebit_ddp_comm_hook, timed after the warm-up) on one model, 2 ranks under
# torchrun (gloo over TCP) on the loopback device of a private network namespace
# shaped by tc tbf to each rate. A benchmark, not a test. Needs root (unshare -n, tc).
#
#   sudo bash bench/comm/shaped_ddp.sh [build_dir]        (default: build)
#
# Environment: RATES="1 10" (Gbit/s), NPROC=2, WIDTH=2048 (4 layers of WIDTH^2:
# 16.8M params), STEPS=5 (timed steps, median), OPTIMIZER=onebit_adam (or
# zeroone_adam, onebit_lamb: ddp_step.py --optimizer), LOCAL_STEPS=4 (0/1 Adam's
# local interval).
set -euo pipefail
build=${1:-build}
rates=${RATES:-"1 10"}
nproc=${NPROC:-2}
width=${WIDTH:-2048}
steps=${STEPS:-5}
optimizer=${OPTIMIZER:-onebit_adam}
local_steps=${LOCAL_STEPS:-4}
root=$(cd "$(dirname "$0")/../.." && pwd)
[[ $(id -u) -eq 0 ]] || { echo "shaped_ddp.sh: needs root (unshare -n, tc)" >&2; exit 1; }
[[ -f $build/liblowbit.so ]] || { echo "shaped_ddp.sh: $build/liblowbit.so not found" >&2; exit 1; }
command -v tc > /dev/null || apt-get install -y iproute2 > /dev/null
export LOWBIT_LIBRARY=$(cd "$build" && pwd)/liblowbit.so PYTHONPATH=$root/bindings OMP_NUM_THREADS=1
printf '# DDP + Adam vs DDP + %s, %s ranks (gloo, TCP over a tbf-shaped loopback shared by all ranks)\n' \
  "$optimizer" "$nproc"
printf '%-10s %5s %10s %14s %16s %9s %14s %12s %s\n' rate ranks params "Adam ms/step" "1-bit ms/step" speedup \
  "DDP bytes/step" "1-bit bytes" optimizer
for rate in $rates; do
  unshare -n bash -s -- "$rate" "$nproc" "$root" "$width" "$steps" "$optimizer" "$local_steps" << 'SH'
set -euo pipefail
rate=$1 nproc=$2 root=$3 width=$4 steps=$5 optimizer=$6 local_steps=$7
ip link set lo up
tc qdisc add dev lo root tbf rate "${rate}gbit" burst 1mb latency 100ms
torchrun --standalone --nproc-per-node "$nproc" "$root/bench/comm/ddp_step.py" "${rate}Gbit/s" "$width" "$steps" \
  --optimizer "$optimizer" --local-steps "$local_steps" 2> /dev/null | grep -v '^\*'
SH
done

#!/usr/bin/env bash
# The 1-bit compressed allreduce against MPI_Allreduce over a rate-limited
# link: 2 and 4 ranks on this machine, Open MPI over TCP on the loopback
# device of a private network namespace whose egress is shaped by a token
# bucket (tc tbf) at 1, 10 and 25 Gbit/s. A benchmark, not a test: prints a
# table and asserts nothing. Needs root (unshare -n, tc) and Open MPI.
#
#   sudo bash bench/comm/shaped_link.sh [build_dir]          (default: build)
#
# Environment (all optional):
#   RATES="1 10 25"   link rates in Gbit/s
#   RANKS="2 4"       world sizes
#   NUMEL=16777216    fp32 elements per rank (16M = 64 MiB)
#   ITERS=3           timed calls of each per configuration (after one warm-up)
#   THREADS=1         OpenMP threads per rank for the host kernels
#
# What is shaped: every byte between the ranks crosses `lo` of the namespace,
# so the rate is the link all ranks share (the sum of what they send), not a
# per-rank NIC. The time per call is bench_comm's: the slowest rank's mean
# over ITERS calls, each side measured in the same run. More ranks than cores
# oversubscribes the CPU (the ranks' compute then shares cores): the table
# says so in its last column.
set -euo pipefail

build=${1:-build}
bench="$build/bench/comm/bench_comm"
rates=${RATES:-"1 10 25"}
ranks=${RANKS:-"2 4"}
numel=${NUMEL:-16777216}
iters=${ITERS:-3}
threads=${THREADS:-1}

if [[ $(id -u) -ne 0 ]]; then
  echo "shaped_link.sh: needs root (unshare -n, tc)" >&2
  exit 1
fi
if [[ ! -x $bench ]]; then
  echo "shaped_link.sh: $bench not found (build with MPI: cmake --build $build --target bench_comm)" >&2
  exit 1
fi
if ! command -v tc > /dev/null || ! command -v ip > /dev/null; then
  echo "shaped_link.sh: installing iproute2 (tc, ip)" >&2
  apt-get install -y iproute2 > /dev/null
fi
command -v mpirun > /dev/null || { echo "shaped_link.sh: mpirun not found" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cores=$(nproc)

# One configuration: prints "comp_ms mpi_ms" (bench_comm's line for numel).
run_one() {
  local rate=$1 np=$2 extra=()
  if ((np > cores)); then
    extra+=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
  fi
  unshare -n bash -s -- "$rate" "$np" "$bench" "$numel" "$iters" "$threads" "${extra[@]}" << 'EOF'
set -euo pipefail
rate=$1 np=$2 bench=$3 numel=$4 iters=$5 threads=$6
shift 6
ip link set lo up
tc qdisc add dev lo root tbf rate "${rate}gbit" burst 1mb latency 100ms
mpirun -np "$np" "$@" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo -x OMP_NUM_THREADS="$threads" -x OMP_WAIT_POLICY=PASSIVE \
  "$bench" "$numel" "$numel" "$iters" | awk -v n="$numel" '$1 == n { print $3, $4 }'
EOF
}

printf '# 1-bit compressed allreduce vs MPI_Allreduce, %s fp32 elements per rank, TCP over a tbf-shaped\n' "$numel"
printf '# loopback (rate shared by all ranks), %s timed calls each, %s OpenMP thread(s) per rank, %s cores\n' \
  "$iters" "$threads" "$cores"
printf '%-10s %6s %18s %10s %9s  %s\n' "rate" "ranks" "MPI_Allreduce ms" "1-bit ms" "speedup" "note"
for rate in $rates; do
  for np in $ranks; do
    read -r comp mpi < <(run_one "$rate" "$np")
    note=""
    ((np * threads > cores)) && note="oversubscribed: $np ranks x $threads thread(s) on $cores cores"
    printf '%-10s %6s %18.1f %10.1f %8.1fx  %s\n' "${rate} Gbit/s" "$np" "$mpi" "$comp" \
      "$(awk -v a="$mpi" -v b="$comp" 'BEGIN { print a / b }')" "$note"
  done
done

#!/usr/bin/env bash
# Sets up a fresh machine, builds lowbit and runs every test suite:
# the cmocka suites and the mpirun communicator tests (CTest), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Tests step tiny models back to back: idle OpenMP workers should sleep, not spin.
export OMP_WAIT_POLICY=PASSIVE

build=${LOWBIT_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"

export LOWBIT_LIBRARY="$PWD/$build/liblowbit.so"
python3 -m pytest -q tests/python tests/jax

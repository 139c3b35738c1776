#!/usr/bin/env bash
# Builds the Rust crate against a CMake build of liblowbit, runs its unit
# tests and tests/ (tests/described.rs: the descriptors read at run time, and
# RMSprop and Adagrad against a float64 reference), then trains the same linear model with the Rust example
# (examples/train_linear.rs) and the C example
# (examples/train_linear_functional.c) and checks that both print the same
# `final-bits` line: the same bits through two languages' FFI.
#
#   bash bindings/rust/run_test.sh [BUILD_DIR [C_EXAMPLE]]
#
# BUILD_DIR: the CMake build directory holding liblowbit (default: build);
# C_EXAMPLE: the C example's binary (default: BUILD_DIR/examples/train_linear_functional).
# Cargo's output goes to BUILD_DIR/bindings/rust/target; nothing is fetched
# (--offline: the crate has no dependencies). LOWBIT_CARGO picks the cargo
# (default: the one on PATH) and the rustc beside it, unless RUSTC is set: e.g.
# Debian's /usr/bin/cargo with rustup's rustc first on PATH would otherwise
# pair cargo 1.65 with another rustc. CTest: rust.train_linear.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-build}" && pwd)"
c_example="${2:-$build/examples/train_linear_functional}"
cargo="${LOWBIT_CARGO:-cargo}"
cargo_path=$(command -v "$cargo") || { echo "run_test.sh: no cargo ($cargo)" >&2; exit 1; }
if [ -z "${RUSTC:-}" ] && [ -x "$(dirname "$cargo_path")/rustc" ]; then
  export RUSTC="$(dirname "$cargo_path")/rustc"
fi

lib_dir="$build"
[ -e "$lib_dir/liblowbit.so" ] || [ -e "$lib_dir/liblowbit.dylib" ] || {
  echo "run_test.sh: no liblowbit in $lib_dir (cmake --build $build --target lowbit train_linear_functional)" >&2
  exit 1
}
[ -x "$c_example" ] || { echo "run_test.sh: no C example at $c_example" >&2; exit 1; }

export LOWBIT_LIB_DIR="$lib_dir"
export CARGO_TARGET_DIR="$build/bindings/rust/target"
manifest="$here/Cargo.toml"
echo "run_test.sh: $("$cargo" --version) ($cargo_path), $("${RUSTC:-rustc}" --version 2>/dev/null || echo 'rustc ?')"

start=$(date +%s)
"$cargo" build --offline --release --examples --manifest-path "$manifest"
"$cargo" test --offline --release --manifest-path "$manifest"
echo "run_test.sh: cargo build and test took $(($(date +%s) - start)) s"

rust_out=$("$CARGO_TARGET_DIR/release/examples/train_linear") || {
  echo "$rust_out"; echo "run_test.sh: the Rust example failed" >&2; exit 1
}
c_out=$("$c_example") || { echo "$c_out"; echo "run_test.sh: the C example failed" >&2; exit 1; }
echo "---- Rust (train_linear)"; echo "$rust_out"
echo "---- C (train_linear_functional)"; echo "$c_out"

rust_bits=$(echo "$rust_out" | grep '^final-bits ' || true)
c_bits=$(echo "$c_out" | grep '^final-bits ' || true)
if [ -z "$rust_bits" ] || [ "$rust_bits" != "$c_bits" ]; then
  echo "run_test.sh: FAILED: Rust '${rust_bits:-no final-bits line}' vs C '${c_bits:-no final-bits line}'" >&2
  exit 1
fi
echo "run_test.sh: passed: both print '$rust_bits'"

#!/usr/bin/env bash
# Installs what building and testing lowbit needs on a fresh Debian machine:
# cmocka, OpenMPI, OpenBLAS, oneDNN, valgrind and cargo from Debian, the Python test dependencies from PyPI.
# Skips whatever is already there: when every requirement of
# requirements-test.txt is installed (and satisfies its version, if it names
# one) pip is not run at all; LOWBIT_SETUP_PIP=always runs it anyway.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

need_apt=()
dpkg -s libcmocka-dev >/dev/null 2>&1 || need_apt+=(libcmocka-dev)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
dpkg -s libopenblas-dev >/dev/null 2>&1 || need_apt+=(libopenblas-dev)  # Muon's CPU products (CBLAS)
dpkg -s libdnnl-dev >/dev/null 2>&1 || need_apt+=(libdnnl-dev)  # Muon's bf16 CPU products (oneDNN)
dpkg -s openmpi-bin >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)  # the memcheck runs of the exhaustive label
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
# The Rust crate's test (bindings/rust, CTest rust.train_linear): Debian's
# cargo brings its rustc; a rustup toolchain on PATH serves as well.
command -v cargo >/dev/null 2>&1 || need_apt+=(cargo)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# A fast check (installed distributions' metadata, well under a second) instead
# of a pip resolve of the whole list (a minute and more with torch and jax).
missing=$(python3 - "$here/requirements-test.txt" <<'EOF'
import re
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement

for line in open(sys.argv[1]):
    line = re.sub(r"#.*", "", line).strip()
    if not line:
        continue
    try:
        req = Requirement(line)
    except Exception:  # anything this check does not understand: let pip decide
        print(line)
        continue
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        print(line)
        continue
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        print(line)
EOF
) || missing="(the check failed)"

if [ -n "$missing" ] || [ "${LOWBIT_SETUP_PIP:-}" = always ]; then
  [ -z "$missing" ] || echo "setup: installing the Python test dependencies (missing: $(echo $missing))"
  python3 -m pip install -q --disable-pip-version-check -r "$here/requirements-test.txt"
fi

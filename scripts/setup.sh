#!/usr/bin/env bash
# Installs what building and testing lowbit needs on a fresh Debian machine:
# cmocka and OpenMPI from Debian, the Python test dependencies from PyPI.
# Skips whatever is already there.
set -euo pipefail

need_apt=()
dpkg -s libcmocka-dev >/dev/null 2>&1 || need_apt+=(libcmocka-dev)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
dpkg -s openmpi-bin >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements-test.txt"

#!/usr/bin/env bash
# Builds the wheel the way `pip install .` does (scikit-build-core), installs
# it into a fresh virtual environment and checks the installed package, away
# from the source tree and without LOWBIT_LIBRARY:
#   - the wheel holds liblowbit, lowbit_cdef.h (the declarations, with the
#     fingerprint the library reports), the public headers and, when jax is
#     importable here, liblowbit_jax;
#   - `python -m lowbit` loads the library and its declarations from the
#     package, and reports the JAX handlers it finds there;
#   - an optimizer steps, and lowbit.torch / lowbit.jax (subpackages) import from
#     the installed package where torch / jax are installed.
# The build uses this environment's packages (--no-build-isolation: no
# download, and jax is seen when installed). It builds the library from
# scratch (CUDA off, to keep it to a few minutes).
# Usage: check_pip_install.sh [source dir]   (default: this checkout)
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" -c "import scikit_build_core, cffi, numpy" || {
  echo "check_pip_install: needs scikit-build-core, cffi and numpy (pip install -r scripts/requirements-test.txt)"; exit 1; }
have_jax=0
"$python" -c "import jax.ffi" 2>/dev/null && have_jax=1

echo "building the wheel (jax importable: $have_jax) ..."
"$python" -m pip wheel --no-deps --no-build-isolation -q -w "$tmp/dist" \
  -C build-dir="$tmp/build" -C cmake.define.LOWBIT_WITH_CUDA=OFF "$src"
wheel=$(ls "$tmp"/dist/lowbit-*.whl)

listing=$("$python" -m zipfile -l "$wheel")
# the package's subpackages too (lowbit.torch, lowbit.jax)
for f in lowbit/__init__.py lowbit/__main__.py lowbit/_ffi.py lowbit/liblowbit.so lowbit/lowbit_cdef.h \
         lowbit/include/lowbit.h lowbit/include/lowbit_comm.h lowbit/torch/__init__.py lowbit/torch/_onebit.py \
         lowbit/jax/__init__.py lowbit/jax/_module.py; do
  grep -q " *$f " <<<"$listing" || { echo "check_pip_install: $f is not in $wheel"; echo "$listing"; exit 1; }
done
if [ "$have_jax" = 1 ]; then
  grep -q "lowbit/liblowbit_jax.so" <<<"$listing" || { echo "check_pip_install: jax is importable but the wheel has no liblowbit_jax.so"; exit 1; }
fi
grep -q "_capi.py" <<<"$listing" && { echo "check_pip_install: the old ctypes mirror _capi.py is in the wheel"; exit 1; }

# A fresh environment that sees this one's numpy/cffi/jax, with the wheel installed.
"$python" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check "$wheel"
cd "$tmp"
env -u LOWBIT_LIBRARY -u LOWBIT_JAX_LIBRARY -u PYTHONPATH "$tmp/venv/bin/python" -m lowbit > report.txt
cat report.txt
pkg=$(env -u LOWBIT_LIBRARY -u PYTHONPATH "$tmp/venv/bin/python" -c "import lowbit, os; print(os.path.dirname(lowbit.__file__))")
case "$pkg" in "$tmp/venv"/*) ;; *) echo "check_pip_install: imported lowbit from $pkg, not the venv"; exit 1;; esac
grep -q "^library: *$pkg/liblowbit.so$" report.txt
grep -q "^declarations: *$pkg/lowbit_cdef.h (fingerprint [0-9a-f]*, matches the library)$" report.txt
grep -q "^CUDA: *no$" report.txt
if [ "$have_jax" = 1 ]; then
  grep -q "^JAX handlers built: *yes$" report.txt
  grep -q "^JAX handlers found: *$pkg/liblowbit_jax.so (protocol [0-9]" report.txt
fi
env -u LOWBIT_LIBRARY -u PYTHONPATH "$tmp/venv/bin/python" - <<'EOF'
import importlib
import importlib.util
import os

import numpy as np
import lowbit
w, g = np.ones(1000, np.float32), np.full(1000, 0.5, np.float32)
with lowbit.Optimizer("adamw", lr=0.1, state="8bit", min_quantized_numel=1) as opt:
    opt.add_param(w, g)
    assert opt.step() and np.all(w < 1)
print("pip-installed package steps:", lowbit.version())
for sub, needs in (("lowbit.torch", "torch"), ("lowbit.jax", "jax")):
    if importlib.util.find_spec(needs) is not None:  # the subpackage imports from the installed package
        mod = importlib.import_module(sub)
        assert mod.__file__.startswith(os.path.dirname(lowbit.__file__)), mod.__file__
        print(f"{sub} imports:", os.path.dirname(mod.__file__))
EOF
echo "pip wheel, installed package, lowbit_cdef.h and python -m lowbit: ok"

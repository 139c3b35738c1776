"""Fixtures of the JAX tests: the repository's bindings on sys.path, the JAX
FFI module (liblowbit_jax) and the C library (liblowbit, called through
ctypes for the same-bits comparisons).

Both libraries are found as lowbit finds them: LOWBIT_JAX_LIBRARY, else
liblowbit_jax.so next to LOWBIT_LIBRARY, else inside the package. Where jax
is not installed the tests skip (importorskip in each module); where jax is
installed but the libraries are missing they skip locally and fail under CI
(CI=true), where a missing build must not hide the tests.

tests/common (shared with tests/python: the float64 reference of the optimizer
updates, float64_reference.py) is put on sys.path.
"""

import ctypes
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings"))
COMMON = ROOT / "tests" / "common"
if str(COMMON) not in sys.path:
    sys.path.insert(0, str(COMMON))


def _missing(message):
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def ljax():
    pytest.importorskip("jax")
    try:
        import lowbit.jax as ljax

        ljax.library_path()
    except ImportError as e:
        _missing(f"liblowbit_jax is not available: {e}")
    return ljax


@pytest.fixture(scope="session")
def capi():
    """liblowbit through ctypes, with the signatures of lowbit._capi."""
    from lowbit import _capi

    path = os.environ.get("LOWBIT_LIBRARY") or str(ROOT / "bindings" / "lowbit" / "liblowbit.so")
    if not os.path.exists(path):
        _missing(f"liblowbit not found at {path} (set LOWBIT_LIBRARY)")
    lib = ctypes.CDLL(path)
    missing = _capi.bind(lib)
    if missing:
        _missing(f"{path} lacks {missing}")
    return lib

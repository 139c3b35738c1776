"""Fixtures of the JAX tests: the repository's bindings on sys.path, the JAX
FFI module (liblowbit_jax) and the C library (liblowbit, called through the
package's CFFI declarations for the same-bits comparisons).

Both libraries are found as lowbit finds them: LOWBIT_JAX_LIBRARY, else
liblowbit_jax.so next to LOWBIT_LIBRARY, else inside the package. Where jax
is not installed the tests skip (importorskip in each module); where jax is
installed but the libraries are missing they skip locally and fail under CI
(CI=true), where a missing build must not hide the tests.

tests/common is put on sys.path: what tests/python and tests/jax share, the
float64 reference of the updates (float64_reference.py) and the seed
convention (seeding.py).

Seeds, as in tests/python. Every random input of the suite derives from one
seed per run:
    LOWBIT_TEST_SEED unset   seeding.DEFAULT_SEED, a fixed constant (CI)
    LOWBIT_TEST_SEED=N       seed N: repeats a run, e.g. one that failed
    LOWBIT_TEST_SEED=random  a fresh seed for this run, printed: exploration
The seed is in the pytest header and in the captured output of every test
(pytest shows it with a failure). Fixtures: `seed` (the int) and `rng`
(np.random.default_rng(seed)); other streams come from seeding.rng(*salt).
"""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings"))
COMMON = ROOT / "tests" / "common"
if str(COMMON) not in sys.path:
    sys.path.insert(0, str(COMMON))

from seed_plugin import _print_seed, pytest_configure, pytest_report_header, pytest_sessionstart, rng, seed  # noqa: E402,F401


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
    """liblowbit through CFFI, as the package loads it (lowbit._ffi.lib: the
    declarations of the headers it was built from)."""
    try:
        from lowbit import _ffi
    except ImportError as e:
        _missing(f"liblowbit is not available: {e}")
    return _ffi.lib

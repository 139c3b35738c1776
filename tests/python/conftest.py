"""pytest setup for the lowbit Python package.

With LOWBIT_LIBRARY set (a build tree: scripts/test.sh, make -f Makefile.python
test) the package is imported from bindings/ in this checkout; otherwise the
installed package is used, and bindings/ only when none is installed.

tests/common (shared with tests/jax: the float64 reference of the optimizer
updates, float64_reference.py) is put on sys.path.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINDINGS = ROOT / "bindings"
COMMON = ROOT / "tests" / "common"

if os.environ.get("LOWBIT_LIBRARY") or importlib.util.find_spec("lowbit") is None:
    sys.path.insert(0, str(BINDINGS))
if str(COMMON) not in sys.path:
    sys.path.insert(0, str(COMMON))


@pytest.fixture
def rng():
    """A generator with a fresh seed on every run; the seed is printed (pytest
    shows it for a failing test) and LOWBIT_TEST_SEED=N repeats it."""
    import secrets

    import numpy as np

    seed = int(os.environ.get("LOWBIT_TEST_SEED") or secrets.randbits(32))
    print(f"random seed {seed} (LOWBIT_TEST_SEED={seed} repeats it)")
    return np.random.default_rng(seed)

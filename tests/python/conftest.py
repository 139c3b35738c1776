"""pytest setup for the lowbit Python package.

With LOWBIT_LIBRARY set (a build tree: scripts/test.sh, make -f Makefile.python
test) the package is imported from bindings/ in this checkout; otherwise the
installed package is used, and bindings/ only when none is installed.

tests/common is put on sys.path: what tests/python and tests/jax share, the
float64 reference of the updates (float64_reference.py) and the seed
convention (seeding.py).

Seeds. Every random input of the suite derives from one seed per run:
    LOWBIT_TEST_SEED unset   seeding.DEFAULT_SEED, a fixed constant (CI)
    LOWBIT_TEST_SEED=N       seed N: repeats a run, e.g. one that failed
    LOWBIT_TEST_SEED=random  a fresh seed for this run, printed: exploration
The seed is in the pytest header and in the captured output of every test
(pytest shows it with a failure). Fixtures: `seed` (the int) and `rng`
(np.random.default_rng(seed)); other streams come from seeding.rng(*salt)
and seeding.derive(*salt) (torch). The mpirun worker (mpi_worker.py) gets the
run's seed through the environment.
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

from seed_plugin import _print_seed, pytest_configure, pytest_report_header, pytest_sessionstart, rng, seed  # noqa: E402,F401

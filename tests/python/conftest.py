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

import seeding  # noqa: E402


def pytest_configure(config):
    try:
        seeding.seed()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_report_header(config):
    return seeding.report_header_once()


def pytest_sessionstart(session):
    """pytest -q shows no header: a seed that was set or drawn is printed
    anyway (the default one is not, to keep CI logs as they were)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not getattr(reporter, "showheader", True) and seeding.source() != "default":
        for line in seeding.report_header_once():
            reporter.write_line(line)


@pytest.fixture(autouse=True)
def _print_seed():
    """Every test prints the run's seed: pytest shows it with a failure."""
    print(seeding.describe())


@pytest.fixture
def seed():
    """The run's seed (see the module docstring)."""
    return seeding.seed()


@pytest.fixture
def rng(seed):
    """np.random.default_rng(seed): the same stream for every test of a run."""
    import numpy as np

    return np.random.default_rng(seed)

"""The seed hooks and fixtures of the Python and JAX suites (the convention
is seeding.py's): both conftests import them, so pytest runs them for either
tree."""

import pytest

import seeding


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
    """The run's seed (seeding.py)."""
    return seeding.seed()


@pytest.fixture
def rng(seed):
    """np.random.default_rng(seed): the same stream for every test of a run."""
    import numpy as np

    return np.random.default_rng(seed)

"""The seed convention of the Python and JAX test suites (tests/python,
tests/jax and the mpirun worker tests/python/mpi_worker.py); the C suites
follow the same one (tests/common/test_seed.h), with the same default.

Every random input of these tests derives from one seed per run:

    LOWBIT_TEST_SEED unset or empty   DEFAULT_SEED, a fixed constant: CI and
                                      every plain run see the same inputs
    LOWBIT_TEST_SEED=N                seed N (decimal or 0x hex, N >= 0):
                                      repeats a run that used seed N
    LOWBIT_TEST_SEED=random           a fresh seed, drawn once per process, for
                                      exploration; the conftests print it at
                                      the start of the run and with every
                                      failing test (describe())

The `rng` fixture of both conftests is np.random.default_rng(seed()); tests
that need more than one independent stream, or a seed for another library
(torch), use rng(*salt) and derive(*salt): the same seed mixed with a
constant salt (ints, or strings hashed with crc32) that names the stream.

No test is pinned to a fixed input: a bound that holds only on the input it
was calibrated on is a defect of the test (LOWBIT_TEST_SEED=random finds
them), to be replaced by a bound that holds for every input.

Nothing here imports pytest or lowbit.
"""

import os
import secrets
import zlib

import numpy as np

ENV = "LOWBIT_TEST_SEED"
# The C suites' default too (LOWBIT_TEST_DEFAULT_SEED in tests/common/test_seed.h);
# changing it changes every default test input.
DEFAULT_SEED = 20261123

_seed = None
_header_shown = False


def _parse(text):
    text = (text or "").strip()
    if not text:
        return DEFAULT_SEED, "default"
    if text.lower() == "random":
        return secrets.randbits(32), "random"
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{ENV} must be empty, a non-negative integer or 'random'; got {text!r}")
    return value, "set"


def seed():
    """The seed of this run (resolved once per process)."""
    global _seed
    if _seed is None:
        _seed = _parse(os.environ.get(ENV))
    return _seed[0]


def source():
    """How this run's seed was chosen: "default", "set" (LOWBIT_TEST_SEED=N)
    or "random"."""
    seed()
    return _seed[1]


def describe():
    """One line naming the seed of this run and how to repeat it."""
    value = seed()
    how = {"default": f"the default; {ENV}=random draws a fresh one", "set": f"from {ENV}",
           "random": f"drawn because {ENV}=random"}[_seed[1]]
    return f"lowbit test seed {value} ({how}; {ENV}={value} repeats it)"


def report_header_once():
    """For pytest_report_header in each conftest: the seed line the first
    time (the two suites' conftests both ask when run together), then none;
    also for the line a quiet run (pytest -q, no header) prints instead."""
    global _header_shown
    if _header_shown:
        return []
    _header_shown = True
    return [describe()]


def _salt(parts):
    out = []
    for s in parts:
        if isinstance(s, str):
            out.append(zlib.crc32(s.encode()))
        elif isinstance(s, (int, np.integer)) and s >= 0:
            out.append(int(s))
        else:
            raise TypeError(f"a salt is a non-negative int or a str, got {s!r}")
    return out


def rng(*salt, base=None):
    """numpy Generator for the stream named by `salt` (no salt: seeded with
    the run's seed itself, as the `rng` fixture). base replaces seed() (the
    mpirun worker passes the seed of rank 0)."""
    s = seed() if base is None else base
    if not salt:
        return np.random.default_rng(s)
    return np.random.default_rng(np.random.SeedSequence([s, *_salt(salt)]))


def derive(*salt, base=None):
    """A 63-bit integer seed for the stream named by `salt`, for generators
    other than numpy's (torch.Generator().manual_seed(...))."""
    s = seed() if base is None else base
    words = np.random.SeedSequence([s, *_salt(salt)]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])

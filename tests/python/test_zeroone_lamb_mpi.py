"""0/1 Adam and 1-bit LAMB over MPI (mpi4py): mpi_zeroone_lamb_worker.py
under mpirun at 1 to 3 ranks checks both against float64 references of
lowbit.h's specification, their schedules, a NaN on one rank and resume."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lowbit
import seeding

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install mpi4py)")
HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(not lowbit.has_mpi(), reason="liblowbit was built without MPI")
@pytest.mark.parametrize("ranks", [1, 2, pytest.param(3, marks=pytest.mark.exhaustive)])
def test_zeroone_lamb_ranks(ranks):
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("no mpirun")
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               LOWBIT_TEST_SYSPATH=os.pathsep.join(p for p in sys.path if p), LOWBIT_TEST_SEED=str(seeding.seed()))
    cmd = [mpirun, "-n", str(ranks)]
    if "Open MPI" in MPI.Get_library_version():
        cmd.append("--oversubscribe")
    proc = subprocess.run(cmd + [sys.executable, str(HERE / "mpi_zeroone_lamb_worker.py")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"all checks passed at world size {ranks}" in proc.stdout

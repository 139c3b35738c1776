"""lowbit.Communicator with mpi4py: the multi-rank checks run mpi_worker.py
under mpirun at 1 to 4 ranks (compressed allreduce against a simulation of
the algorithm in lowbit_comm.h, error feedback, checkpoints of the errors,
non-finite input, sub-communicators, 1-bit Adam); the wrapper's own
behaviour is checked in process at world size 1."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lowbit
import seeding

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install mpi4py)")
HERE = Path(__file__).resolve().parent

needs_mpi = pytest.mark.skipif(not lowbit.has_mpi(), reason="liblowbit was built without MPI")


@needs_mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_mpi_ranks(ranks):
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("no mpirun")
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               LOWBIT_TEST_SYSPATH=os.pathsep.join(p for p in sys.path if p),
               LOWBIT_TEST_SEED=str(seeding.seed()))  # this run's seed, also when drawn at random
    cmd = [mpirun, "-n", str(ranks)]
    if "Open MPI" in MPI.Get_library_version():
        cmd.append("--oversubscribe")
    proc = subprocess.run(cmd + [sys.executable, str(HERE / "mpi_worker.py")], capture_output=True, text=True,
                          env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"all checks passed at world size {ranks}" in proc.stdout


@needs_mpi
def test_communicator_wrapper_in_process():
    with lowbit.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
        assert comm.world_size == MPI.COMM_WORLD.Get_size() and comm.rank == MPI.COMM_WORLD.Get_rank()
        assert comm.info()["backend"] == "mpi"
        with pytest.raises(lowbit.ArrayError, match="float32"):
            comm.compressed_allreduce(np.zeros(8, np.float16))
        with pytest.raises(lowbit.ArrayError, match="not C-contiguous"):
            comm.compressed_allreduce(np.zeros(16, np.float32)[::2])
        with pytest.raises(lowbit.ArrayError, match="read-only"):
            x = np.zeros(8, np.float32)
            x.setflags(write=False)
            comm.compressed_allreduce(x)
        with pytest.raises(lowbit.InvalidArgumentError, match="numel"):
            comm.compressed_allreduce(np.zeros(0, np.float32))
        with pytest.raises(lowbit.CorruptDataError):
            comm.load_errors(b"LBCOMMER" + bytes(8))
        x = np.ones(10, np.float32)
        comm.compressed_allreduce(x)
        blob = comm.save_errors()
        assert blob[:8] == b"LBCOMMER"
    assert comm.closed
    with pytest.raises(lowbit.InvalidStateError, match="closed"):
        comm.rank
    with pytest.raises(lowbit.InvalidArgumentError, match="cuda_aware"):
        lowbit.Communicator.from_mpi(MPI.COMM_WORLD, cuda_aware="sometimes")
    with pytest.raises(lowbit.InvalidArgumentError, match="mpi4py"):
        lowbit.Communicator.from_mpi("COMM_WORLD")


@needs_mpi
def test_onebit_adam_needs_its_communicator():
    p = np.zeros(10, np.float32)
    with lowbit.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
        with lowbit.Optimizer("onebit_adam") as opt:
            opt.add_param(p)
            with pytest.raises(lowbit.InvalidStateError, match="communicator"):
                opt.step([np.ones(10, np.float32)])
            with pytest.raises(lowbit.NullPointerError, match="comm"):
                opt.set_comm(None)
            opt.set_comm(comm)
            opt.set_momentum_mask(0, np.arange(10) % 2)
            opt.step([np.ones(10, np.float32)])
            assert opt.param_info(0).step == 1
            with pytest.raises(lowbit.InvalidArgumentError, match="numel"):
                opt.set_momentum_mask(0, np.ones(3))

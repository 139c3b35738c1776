"""lowbit.Communicator with mpi4py: the multi-rank checks run mpi_worker.py
under mpirun at 1 to 4 ranks (compressed allreduce against a simulation of
the algorithm in lowbit_comm.h, error feedback, checkpoints of the errors,
non-finite input, sub-communicators, 1-bit Adam); the wrapper's own
behaviour is checked in process at world size 1."""

import copy
import gc
import os
import pickle
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
@pytest.mark.parametrize("ranks", [1, 2] + [pytest.param(n, marks=pytest.mark.exhaustive) for n in (3, 4)])
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


@needs_mpi
def test_communicator_cannot_be_copied():
    with lowbit.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
        for make_copy in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be"):
                make_copy(comm)
        assert comm.world_size == MPI.COMM_WORLD.Get_size()  # untouched


@needs_mpi
def test_close_refuses_while_an_optimizer_holds_the_communicator():
    """Destroying a communicator is collective, so it is never deferred: close()
    names the open optimizers that use it, and works once they are closed. An
    optimizer with a communicator is not copied either."""
    p = np.zeros(10, np.float32)
    comm = lowbit.Communicator.from_mpi(MPI.COMM_WORLD)
    opt = lowbit.Optimizer("onebit_adam", freeze_step=2)
    opt.add_param(p)
    opt.set_comm(comm)
    with pytest.raises(lowbit.InvalidStateError, match=r"in use by 1 open optimizer.*onebit_adam"):
        comm.close()
    assert not comm.closed
    with pytest.raises(TypeError, match="communicator"):
        copy.deepcopy(opt)
    for _ in range(3):
        opt.step([np.ones(10, np.float32)])  # the communicator still works, past freeze_step
    assert opt.param_info(0).step == 3
    opt.close()
    comm.close()
    assert comm.closed
    comm.close()  # idempotent


@needs_mpi
def test_unreachable_optimizer_and_communicator_free_optimizer_first(monkeypatch):
    """When both are garbage (a reference cycle, or interpreter exit, where
    finalizers run in any order), the optimizer is destroyed before its
    communicator: the library never holds a freed communicator."""
    import lowbit._comm as comm_mod
    import lowbit._optimizer as opt_mod

    order = []
    real_opt, real_comm_destroy = opt_mod._destroy, comm_mod.LIB.fn("lowbit_comm_destroy")
    monkeypatch.setattr(opt_mod, "_destroy", lambda h: (order.append("optimizer"), real_opt(h)))
    comm = lowbit.Communicator.from_mpi(MPI.COMM_WORLD)
    opt = lowbit.Optimizer("onebit_adam")
    opt.add_param(np.zeros(10, np.float32))
    opt.set_comm(comm)
    opt.cycle, comm.cycle = comm, opt
    real_fn = comm_mod.LIB.fn

    def fn(name):
        if name != "lowbit_comm_destroy":
            return real_fn(name)
        return lambda h: (order.append("communicator"), real_comm_destroy(h))[1]

    monkeypatch.setattr(comm_mod.LIB, "fn", fn)
    del opt, comm
    gc.collect()
    assert order == ["optimizer", "communicator"]


def test_close_inside_its_own_transport_function_is_refused():
    """Issue 32, defect 9: closing a communicator from inside one of its own
    transport functions would free it under the running call. Refused, in
    Python and in the library; the call completes and the communicator
    still works."""
    ffi = lowbit._ffi.ffi
    seen = []

    def copy(send, recv, m, stream):
        if len(seen) < 2:
            try:
                comm.close()
            except lowbit.InvalidStateError as e:
                seen.append(str(e))
            status = lowbit._lib.LIB.fn("lowbit_comm_destroy")(ffi.cast("lowbit_comm_t", comm.handle))
            seen.append(int(status))
        ffi.memmove(ffi.cast("char*", recv), ffi.cast("char*", send), m)

    def noop_sum(data, n, stream):
        pass

    comm = lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=copy, allgather=copy,
                                              allreduce_sum=noop_sum)
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    comm.compressed_allreduce(x)
    assert "inside" in seen[0] and seen[1] == lowbit.Status.ERROR_INVALID_STATE
    assert not comm.closed
    comm.compressed_allreduce(x)
    comm.close()
    assert comm.closed


def _one_rank(error_format=None):
    ffi = lowbit._ffi.ffi

    def copy(send, recv, m, stream):
        ffi.memmove(ffi.cast("char*", recv), ffi.cast("char*", send), m)

    def noop_sum(data, n, stream):
        pass

    return lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=copy, allgather=copy,
                                              allreduce_sum=noop_sum, error_format=error_format)


def _bf16(v):
    u = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def _int8(v):
    out = np.empty_like(v)
    for b in range(0, v.size, 256):
        e = v[b:b + 256]
        m = np.float32(np.abs(e).max())
        k = np.rint((e / m) * np.float32(127)) if m > 0 else np.zeros_like(e)
        out[b:b + 256] = (k.astype(np.float32) * m) / np.float32(127)
    return out


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_error_format_on_one_rank(fmt):
    """Issue 48, item 3: a communicator with error_format= keeps the errors of
    the fp32 rule encoded (the first call, from zero errors, gives the fp32
    communicator's output, and its errors are the fp32 errors encoded);
    save/load round trip; an fp32 blob is refused, nothing changed."""
    x = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
    x[7] = 50.0
    ref, comm = _one_rank(), _one_rank(fmt)
    assert comm.error_format == fmt and ref.error_format == "fp32"
    a, b = x.copy(), x.copy()
    ref.compressed_allreduce(a)
    comm.compressed_allreduce(b)
    assert np.array_equal(a, b)
    enc = _bf16 if fmt == "bf16" else _int8
    for mine, theirs in zip(comm.read_errors(), ref.read_errors()):
        assert np.array_equal(mine, enc(theirs))
    blob = comm.save_errors()
    # worker and server error, 1000 elements each (one rank)
    assert len(blob) == 64 + (2 * 2 * 1000 if fmt == "bf16" else 2 * (1000 + 4 * 4))
    before = comm.read_errors()
    with pytest.raises(lowbit.StateMismatchError, match="LOWBIT_COMM_ERROR_FP32"):
        comm.load_errors(ref.save_errors())
    with pytest.raises(lowbit.StateMismatchError, match="keeps them in LOWBIT_COMM_ERROR_FP32"):
        ref.load_errors(blob)
    assert all(np.array_equal(p, q) for p, q in zip(before, comm.read_errors()))
    other = _one_rank(fmt)
    other.load_errors(blob)
    assert all(np.array_equal(p, q) for p, q in zip(before, other.read_errors()))
    for c in (ref, comm, other):
        c.close()


def test_error_format_refused():
    with pytest.raises(lowbit.InvalidArgumentError, match="error_format"):
        _one_rank("fp16")
    with pytest.raises(lowbit.InvalidArgumentError, match="error_format"):
        _one_rank(2)

"""Run under mpirun by test_comm.py: the communicator and 1-bit Adam through
the Python package with mpi4py communicators. Every rank checks its results
against a numpy simulation of the algorithm documented in lowbit_comm.h, and
that all ranks agree bit for bit. Exits non-zero on the first failure.

The random inputs follow the seed convention of the suites (tests/common/
seeding.py): LOWBIT_TEST_SEED (test_comm.py passes the seed of its run), the
fixed default when unset; rank 0's seed is used by every rank."""

import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path[:0] = [p for p in os.environ.get("LOWBIT_TEST_SYSPATH", "").split(os.pathsep) if p]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import lowbit  # noqa: E402
import seeding  # noqa: E402
from float64_reference import Reference  # noqa: E402

world = MPI.COMM_WORLD
rank, W = world.Get_rank(), world.Get_size()
SEED = world.bcast(seeding.seed(), root=0)  # one seed, even with LOWBIT_TEST_SEED=random


def check(cond, what):
    if not cond:
        print(f"rank {rank}: FAILED: {what} (LOWBIT_TEST_SEED={SEED} repeats it)", flush=True)
        world.Abort(1)


def sign(v):
    return np.where(v >= 0, np.float32(1), np.float32(-1)).astype(np.float32)


def scale(v):
    if v.size == 0:
        return np.float32(0)
    return np.float32(np.sqrt(np.sum(v.astype(np.float64) ** 2)) / np.sqrt(v.size))


class Sim:
    """lowbit_comm.h's 1-bit compressed allreduce for all ranks at once."""

    def __init__(self, n, w):
        self.n, self.w = n, w
        self.N = -(-n // (8 * w)) * 8 * w
        self.C = self.N // w
        self.e = [np.zeros(n, np.float32) for _ in range(w)]
        self.z = [np.zeros(max(0, min(n, (r + 1) * self.C) - r * self.C), np.float32) for r in range(w)]

    def run(self, tensors):
        qs, ss = [], []
        for j, t in enumerate(tensors):
            x = (t + self.e[j]).astype(np.float32)
            s = scale(x)
            q = (s * sign(x)).astype(np.float32)
            self.e[j] = (x - q).astype(np.float32)
            qs.append(sign(x))
            ss.append(s)
        out = np.zeros(self.n, np.float32)
        for r in range(self.w):
            lo, hi = r * self.C, min(self.n, (r + 1) * self.C)
            if hi <= lo:
                continue
            acc = np.zeros(hi - lo, np.float32)
            for j in range(self.w):
                acc = (acc + ss[j] * qs[j][lo:hi]).astype(np.float32)
            a = (acc / np.float32(self.w)).astype(np.float32)
            y = (a + self.z[r]).astype(np.float32)
            S = scale(y)
            o = (S * sign(y)).astype(np.float32)
            self.z[r] = (y - o).astype(np.float32)
            out[lo:hi] = o
        return out


def all_tensors(local, comm_py=None):
    return (comm_py or world).allgather(local)


def test_compressed_allreduce(comm_py, n, calls=6):
    rng = seeding.rng("allreduce", n, base=SEED)
    with lowbit.Communicator.from_mpi(comm_py) as comm:
        r, w = comm.rank, comm.world_size
        check((r, w) == (comm_py.Get_rank(), comm_py.Get_size()), "rank/world")
        sim = Sim(n, w)
        fixed = [rng.standard_normal(n).astype(np.float32) * (1 + j) for j in range(w)]
        outs = []
        for t in range(calls):
            x = fixed[r].copy()
            comm.compressed_allreduce(x)
            want = sim.run(fixed)
            check(np.allclose(x, want, rtol=1e-6, atol=1e-7), f"n={n} call {t}: max diff {np.abs(x - want).max()}")
            check(all(np.array_equal(x, o) for o in all_tensors(x, comm_py)), f"n={n} call {t}: ranks disagree")
            outs.append(x.astype(np.float64))
        worker, server = comm.read_errors()
        check(np.allclose(worker, sim.e[r], rtol=1e-6, atol=1e-6), "worker error")
        check(np.allclose(server, sim.z[r], rtol=1e-6, atol=1e-6), "server error")
        # the error-feedback identity of the header
        mean_in = np.mean([f.astype(np.float64) for f in fixed], axis=0)
        lhs = np.mean(outs, axis=0)
        errs = all_tensors((comm.read_errors()[0], server), comm_py)
        e_mean = np.mean([e[0] for e in errs], axis=0)
        z_full = np.concatenate([e[1] for e in errs])[:n]
        rhs = mean_in - (e_mean + z_full) / calls
        check(np.allclose(lhs, rhs, atol=1e-5), "error-feedback identity")
        info = comm.info()
        check(info["bound_numel"] == n and info["padded_numel"] == sim.N and info["chunk_numel"] == sim.C, "info")
        st = comm.stats()
        check(st["compressed_calls"] == calls and st["compressed_elements"] == calls * n, f"stats {st}")

        # checkpoint of the errors, reset, restore
        blob = comm.save_errors()
        comm.reset_errors()
        check(comm.error_numel() == (0, 0), "reset unbinds")
        comm.load_errors(blob)
        x = fixed[r].copy()
        comm.compressed_allreduce(x)
        check(np.allclose(x, sim.run(fixed), rtol=1e-6, atol=1e-7), "after restoring the errors")

        # a NaN on the last rank: every rank raises, nothing changes
        x = fixed[r].copy()
        if r == w - 1:
            x[n // 2] = np.nan
        before = x.copy()
        try:
            comm.compressed_allreduce(x)
            check(False, "NaN input did not raise")
        except lowbit.NonFiniteError as e:
            check(f"rank {w - 1}" in e.message, f"message names the rank: {e.message}")
        check(np.array_equal(x, before, equal_nan=True), "NaN call changed the tensor")
        check(comm.last_nonfinite, "last_nonfinite")
        check(np.array_equal(comm.read_errors()[0], sim.e[r]), "NaN call changed the errors")

        # wrong size for a bound communicator: rejected everywhere
        try:
            comm.compressed_allreduce(np.zeros(n + 1, np.float32))
            check(False, "numel change accepted")
        except lowbit.InvalidArgumentError as e:
            check("numel" in e.message, e.message)

        # uncompressed mean
        y = fixed[r].copy()
        comm.allreduce_mean(y)
        check(np.allclose(y, mean_in, rtol=1e-6, atol=1e-6), "allreduce_mean")
        try:
            comm.allreduce_mean(np.zeros(4, np.float64))
            check(False, "float64 accepted")
        except lowbit.ArrayError:
            pass


def test_onebit_adam():
    """Warm-up steps of 1-bit Adam are Adam on the rank-averaged gradient;
    after freeze_step every rank still holds identical params."""
    rng = seeding.rng("onebit_adam", base=SEED)
    n = 3000
    p = rng.standard_normal(n).astype(np.float32)
    p = world.bcast(p, root=0)
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-8
    ref = Reference("adam", p, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=0.0)
    with lowbit.Communicator.from_mpi(world) as comm, \
            lowbit.Optimizer("onebit_adam", lr=lr, betas=(b1, b2), eps=eps, weight_decay=0.0, bias_correction=True,
                             freeze_step=5) as opt:
        opt.set_comm(comm)
        opt.add_param(p)
        for t in range(1, 11):
            grads = [seeding.rng("onebit_adam_grad", t, j, base=SEED).standard_normal(n).astype(np.float32)
                     for j in range(W)]
            opt.step([grads[rank]])
            check(all(np.array_equal(p, q) for q in all_tensors(p)), f"1-bit Adam step {t}: ranks disagree")
            if t < 5:
                ref.step(np.mean([gg.astype(np.float64) for gg in grads], axis=0))
                check(ref.t == t, "reference step count")
                check(np.allclose(p, ref.p, rtol=1e-4, atol=1e-5), f"warm-up step {t}: {np.abs(p - ref.p).max()}")
        check(np.all(np.isfinite(p)), "finite")


if __name__ == "__main__":
    check(lowbit.has_mpi(), "library built without MPI")
    for n in (1, 37, 1000, 4099):
        test_compressed_allreduce(world, n)
    # a sub-communicator: even and odd ranks apart
    sub = world.Split(color=rank % 2, key=rank)
    test_compressed_allreduce(sub, 257)
    sub.Free()
    test_onebit_adam()
    world.Barrier()
    if rank == 0:
        print(f"mpi_worker: all checks passed at world size {W} (seed {SEED})", flush=True)

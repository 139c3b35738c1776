"""Run under mpirun by test_zeroone_lamb_mpi.py: 0/1 Adam and 1-bit LAMB
through the Python package against float64 references of the algorithms
specified in lowbit.h ("0/1 Adam and 1-bit LAMB"), on every rank, in
lockstep. The references do all their math in float64; only the 1-bit
compressed allreduce (verified on its own against a simulation of
lowbit_comm.h by mpi_worker.py) is delegated to a second communicator with
its own error buffers, fed with the float32 rounding of the reference's
values. Also checked: parameters identical on every rank, the schedules
(the status and the exchanges counted by the communicator), a NaN on one rank
(every rank skips, nothing changes) and checkpoint resume (the same next
step, bit for bit). Exits non-zero on the first failure.

Seeds follow tests/common/seeding.py (LOWBIT_TEST_SEED)."""

import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path[:0] = [p for p in os.environ.get("LOWBIT_TEST_SYSPATH", "").split(os.pathsep) if p]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import lowbit  # noqa: E402
import seeding  # noqa: E402
from lowbit import _lib  # noqa: E402
from lowbit._ffi import ffi  # noqa: E402

world = MPI.COMM_WORLD
rank, W = world.Get_rank(), world.Get_size()
SEED = world.bcast(seeding.seed(), root=0)
SIZES = (3000, 1100)
LR, B1, B2, EPS, WD = 2e-2, 0.9, 0.999, 1e-8, 0.01


def check(cond, what):
    if not cond:
        print(f"rank {rank}: FAILED: {what} (LOWBIT_TEST_SEED={SEED} repeats it)", flush=True)
        world.Abort(1)


def grads_at(t, r, params):
    """Rank r's gradient at step t: a pull toward 0 plus noise that differs per rank."""
    out = []
    for j, p in enumerate(params):
        noise = seeding.rng("zo_lamb_grad", t, r, j, base=SEED).standard_normal(p.size)
        out.append((0.5 * np.asarray(p, np.float64) + (j + 1) * noise).astype(np.float32))
    return out


def close(got, want, what, rtol=2e-4, atol=2e-5):
    """Tight agreement, allowing a handful of elements (a 1-bit sign decided
    differently by a near-zero input that float32 and float64 round apart)."""
    err = np.abs(np.asarray(got, np.float64) - want)
    bad = err > atol + rtol * np.abs(want)
    check(bad.mean() <= 0.005, f"{what}: {bad.sum()} of {bad.size} elements off (max {err.max():.3g})")


def identical_on_all_ranks(arrays, what):
    for a in arrays:
        ref = world.bcast(a if rank == 0 else None, root=0)
        check(np.array_equal(ref, a), f"{what}: ranks disagree")


class Compressor:
    """The reference's 1-bit allreduce: float64 in, float64 out."""

    def __init__(self):
        self.comm = lowbit.Communicator.from_mpi(world.Dup())

    def __call__(self, x):
        buf = np.ascontiguousarray(x, np.float32)
        self.comm.compressed_allreduce(buf)
        return buf.astype(np.float64)


class ZeroOneRef:
    def __init__(self, params, var_freeze, scaler, local_scaler, clipper, comp):
        self.p = [np.asarray(p, np.float64).copy() for p in params]
        self.m = [np.zeros_like(p) for p in self.p]
        self.v = [np.zeros_like(p) for p in self.p]
        self.V, self.scaler, self.lscaler, self.clipper, self.C = var_freeze, scaler, local_scaler, clipper, comp
        self.t, self.var_interval, self.var_counter, self.local_interval, self.local_counter = 0, 1, 0, 1, 0
        self.exchanges = []

    def step(self, g_local, g_all):
        self.t += 1
        t, n = self.t, len(self.p)
        D = [np.sqrt(v) + EPS for v in self.v]
        if t <= self.V and t % self.var_interval == 0:
            self.exchanges.append("average")
            for i in range(n):
                g = np.mean([ga[i].astype(np.float64) for ga in g_all], axis=0)
                self.m[i] = B1 * self.m[i] + (1 - B1) * g
                self.v[i] = B2 * self.v[i] + (1 - B2) * g * g
                self.p[i] = self.p[i] * (1 - LR * WD) - LR * self.m[i] / (np.sqrt(self.v[i]) + EPS)
            self.var_counter += 1
            if self.var_counter == self.scaler:
                self.var_counter, self.var_interval = 0, 2 * self.var_interval
            return
        if t <= self.V:
            self.exchanges.append("1bit")
            gq = np.split(self.C(np.concatenate([g.astype(np.float64) for g in g_local])), np.cumsum(
                [p.size for p in self.p])[:-1])
            for i in range(n):
                self.m[i] = B1 * self.m[i] + (1 - B1) * gq[i]
                self.p[i] = self.p[i] * (1 - LR * WD) - LR * self.m[i] / D[i]
            return
        if t == self.V + 1:
            self.p_sync = [p.copy() for p in self.p]
            self.C.comm.reset_errors()
            self.local_interval, self.local_counter, self.lrs = 1, 0, 0.0
        self.lrs += LR
        m_loc = [B1 * self.m[i] + (1 - B1) * g_local[i] for i in range(n)]
        p_loc = [self.p[i] * (1 - LR * WD) - LR * m_loc[i] / D[i] for i in range(n)]
        if t % self.local_interval == 0:
            self.exchanges.append("sync")
            d = np.split(self.C(np.concatenate([(self.p_sync[i] - p_loc[i]) * D[i] for i in range(n)])),
                         np.cumsum([p.size for p in self.p])[:-1])
            for i in range(n):
                self.m[i] = d[i] / self.lrs
                self.p[i] = self.p_sync[i] - d[i] / D[i]
            self.p_sync = [p.copy() for p in self.p]
            self.lrs = 0.0
        else:
            self.exchanges.append("local")
            self.m, self.p = m_loc, p_loc
        self.local_counter += 1
        if self.local_counter == self.lscaler:
            self.local_counter, self.local_interval = 0, min(self.clipper, 2 * self.local_interval)


class LambRef:
    def __init__(self, params, freeze, comp, o):
        self.p = [np.asarray(p, np.float64).copy() for p in params]
        self.m = [np.zeros_like(p) for p in self.p]
        self.v = [np.zeros_like(p) for p in self.p]
        self.vf = [np.zeros_like(p) for p in self.p]
        self.coeff = [0.0] * len(self.p)
        self.last = [1.0] * len(self.p)
        self.scaling = None
        self.F, self.C, self.o, self.t = freeze, comp, o, 0

    def step(self, g_local, g_all):
        self.t += 1
        o, n = self.o, len(self.p)
        if self.t <= self.F:
            for i in range(n):
                g = np.mean([ga[i].astype(np.float64) for ga in g_all], axis=0)
                self.m[i] = B1 * self.m[i] + (1 - B1) * g
                self.v[i] = B2 * self.v[i] + (1 - B2) * g * g
                u = self.m[i] / (np.sqrt(self.v[i]) + EPS) + WD * self.p[i]
                w, r = np.linalg.norm(self.p[i]), np.linalg.norm(u)
                c = min(max(w / r, o["min_coeff"]), o["max_coeff"]) if w != 0 and r != 0 else 1.0
                if c != 1.0:
                    self.coeff[i] = o["coeff_beta"] * self.coeff[i] + (1 - o["coeff_beta"]) * c
                self.p[i] = self.p[i] - LR * c * u
                if self.t == self.F:
                    self.vf[i] = self.v[i].copy()
            return
        if self.scaling is None:
            rms = [np.linalg.norm(m) / np.sqrt(m.size) for m in self.m]
            self.scaling = [np.mean(rms) / x for x in rms]
        local = np.concatenate([(B1 * self.m[i] + (1 - B1) * g_local[i]) * self.scaling[i] for i in range(n)])
        avg = np.split(self.C(local), np.cumsum([p.size for p in self.p])[:-1])
        for i in range(n):
            mk = avg[i] / self.scaling[i]
            g = (mk - B1 * self.m[i]) / (1 - B1)
            self.vf[i] = B2 * self.vf[i] + (1 - B2) * g * g
            self.m[i] = mk
            D = np.sqrt(self.v[i]) + EPS
            pre = mk / D
            u = pre + WD * self.p[i]
            f = np.max(D / (np.sqrt(self.vf[i]) + EPS))
            rho = min(1.0, np.linalg.norm(pre) / np.linalg.norm(u))
            f = f * rho + (1 - rho)
            f = min(max(f, o["factor_min"]), o["factor_max"])
            f = min(max(f, self.last[i] * (1 - o["factor_threshold"])), self.last[i] * (1 + o["factor_threshold"]))
            self.last[i] = f
            self.p[i] = self.p[i] - LR * self.coeff[i] * f * u


def make_params():
    return [world.bcast(seeding.rng("zo_lamb_init", j, base=SEED).standard_normal(s).astype(np.float32), root=0)
            for j, s in enumerate(SIZES)]


def set_options(opt, **options):
    o = ffi.new("lowbit_onebit_options_t*")
    _lib.call("lowbit_onebit_options_init", o)
    for k, v in options.items():
        setattr(o, k, v)
    opt._call("lowbit_optimizer_set_onebit_options", o)


STATUS_FIELDS = ("step", "phase", "next_full_average", "var_interval", "var_counter", "local_step_interval",
                 "local_step_counter", "next_exchange")


def onebit_status(opt):
    s = ffi.new("lowbit_onebit_status_t*")
    opt._call("lowbit_optimizer_onebit_status", s)
    return {k: getattr(s, k) for k in STATUS_FIELDS}


ALGOS = {"zeroone_adam": lowbit.Algorithm.ZEROONE_ADAM, "onebit_lamb": lowbit.Algorithm.ONEBIT_LAMB}


def make_opt(algo, params, comm, freeze, **options):
    opt = lowbit.Optimizer(ALGOS[algo], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, freeze_step=freeze)
    opt.set_comm(comm)
    for p in params:
        opt.add_param(p)
    if options:
        set_options(opt, **options)
    return opt


def run_zeroone():
    params = make_params()
    V, scaler, lscaler, clipper = 9, 2, 3, 4
    comp = Compressor()
    ref = ZeroOneRef(params, V, scaler, lscaler, clipper, comp)
    with lowbit.Communicator.from_mpi(world) as comm, make_opt(
            "zeroone_adam", params, comm, V, var_update_scaler=scaler, local_step_scaler=lscaler,
            local_step_clipper=clipper) as opt:
        got = []
        for t in range(1, 31):
            status = onebit_status(opt)
            g_all = [grads_at(t, r, params) for r in range(W)]
            opt.step(g_all[rank])
            ref.step(g_all[rank], g_all)
            got.append({1: "average", 2: "1bit" if t <= V else "sync", 0: "local"}[status["next_exchange"]])
            check(got[-1] == ref.exchanges[-1], f"0/1 Adam step {t}: exchange {got[-1]}, reference "
                                               f"{ref.exchanges[-1]}")
            check(status["next_full_average"] == (got[-1] == "average"), f"0/1 Adam step {t}: next_full_average")
            if got[-1] != "local":  # local steps apply each rank's own gradient
                identical_on_all_ranks(params, f"0/1 Adam step {t}")
            for i, p in enumerate(params):
                close(p, ref.p[i], f"0/1 Adam step {t} param {i}")
                close(opt.read_moment(i, 0), ref.m[i], f"0/1 Adam step {t} m {i}", atol=1e-4)
        # the schedule: variance steps 1, 2, 4, 6, 8 (interval 1, 2, then 4 after 2 each), then syncs at
        # intervals 1, 2, 4 (doubling every 3 phase-2 steps, capped at 4)
        check([e for e in got[:V]] == ["average", "average", "1bit", "average", "1bit", "average", "1bit",
                                       "average", "1bit"], f"0/1 Adam phase 1 schedule {got[:V]}")
        # steps 10-12 at interval 1, 13-15 at 2 (syncs at even t), 16-18 at 4 (t % 4 == 0)
        check(got[V:V + 9] == ["sync", "sync", "sync", "local", "sync", "local", "sync", "local", "local"],
              f"0/1 Adam phase 2 schedule {got[V:V + 9]}")
        check("local" in got[V + 9:] and got[V + 9:].count("sync") >= 3, f"0/1 Adam late schedule {got[V + 9:]}")
    comp.comm.close()


def run_lamb():
    params = make_params()
    params[1] *= 0.05  # tensors of different scales: the scaling matters
    F = 6
    o = dict(max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9, factor_max=4.0, factor_min=0.5, factor_threshold=0.1)
    comp = Compressor()
    ref = LambRef(params, F, comp, o)
    with lowbit.Communicator.from_mpi(world) as comm, make_opt("onebit_lamb", params, comm, F, **o) as opt:
        for t in range(1, 21):
            status = onebit_status(opt)
            check(status["next_exchange"] == (1 if t <= F else 2), f"LAMB step {t}: exchange")
            g_all = [grads_at(t, r, params) for r in range(W)]
            opt.step(g_all[rank])
            ref.step(g_all[rank], g_all)
            identical_on_all_ranks(params, f"LAMB step {t}")
            for i, p in enumerate(params):
                close(p, ref.p[i], f"LAMB step {t} param {i}")
    comp.comm.close()


def run_nan_and_resume(algo, freeze, steps):
    """A NaN gradient on the last rank at every kind of step: every rank
    skips, nothing changes; then save, step, load, step: the same bits."""
    params = make_params()
    with lowbit.Communicator.from_mpi(world) as comm, make_opt(algo, params, comm, freeze, var_update_scaler=2,
                                                                local_step_scaler=2, local_step_clipper=4) as opt:
        for t in range(1, steps + 1):
            g = grads_at(t, rank, params)
            if t % 3 == 0:  # first a NaN on the last rank only
                bad = [x.copy() for x in g]
                if rank == W - 1:
                    bad[1][7] = np.nan
                before = [p.copy() for p in params] + [opt.read_moment(i, k) for i in range(2) for k in range(2)]
                status = onebit_status(opt)
                opt.step(bad)
                check(opt.last_step_skipped, f"{algo} step {t}: NaN on rank {W - 1} not skipped here")
                after = [p.copy() for p in params] + [opt.read_moment(i, k) for i in range(2) for k in range(2)]
                check(all(np.array_equal(a, b) for a, b in zip(before, after)), f"{algo} step {t}: skip changed state")
                check(onebit_status(opt) == status, f"{algo} step {t}: skip moved the schedule")
            opt.step(g)
            check(not opt.last_step_skipped, f"{algo} step {t}: skipped")
        if algo == "onebit_lamb":
            identical_on_all_ranks(params, f"{algo} after NaN steps")
        blob, errors = opt.save(), comm.save_errors()
        saved = [p.copy() for p in params]
        g = grads_at(steps + 1, rank, params)
        opt.step(g)
        first = [p.copy() for p in params]
        for p, s in zip(params, saved):
            p[...] = s
        opt.load(blob)
        comm.load_errors(errors)
        opt.step(g)
        check(all(np.array_equal(a, b) for a, b in zip(first, params)), f"{algo}: resume gives another next step")


if __name__ == "__main__":
    check(lowbit.has_mpi(), "library built without MPI")
    run_zeroone()
    run_lamb()
    run_nan_and_resume("zeroone_adam", 5, 16)
    run_nan_and_resume("onebit_lamb", 5, 12)
    world.Barrier()
    if rank == 0:
        print(f"mpi_zeroone_lamb_worker: all checks passed at world size {W} (seed {SEED})", flush=True)

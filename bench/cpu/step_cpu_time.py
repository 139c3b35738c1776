"""lowbit.Optimizer vs torch.optim on one thread, by process CPU time (robust
when other work shares the machine, unlike wall-clock rounds):

    python3 bench/cpu/step_cpu_time.py [--n 8000000] [--steps 20]

fp32 params and state, AdamW / RMSprop / Adagrad, torch's fused and foreach
forms where it has them. Prints ms of CPU per step."""

import argparse
import time

import _common  # noqa: F401  (library path, OMP_WAIT_POLICY)
import numpy as np
import torch

import lowbit


def cpu_ms(step, k):
    step()
    t = time.process_time()
    for _ in range(k):
        step()
    return (time.process_time() - t) / k * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8_000_000)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    p = rng.standard_normal(args.n).astype(np.float32)
    g = rng.standard_normal(args.n).astype(np.float32)
    for algo, cls in (("adamw", torch.optim.AdamW), ("rmsprop", torch.optim.RMSprop), ("adagrad", torch.optim.Adagrad)):
        q = p.copy()
        with lowbit.Optimizer(algo, lr=1e-3, num_threads=1) as opt:
            opt.add_param(q)
            row = {"lowbit": cpu_ms(lambda: opt.step([g]), args.steps)}
        w = torch.nn.Parameter(torch.from_numpy(p.copy()))
        w.grad = torch.from_numpy(g.copy())
        for mode in ("fused", "foreach"):
            try:
                o = cls([w], lr=1e-3, **{mode: True})
            except (TypeError, RuntimeError):
                continue  # torch has no such form of this optimizer
            row[f"torch {mode}"] = cpu_ms(o.step, args.steps)
        print(f"{algo:8s} " + "  ".join(f"{k} {v:.2f} ms" for k, v in row.items()))


if __name__ == "__main__":
    main()

"""Muon's step time on one square fp32 param: lowbit.torch.Muon (fp32 state,
ns_precision "fp32" and "bf16") against torch.optim.Muon, in one process.

    LOWBIT_LIBRARY=build/liblowbit.so PYTHONPATH=bindings \\
        python3 bench/muon/ns_time.py [--n 2048] [--steps 10] [--threads 2] [--device cpu|cuda]

Per optimizer, after 2 warm-up steps, --steps steps on fixed random grads:

* step: median (and min) wall time of opt.step(), and the total of the
  timed steps (on CUDA each timed step ends with a synchronize);
* NS: the Newton-Schulz part of a step, from the fastest of the timed
  calls. torch: its own function
  (torch.optim._muon._zeropower_via_newtonschulz) timed alone on the same
  matrix. lowbit: the Python side sees whole steps only, so NS is estimated
  from two optimizers that differ only in ns_steps (5 and 1):
  NS(5) = (min step(5) - min step(1)) * 5 / 4 (one iteration is 3 products
  of the same size, and in bf16 their roundings; the rest of the step does
  not depend on ns_steps);
* rest: min step - NS (momentum, norm, scaling, the param update, Python).
* GFLOP/s of NS: 5 iterations x 3 products of 2 n^3 flops each (X X^T,
  A A, B X for a square n x n matrix).

Threads: torch.set_num_threads(--threads), which lowbit.torch also takes
for its CPU engine; lowbit's products run in OpenBLAS, whose threads are
OPENBLAS_NUM_THREADS's (this script sets it to --threads before loading the
library unless it is set). On the CPU lowbit's "bf16" products run in
oneDNN's bf16 matmul when the build found oneDNN (libdnnl-dev; else fp32
sgemm products rounded to bf16, at "fp32"'s cost), and its "fp32" products
in OpenBLAS (sgemm, ssyrk for the two symmetric ones); torch's bf16 products
run in its own bf16 GEMM (oneDNN).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2048, help="the param is n x n (default 2048)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per optimizer")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    return ap.parse_args()


def main() -> None:
    args = parse()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    import torch

    import lowbit
    import lowbit.torch as lt

    torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    n = args.n
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(n, n, generator=gen) * 0.02
    grads = [torch.randn(n, n, generator=gen).to(device) for _ in range(4)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def time_steps(make):
        p = init.clone().to(device).requires_grad_()
        opt = make([p])
        times = []
        for i in range(args.warmup + args.steps):
            p.grad = grads[i % len(grads)]
            sync()
            t = time.perf_counter()
            opt.step()
            sync()
            if i >= args.warmup:
                times.append(time.perf_counter() - t)
        return times

    def time_torch_ns():
        from torch.optim._muon import _zeropower_via_newtonschulz

        times = []
        for i in range(args.warmup + args.steps):
            g = grads[i % len(grads)]
            sync()
            t = time.perf_counter()
            _zeropower_via_newtonschulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)
            sync()
            if i >= args.warmup:
                times.append(time.perf_counter() - t)
        return times

    flops = 5 * 3 * 2 * n ** 3
    rows = []
    have_torch_muon = hasattr(torch.optim, "Muon")
    if have_torch_muon:
        step = time_steps(lambda ps: torch.optim.Muon(ps, lr=0.02))
        ns = min(time_torch_ns())
        rows.append(("torch.optim.Muon", "bf16 (torch)", step, ns))
    for prec in ("fp32", "bf16"):
        step5 = time_steps(lambda ps: lt.Muon(ps, lr=0.02, state="fp32", ns_precision=prec))
        step1 = time_steps(lambda ps: lt.Muon(ps, lr=0.02, state="fp32", ns_precision=prec, ns_steps=1))
        ns = (min(step5) - min(step1)) * 5 / 4  # the fastest steps: the least noise in a difference
        rows.append(("lowbit.torch.Muon", prec, step5, ns))

    if device.type == "cpu":
        where = f"torch threads {torch.get_num_threads()}, OPENBLAS_NUM_THREADS {os.environ['OPENBLAS_NUM_THREADS']}"
    else:
        where = torch.cuda.get_device_name(device)
    print(f"Muon, one {n}x{n} fp32 param, fp32 state, {device} ({where}); lowbit {lowbit.version()}, "
          f"torch {torch.__version__}; {args.steps} timed steps after {args.warmup}")
    head = f"{'optimizer':<20} {'NS precision':<13} {'step median ms':>15} {'step min ms':>12} {'total s':>8} " \
           f"{'NS ms':>9} {'rest ms':>8} {'NS GFLOP/s':>11}"
    print(head)
    print("-" * len(head))
    for name, prec, step, ns in rows:
        med = statistics.median(step)
        print(f"{name:<20} {prec:<13} {med * 1e3:15.1f} {min(step) * 1e3:12.1f} {sum(step):8.2f} {ns * 1e3:9.1f} "
              f"{(min(step) - ns) * 1e3:8.1f} {flops / ns / 1e9 if ns > 0 else float('nan'):11.1f}")
    if have_torch_muon:
        base = statistics.median(rows[0][2])
        for name, prec, step, _ in rows[1:]:
            print(f"{name} ({prec}) step time / torch.optim.Muon's: {statistics.median(step) / base:.2f}")


if __name__ == "__main__":
    main()

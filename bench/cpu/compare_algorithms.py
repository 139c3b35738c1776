"""The algorithms added through the descriptors (issue 46) against their
torch.optim peers on the CPU, in one process: lowbit.torch.RMSprop and
Adagrad (fp32 and 8-bit state) vs torch.optim.RMSprop(foreach=True) and
torch.optim.Adagrad(fused=True where torch has it, else foreach), fp32
params, the same grads.

    OMP_WAIT_POLICY=PASSIVE python3 bench/cpu/compare_algorithms.py [--threads 2] [--rounds 9]
        [--numel 2000000] [--tensors 16]

Timing as bench/cpu/compare_torch.py: one warm-up step each, then --rounds
rounds of one timed step, the order rotated every round; the table gives the
median ms/step and "vs torch" = the median over rounds of lowbit's time /
the peer's in the same round. "GB/s" = bytes the step must move (param read
+ write, grad read, state read + write) / median time. The header names the
CPU and the level that ran (LOWBIT_CPU_KERNELS forces one)."""

from __future__ import annotations

import argparse
import sys

import _common  # sets OMP_WAIT_POLICY and the library path before the imports below
from _common import interleave, loadavg, med, paired_ratio, spread, table

try:
    import torch
except ImportError:
    print("compare_algorithms: torch is not installed; nothing to compare against, skipped")
    sys.exit(0)

import lowbit
import lowbit.torch as lbt
from compare_torch import cpu_model

STATE_BYTES = {"fp32": 4, "8bit": 1 + 4 / 256}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--numel", type=int, default=2_000_000)
    ap.add_argument("--tensors", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = args.numel * args.tensors
    info = lowbit.build_info()
    print(f"CPU: {cpu_model()}; lowbit CPU kernels: {info.get('cpu_kernels', '?')}; threads {args.threads}; "
          f"{args.tensors} x {args.numel} fp32 params; load {loadavg()}")
    g = torch.Generator().manual_seed(1)
    init = [torch.randn(args.numel, generator=g) for _ in range(args.tensors)]
    grads = [torch.randn(args.numel, generator=g) * 1e-3 for _ in range(args.tensors)]

    def params():
        ps = [t.clone().requires_grad_(True) for t in init]
        for p, gr in zip(ps, grads):
            p.grad = gr
        return ps

    algos = {
        "rmsprop": (lbt.RMSprop, torch.optim.RMSprop, dict(lr=1e-3, alpha=0.99), 1, dict(foreach=True)),
        "rmsprop-momentum": (lbt.RMSprop, torch.optim.RMSprop, dict(lr=1e-3, momentum=0.9), 2, dict(foreach=True)),
        "adagrad": (lbt.Adagrad, torch.optim.Adagrad, dict(lr=1e-2), 1, None),
    }
    rows = []
    for name, (mine, peer, kw, moments, peer_opts) in algos.items():
        cands, state_of = {}, {}
        if peer_opts is None:  # Adagrad: torch's fused CPU kernel where it has one
            try:
                opt = peer(params(), **kw, fused=True)
                opt.step()
                peer_label = "fused"
            except (RuntimeError, TypeError, ValueError):
                opt, peer_label = peer(params(), **kw, foreach=True), "foreach"
        else:
            opt, peer_label = peer(params(), **kw, **peer_opts), "foreach"
        cands[f"torch {peer_label}"] = opt.step
        for state in ("fp32", "8bit"):
            o = mine(params(), **kw, state=state, skip_nonfinite=False)
            cands[f"lowbit {state}"] = o.step
            state_of[f"lowbit {state}"] = state
        times = interleave(cands, args.rounds)
        ref = f"torch {peer_label}"
        for c, ts in times.items():
            st = state_of.get(c, "fp32")
            moved = n * (4 * 2 + 4 + moments * 2 * STATE_BYTES[st])
            vs = f"{paired_ratio(ts, times[ref]):.2f}x" if c != ref else "1x"
            rows.append((name, c, f"{1e3 * med(ts):.1f}", spread(ts), f"{moved / med(ts) / 1e9:.1f}", vs))
    print(table(rows, ("algorithm", "candidate", "ms/step", "spread", "GB/s", "vs torch")))


if __name__ == "__main__":
    main()

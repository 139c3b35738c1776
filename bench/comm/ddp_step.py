"""Training-step time and bytes on the wire of DDP + torch.optim.Adam against
DDP + a lowbit.torch 1-bit optimizer (OneBitAdam, ZeroOneAdam or OneBitLamb,
with onebit_ddp_comm_hook) on the same model, under torchrun on CPU (gloo).
Run by shaped_ddp.sh inside a rate-limited network namespace; rank 0 prints
one line: rate label, ranks, params, ms/step of each, DDP's fp32 bytes per
step, the lowbit optimizer's bytes per step (the transport's counters: its
exchanges and agreements plus the hook's all-reduces), optimizer.

    torchrun --standalone --nproc-per-node 2 bench/comm/ddp_step.py [label] [width] [steps]
        [--optimizer {onebit_adam,zeroone_adam,onebit_lamb,adam}] [--local-steps K]

The lowbit optimizers are timed after their warm-up: 1-bit Adam and 1-bit
LAMB in their compressed stage, 0/1 Adam in phase 2 with a constant local
interval of K steps (local_step_scaler=1, local_step_clipper=K: one 1-bit
exchange every K steps; the timed steps are a multiple of K). ``adam`` runs
DDP + torch.optim.Adam only.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lowbit.torch as lt

FREEZE = 3  # warm-up steps of the lowbit optimizers (0/1 Adam: var_freeze_step)


def model(width, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.Tanh())], nn.Linear(width, 1))


def make_lowbit(name, local_steps):
    if name == "onebit_adam":
        return lambda p: lt.OneBitAdam(p, lr=1e-4, freeze_step=FREEZE, num_threads=1)
    if name == "zeroone_adam":
        return lambda p: lt.ZeroOneAdam(p, lr=1e-4, var_freeze_step=FREEZE, local_step_scaler=1,
                                        local_step_clipper=local_steps, num_threads=1)
    if name == "onebit_lamb":
        return lambda p: lt.OneBitLamb(p, lr=1e-4, freeze_step=FREEZE, num_threads=1)
    raise ValueError(name)


def warm_steps(name, local_steps):
    """Steps before the timed ones: past the warm-up (0/1 Adam: until its
    local interval is K and the next step starts an interval)."""
    if name == "zeroone_adam":
        w = FREEZE + 2 * local_steps
        return -(-w // local_steps) * local_steps
    return FREEZE + 2


def timed(make_opt, width, steps, hook, warm):
    net = DDP(model(width))
    opt = make_opt(net.parameters())
    if hook:
        net.register_comm_hook(None, lt.onebit_ddp_comm_hook(opt))
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(16, width, generator=g), torch.randn(16, 1, generator=g)
    times = []
    for t in range(warm + steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        dist.barrier()
        if t >= warm:
            times.append(time.perf_counter() - t0)
        if t == warm - 1 and hook:
            opt.communicator.transport.reset_counters()
    sent = opt.communicator.transport.wire_bytes_sent() / steps if hook else None
    return sorted(times)[len(times) // 2] * 1e3, sent, sum(p.numel() for p in net.parameters())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("label", nargs="?", default="-")
    ap.add_argument("width", nargs="?", type=int, default=2048)
    ap.add_argument("steps", nargs="?", type=int, default=5)
    ap.add_argument("--optimizer", choices=("onebit_adam", "zeroone_adam", "onebit_lamb", "adam"),
                    default="onebit_adam")
    ap.add_argument("--local-steps", type=int, default=4, help="0/1 Adam's local interval K (default 4)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    W = dist.get_world_size()
    steps = args.steps
    if args.optimizer == "zeroone_adam":
        steps = max(steps, args.local_steps)
        steps = -(-steps // args.local_steps) * args.local_steps
    adam_ms, _, n = timed(lambda p: torch.optim.Adam(p, lr=1e-4), args.width, steps, hook=False, warm=2)
    ddp_bytes = 2 * (W - 1) * 4 * n // W
    lowbit_ms, sent = None, ddp_bytes  # adam: DDP's own all-reduce only
    if args.optimizer != "adam":
        lowbit_ms, sent, _ = timed(make_lowbit(args.optimizer, args.local_steps), args.width, steps, hook=True,
                                   warm=warm_steps(args.optimizer, args.local_steps))
    if dist.get_rank() == 0:
        ms, speedup = ("-", "-") if args.optimizer == "adam" else (f"{lowbit_ms:.1f}", f"{adam_ms / lowbit_ms:.1f}x")
        print(f"{args.label:<10} {W:>5} {n:>10,} {adam_ms:>14.1f} {ms:>16} {speedup:>9} "
              f"{ddp_bytes:>14,} {int(sent):>12,} {args.optimizer}", flush=True)
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()

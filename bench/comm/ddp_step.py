"""Training-step time of DDP + torch.optim.Adam against DDP + lowbit.torch.OneBitAdam
(with onebit_ddp_comm_hook) on the same model, under torchrun on CPU (gloo).
Run by shaped_ddp.sh inside a rate-limited network namespace; rank 0 prints one
line: rate label, params, ms/step of each, bytes sent per step by each.

    torchrun --standalone --nproc-per-node 2 bench/comm/ddp_step.py [label] [width] [steps]
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lowbit.torch as lt


def model(width, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.Tanh())], nn.Linear(width, 1))


def timed(make_opt, width, steps, hook, freeze=None):
    net = DDP(model(width))
    opt = make_opt(net.parameters())
    if hook:
        net.register_comm_hook(None, lt.onebit_ddp_comm_hook(opt))
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(16, width, generator=g), torch.randn(16, 1, generator=g)
    warm = (freeze or 0) + 2  # past the freeze: the compressed stage is what is timed
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
    sent = opt.communicator.transport.total_bytes_sent() / steps if hook else None
    return sorted(times)[len(times) // 2] * 1e3, sent, sum(p.numel() for p in net.parameters())


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "-"
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    W = dist.get_world_size()
    adam_ms, _, n = timed(lambda p: torch.optim.Adam(p, lr=1e-4), width, steps, hook=False)
    onebit_ms, sent, _ = timed(lambda p: lt.OneBitAdam(p, lr=1e-4, freeze_step=3, num_threads=1), width, steps,
                               hook=True, freeze=3)
    ddp_bytes = 2 * (W - 1) * 4 * n // W
    if dist.get_rank() == 0:
        print(f"{label:<10} {W:>5} {n:>10,} {adam_ms:>14.1f} {onebit_ms:>16.1f} {adam_ms / onebit_ms:>8.1f}x "
              f"{ddp_bytes:>14,} {int(sent):>12,}", flush=True)
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()

"""What the worker / server errors in low bit cost in loss (issue 48, item 3):
DDP + lowbit.torch's 1-bit optimizers with error_format fp32, bf16 and int8
against DDP + torch.optim.Adam, on CPU with gloo, the same model, data and
schedule for every row (the regression MLP of tests/python/torch_onebit_worker.py,
width --hidden). Reports the final loss over the whole data (mean over ranks),
its ratio to Adam's and to the fp32-error row, whether the params are the same
on every rank, and the bytes of the errors per param per rank: in the
checkpoint blob (the errors' own bytes) and resident in the communicator
(fp32 also keeps two workspaces of the same size; the compact formats none).

    torchrun --nproc-per-node 2 bench/torch/onebit_error_formats.py [--seeds 1,2] [--steps 800] [--hidden 64]
"""
import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lowbit.torch as lt

BATCH = 64


def model(seed, hidden):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def data(seed, rank, n=4096):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 1, generator=g) / 4
    g = torch.Generator().manual_seed(seed * 1000 + rank + 1)
    x = torch.randn(n, 32, generator=g)
    y = torch.sin(x @ teacher) + 0.3 * torch.randn(n, 1, generator=g)
    return x, y


def error_bytes(fmt, count):
    return {"fp32": 4 * count, "bf16": 2 * count, "int8": count + 4 * ((count + 255) // 256)}[fmt]


def train(args, seed, make_opt):
    rank = dist.get_rank()
    net = model(seed, args.hidden)
    ddp = DDP(net)
    opt = make_opt(net.parameters())
    if isinstance(opt, lt.OneBitAdam | lt.ZeroOneAdam | lt.OneBitLamb):
        ddp.register_comm_hook(None, lt.onebit_ddp_comm_hook(opt))
    x, y = data(seed, rank)
    g = torch.Generator().manual_seed(seed * 7 + rank)
    for _ in range(args.steps):
        idx = torch.randint(0, x.shape[0], (BATCH,), generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x[idx]), y[idx]).backward()
        opt.step()
    with torch.no_grad():
        loss = nn.functional.mse_loss(net(x), y)
    dist.all_reduce(loss)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    row = {"loss": loss.item() / dist.get_world_size(), "same": bool(torch.equal(flat, ref))}
    if hasattr(opt, "communicator"):
        comm = opt.communicator
        n, c = comm.error_numel()
        fmt = comm.error_format
        numel = sum(p.numel() for p in net.parameters())
        row["params"] = numel
        row["blob_bytes_per_param"] = (len(comm.save_errors()) - 64) / numel
        resident = error_bytes(fmt, n) + error_bytes(fmt, c)
        row["resident_bytes_per_param"] = (2 * resident if fmt == "fp32" else resident) / numel
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--freeze", type=int, default=150)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--optimizers", default="OneBitAdam,ZeroOneAdam,OneBitLamb")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    makers = {
        "OneBitAdam": lambda f: (lambda p: lt.OneBitAdam(p, lr=args.lr, freeze_step=args.freeze, error_format=f)),
        "ZeroOneAdam": lambda f: (lambda p: lt.ZeroOneAdam(p, lr=args.lr, var_freeze_step=args.freeze,
                                                           error_format=f)),
        "OneBitLamb": lambda f: (lambda p: lt.OneBitLamb(p, lr=args.lr, freeze_step=args.freeze, error_format=f)),
    }
    out = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        rows = {"DDP + Adam": train(args, seed, lambda p: torch.optim.Adam(p, lr=args.lr))}
        for name in args.optimizers.split(","):
            for fmt in ("fp32", "bf16", "int8"):
                rows[f"{name} {fmt}"] = train(args, seed, makers[name](fmt))
        out[seed] = rows
        if dist.get_rank() == 0:
            ref = rows["DDP + Adam"]["loss"]
            print(f"world {dist.get_world_size()}, seed {seed}, {args.steps} steps, freeze {args.freeze}, "
                  f"lr {args.lr}, hidden {args.hidden}")
            print(f"{'':18s} {'loss':>8s} {'/ Adam':>7s} {'/ fp32 err':>10s} {'same':>5s} {'blob B/param':>12s} "
                  f"{'resident B/param':>16s}")
            for k, r in rows.items():
                fp32 = rows.get(k.rsplit(" ", 1)[0] + " fp32", r)["loss"]
                print(f"{k:18s} {r['loss']:8.5f} {r['loss'] / ref:7.4f} {r['loss'] / fp32:10.4f} "
                      f"{str(r['same']):>5s} {r.get('blob_bytes_per_param', 0):12.4f} "
                      f"{r.get('resident_bytes_per_param', 0):16.4f}")
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"args": vars(args), "seeds": out}))
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()

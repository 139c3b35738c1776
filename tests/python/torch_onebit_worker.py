"""Run by torchrun (tests/python/test_torch_onebit.py): DDP + lowbit.torch
OneBitAdam against DDP + torch.optim.Adam on the same model and data, on
CPU with gloo, or with LOWBIT_TORCHRUN_DEVICE=cuda on CUDA tensors over NCCL
(one GPU per rank; the train and resume cases). Rank 0 prints one JSON line
of results; every rank checks what it can (params identical on all ranks)
and exits non-zero on failure.

    torchrun --nproc-per-node N torch_onebit_worker.py <case>[,<case>...] <seed>
case: train | resume | bad_sizes | nonfinite | local_error | error_formats
Several cases, comma-separated, run one after the other in one launch (a
launch costs seconds of torchrun and torch imports); the JSON line then holds
each case's results under its name.
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lowbit.torch as lt

STEPS, FREEZE, LR = 800, 150, 1e-3
CUDA = os.environ.get("LOWBIT_TORCHRUN_DEVICE", "cpu") == "cuda"


def device():
    """This rank's device: the CPU, or (CUDA) the GPU of its local rank."""
    if not CUDA:
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def model(seed, hidden=64):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    return net.to(device())


def data(seed, rank, n=4096):
    """This rank's shard of one noisy regression task (the teacher is shared)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 1, generator=g) / 4
    g = torch.Generator().manual_seed(seed * 1000 + rank + 1)
    x = torch.randn(n, 32, generator=g)
    y = torch.sin(x @ teacher) + 0.3 * torch.randn(n, 1, generator=g)
    return x.to(device()), y.to(device())


BATCH = 64


def global_loss(net, x, y):
    with torch.no_grad():
        loss = nn.functional.mse_loss(net(x), y)
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()


def same_on_all_ranks(net):
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    return bool(torch.equal(flat, ref))


def train(seed, make_opt, steps=STEPS, hook=False, on_step=None, nan_steps=()):
    rank = dist.get_rank()
    net = model(seed)
    ddp = DDP(net, device_ids=[device().index]) if CUDA else DDP(net)
    opt = make_opt(net.parameters())
    if hook:
        ddp.register_comm_hook(None, lt.onebit_ddp_comm_hook(opt))
    x, y = data(seed, rank)
    g = torch.Generator().manual_seed(seed * 7 + rank)
    for t in range(steps):
        idx = torch.randint(0, x.shape[0], (BATCH,), generator=g).to(x.device)  # a fresh minibatch per step
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x[idx]), y[idx])
        if t in nan_steps and rank == dist.get_world_size() - 1:
            loss = loss * float("nan")  # a NaN in this rank's backward, before DDP's all-reduce
        loss.backward()
        if on_step:
            on_step(t, net, opt)
        opt.step()
    return net, opt, x, y


def case_train(seed):
    out = {}
    net, _, x, y = train(seed, lambda p: torch.optim.Adam(p, lr=LR))
    out["adam_loss"] = global_loss(net, x, y)
    out["adam_same"] = same_on_all_ranks(net)
    bytes_per_step = []

    def count(t, net, opt):
        if t in (FREEZE - 5, FREEZE + 10):
            opt.communicator.transport.reset_counters()
        if t in (FREEZE - 4, FREEZE + 11):
            bytes_per_step.append(opt.communicator.transport.total_bytes_sent())

    net, opt, x, y = train(seed, lambda p: lt.OneBitAdam(p, lr=LR, freeze_step=FREEZE), hook=True, on_step=count)
    out["onebit_loss"] = global_loss(net, x, y)
    out["onebit_same"] = same_on_all_ranks(net)
    numel = sum(p.numel() for p in net.parameters())
    W = dist.get_world_size()
    out["numel"] = numel
    out["ddp_fp32_bytes_per_step"] = 2 * (W - 1) * 4 * numel // W
    out["warmup_bytes_per_step"], out["compressed_bytes_per_step"] = bytes_per_step
    out["comm_stats"] = opt.communicator.stats()
    return out


def case_resume(seed):
    """Save at step K, take step K+1, restore, take step K+1 again: the same
    bits (before and after the freeze)."""
    out = {}
    for K in (FREEZE - 10, FREEZE + 10):
        saved = {}

        def snap(t, net, opt):
            if t == K:
                saved["model"] = {k: v.clone() for k, v in net.state_dict().items()}
                saved["opt"] = opt.state_dict()
                saved["grads"] = [p.grad.clone() for p in net.parameters()]

        net, opt, x, y = train(seed, lambda p: lt.OneBitAdam(p, lr=LR, freeze_step=FREEZE), steps=K + 1,
                               hook=True, on_step=snap)
        after = [p.detach().clone() for p in net.parameters()]
        # a fresh model and optimizer, restored from the snapshot
        net2 = model(seed + 1)
        net2.load_state_dict(saved["model"])
        opt2 = lt.OneBitAdam(net2.parameters(), lr=LR, freeze_step=FREEZE)
        for p, g in zip(net2.parameters(), saved["grads"]):
            p.grad = torch.zeros_like(p)  # registration needs a grad
        opt2.load_state_dict(saved["opt"])
        for p, g in zip(net2.parameters(), saved["grads"]):
            p.grad = g.clone()
        opt2.step()
        out[f"resume_equal_at_{K}"] = all(torch.equal(a, b) for a, b in zip(after, net2.parameters()))
    return out


def error_bytes(fmt, count):
    """Bytes of `count` errors in `fmt` (docs/COMMUNICATOR.md, section 5b)."""
    return {"fp32": 4 * count, "bf16": 2 * count, "int8": count + 4 * ((count + 255) // 256)}[fmt]


def case_error_formats(seed):
    """The 1-bit optimizers with their errors in bf16 and 8-bit blocks
    (error_format=): params identical on all ranks after the freeze; the
    error blob holds the errors in their format (its size); save at a step
    after the freeze, step, restore into a fresh optimizer of the same
    format, step again: the same bits; an optimizer of another format
    refuses the state dict with nothing changed; bad formats refused."""
    from lowbit import StateMismatchError

    out = {}
    W, rank = dist.get_world_size(), dist.get_rank()
    makers = {"OneBitAdam": lambda p, f: lt.OneBitAdam(p, lr=LR, freeze_step=20, error_format=f),
              "ZeroOneAdam": lambda p, f: lt.ZeroOneAdam(p, lr=LR, var_freeze_step=20, error_format=f),
              "OneBitLamb": lambda p, f: lt.OneBitLamb(p, lr=LR, freeze_step=20, error_format=f)}
    K = 30
    for fmt in ("bf16", "int8"):
        for name, make in makers.items():
            saved = {}

            def snap(t, net, opt):
                if t == K:
                    saved["model"] = {k: v.clone() for k, v in net.state_dict().items()}
                    saved["opt"] = opt.state_dict()
                    saved["grads"] = [p.grad.clone() for p in net.parameters()]

            net, opt, x, y = train(seed, lambda p: make(p, fmt), steps=K + 1, hook=True,
                                   on_step=snap)
            after = [p.detach().clone() for p in net.parameters()]
            row = {"same": same_on_all_ranks(net), "format": opt.communicator.error_format,
                   "loss_finite": bool(torch.isfinite(torch.tensor(global_loss(net, x, y))))}
            blob = saved["opt"]["lowbit"]["comm_errors"]
            n = opt.communicator.error_numel()
            row["error_numel"] = list(n)
            row["blob_bytes_ok"] = n[0] > 0 and blob.numel() == 64 + error_bytes(fmt, n[0]) + error_bytes(fmt, n[1])
            # restore into a fresh optimizer of the same format: the same bits
            net2 = model(seed + 1)
            net2.load_state_dict(saved["model"])
            opt2 = make(net2.parameters(), fmt)
            for p in net2.parameters():
                p.grad = torch.zeros_like(p)
            opt2.load_state_dict(saved["opt"])
            for p, g in zip(net2.parameters(), saved["grads"]):
                p.grad = g.clone()
            opt2.step()
            row["resume_equal"] = all(torch.equal(a, b) for a, b in zip(after, net2.parameters()))
            # another format refuses the state dict, nothing changed
            other = "fp32" if fmt == "int8" else "int8"
            net3 = model(seed + 2)
            opt3 = make(net3.parameters(), other)
            before = opt3.state_dict()
            try:
                opt3.load_state_dict(saved["opt"])
                row["other_format_refused"] = False
            except StateMismatchError as e:
                row["other_format_refused"] = "keeps them in" in str(e)
            row["other_unchanged"] = bool(torch.equal(opt3.state_dict()["lowbit"]["comm_errors"],
                                                      before["lowbit"]["comm_errors"]))
            out[f"{fmt}/{name}"] = row
    # bad input, before anything is made
    refusals = {}
    for bad in ("fp16", 8, "INT8"):
        try:
            lt.OneBitAdam(model(seed).parameters(), lr=LR, error_format=bad)
            refusals[repr(bad)] = False
        except ValueError as e:
            refusals[repr(bad)] = "error_format" in str(e)
    comm = lt.process_group_communicator(error_format="bf16")
    try:
        lt.OneBitAdam(model(seed).parameters(), lr=LR, communicator=comm, error_format="int8")
        refusals["communicator of another format"] = False
    except ValueError as e:
        refusals["communicator of another format"] = "bf16" in str(e)
    comm.close()
    out["refusals"] = refusals
    return out


def case_bad_sizes(seed):
    """Rank 0 has a wider model: the step fails on every rank, nothing changed."""
    rank = dist.get_rank()
    net = model(seed, hidden=64 if rank else 65)
    opt = lt.OneBitAdam(net.parameters(), lr=LR, freeze_step=FREEZE)
    x, y = data(seed, rank)
    nn.functional.mse_loss(net(x), y).backward()
    before = [p.detach().clone() for p in net.parameters()]
    try:
        opt.step()
        err = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        err = f"{type(e).__name__}: {e}"
    unchanged = all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    errs = [None] * dist.get_world_size()
    dist.all_gather_object(errs, err)
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, unchanged)
    return {"errors": errs, "unchanged": flags}


def case_nonfinite(seed):
    """A NaN gradient on the last rank, once in warm-up and once after the
    freeze: every rank skips that step (params and step counts unchanged)."""
    rank, W = dist.get_rank(), dist.get_world_size()
    result = {}

    unchanged = []

    poisoned = (FREEZE - 3, FREEZE + 3)

    def poison(t, net, opt):
        if t - 1 in result:  # the poisoned step was skipped: params as before it
            unchanged.append(all(torch.equal(a, b) for a, b in zip(result[t - 1], net.parameters())))
        if t in poisoned:
            result[t] = [p.detach().clone() for p in net.parameters()]

    net, opt, x, y = train(seed, lambda p: lt.OneBitAdam(p, lr=LR, freeze_step=FREEZE), steps=FREEZE + 5,
                           hook=True, on_step=poison, nan_steps=poisoned)
    steps = [s.item() if hasattr(s, "item") else s for s in
             [opt.state[p]["step"] for p in net.parameters()]]
    flags = [None] * W
    dist.all_gather_object(flags, unchanged)
    out = {"freeze_step": FREEZE, "steps": steps, "same": same_on_all_ranks(net), "skipped_unchanged": flags,
           "finite": all(torch.isfinite(p).all().item() for p in net.parameters())}
    return out


def case_local_error(seed):
    """An error raised by lowbit.torch on the last rank before the library's
    step (a NaN lr the library refuses; a param whose .data was replaced),
    for each 1-bit optimizer: every rank fails that step at once with the
    last rank's reason, nothing changed; after a NaN lr is fixed, the ranks
    step on together."""
    rank, W = dist.get_rank(), dist.get_world_size()
    makers = {"OneBitAdam": lambda p: lt.OneBitAdam(p, lr=LR, freeze_step=3),
              "ZeroOneAdam": lambda p: lt.ZeroOneAdam(p, lr=LR, var_freeze_step=100),
              "OneBitLamb": lambda p: lt.OneBitLamb(p, lr=LR, freeze_step=3)}
    x, y = data(seed, rank, n=BATCH)
    out = {}
    for name, make in makers.items():
        for kind in ("nan_lr", "moved_param"):
            net = model(seed)
            opt = make(net.parameters())

            def backward():
                opt.zero_grad()
                nn.functional.mse_loss(net(x), y).backward()

            backward()
            opt.step()  # the params are registered
            backward()
            before = [p.detach().clone() for p in net.parameters()]
            first = next(iter(net.parameters()))
            if rank == W - 1:
                if kind == "nan_lr":
                    opt.param_groups[0]["lr"] = float("nan")
                else:
                    first.data = first.data.clone()  # the same values in new memory
            start = time.monotonic()
            try:
                opt.step()
                err = None
            except Exception as e:  # noqa: BLE001 - the message is the result
                err = f"{type(e).__name__}: {e}"
            elapsed = time.monotonic() - start
            unchanged = all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
            recovered = None
            if kind == "nan_lr":
                opt.param_groups[0]["lr"] = LR
                opt.step()
                recovered = opt.steps_taken() == 2 and same_on_all_ranks(net)
            rows = [None] * W
            dist.all_gather_object(rows, {"error": err, "seconds": elapsed, "unchanged": unchanged,
                                          "recovered": recovered})
            out[f"{name}/{kind}"] = rows
    return out


def main():
    cases, seed = sys.argv[1].split(","), int(sys.argv[2])
    # A rank that waits for one that gave up waits this long (instead of the
    # default 30 minutes) before the process group gives up too.
    if CUDA:
        torch.cuda.set_device(device())
    dist.init_process_group("nccl" if CUDA else "gloo", timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    run = {"train": case_train, "resume": case_resume, "bad_sizes": case_bad_sizes,
           "nonfinite": case_nonfinite, "local_error": case_local_error, "error_formats": case_error_formats}
    out = run[cases[0]](seed) if len(cases) == 1 else {case: run[case](seed) for case in cases}
    out["world_size"] = dist.get_world_size()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # skips gloo's teardown at interpreter exit (it can abort: pytorch/pytorch#179291)


if __name__ == "__main__":
    main()

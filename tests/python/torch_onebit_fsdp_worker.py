"""Run by torchrun (tests/python/test_torch_onebit_fsdp.py): the 1-bit
optimizers of lowbit.torch (OneBitAdam, ZeroOneAdam, OneBitLamb) given
DTensor params, on the CPU with gloo. Rank 0 prints one line ``RESULT
<json>``.

    torchrun --nproc-per-node N torch_onebit_fsdp_worker.py <case>[,<case>...] <seed>

case:
- ``sharded``: FSDP2 (fully_shard) params, and Shard(0) / Shard(1) DTensors
  from distribute_tensor, are refused when the optimizer is made (a
  ValueError naming the param, before any communicator or state exists) and
  by add_param_group (the optimizer unchanged: its groups, its state, its
  next step's bits, against a twin that was never given the sharded param).
- ``replicated``: Replicate DTensor params step bit for bit as plain params
  given the same (per-rank different) grads, across the freeze, and the
  params end the same on every rank.
- ``reduce_scatter``: lowbit.Communicator.compressed_reduce_scatter over the
  ProcessGroup transport, against a float64 model of its rule, its bytes
  and its error feedback.
- ``world1`` (1 rank): an FSDP2 model on a mesh of one rank (its params are
  DTensors whose local tensor is the whole param) steps bit for bit as the
  same model unsharded.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import lowbit.torch as lt

FREEZE = 3
STEPS = 7
LR = 1e-2

MAKERS = {
    "OneBitAdam": lambda p: lt.OneBitAdam(p, lr=LR, freeze_step=FREEZE, weight_decay=0.01),
    "ZeroOneAdam": lambda p: lt.ZeroOneAdam(p, lr=LR, var_freeze_step=FREEZE, weight_decay=0.01),
    "OneBitLamb": lambda p: lt.OneBitLamb(p, lr=LR, freeze_step=FREEZE, weight_decay=0.01),
}


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(seed, rank, step):
    g = torch.Generator().manual_seed(seed * 1000 + 17 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    return None


def same_on_all_ranks(tensors) -> bool:
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    return bool(torch.equal(flat, ref))


def grads_for(seed, rank, step, shapes):
    g = torch.Generator().manual_seed(seed * 7919 + 31 * rank + step)
    return [torch.randn(s, generator=g) for s in shapes]


def case_sharded(seed):
    W = dist.get_world_size()
    mesh = init_device_mesh("cpu", (W,))
    out = {}
    for name, make in MAKERS.items():
        net = model(seed)
        fully_shard(net, mesh=mesh)
        out[f"{name}/fsdp"] = error_of(lambda: make(net.parameters()))
        out[f"{name}/fsdp_named"] = error_of(lambda: make(list(net.named_parameters())))
        for placement in (Shard(0), Shard(1)):
            w = nn.Parameter(distribute_tensor(torch.randn(4 * W, 2 * W), mesh, [placement]))
            out[f"{name}/{placement}"] = error_of(lambda: make([w]))
        # add_param_group: refused, the optimizer unchanged (compared with a
        # twin that never saw the sharded param, two steps later)
        nets = [model(seed), model(seed)]
        opts = [make(list(n.parameters())) for n in nets]
        for step in range(2):
            for n, o in zip(nets, opts):
                x, y = batch(seed, dist.get_rank(), step)
                o.zero_grad()
                nn.functional.mse_loss(n(x), y).backward()
                o.step()
                if step == 0 and o is opts[0]:
                    sharded = nn.Parameter(distribute_tensor(torch.randn(4 * W, 3), mesh, [Shard(0)]))
                    out[f"{name}/add_param_group"] = error_of(lambda: o.add_param_group({"params": [sharded]}))
                    out[f"{name}/groups_after"] = len(o.param_groups)
        out[f"{name}/unchanged"] = all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
        out[f"{name}/steps"] = opts[0].steps_taken()
    return out


def case_replicated(seed):
    rank, W = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (W,))
    out = {}
    shapes = [(24, 10), (10,), (5000,)]  # one above the default 4096-element threshold
    g0 = torch.Generator().manual_seed(seed)
    start = [torch.randn(s, generator=g0) for s in shapes]
    for name, make in MAKERS.items():
        plain = [nn.Parameter(t.clone()) for t in start]
        rep = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Replicate()])) for t in start]
        o_plain, o_rep = make(plain), make(rep)
        for step in range(STEPS):
            grads = grads_for(seed, rank, step, shapes)  # different on every rank
            for p, g in zip(plain, grads):
                p.grad = g.clone()
            for p, g in zip(rep, grads):
                p.grad = type(p).from_local(g.clone(), mesh, [Replicate()], run_check=False)
            o_plain.step()
            o_rep.step()
        out[f"{name}/equal"] = all(torch.equal(a.detach(), b.to_local().detach()) for a, b in zip(plain, rep))
        out[f"{name}/same_on_all_ranks"] = same_on_all_ranks([p.to_local() for p in rep])
        out[f"{name}/moved"] = max((a.detach() - s).abs().max().item() for a, s in zip(plain, start))
        out[f"{name}/steps"] = o_rep.steps_taken()
    return out


def case_world1(seed):
    assert dist.get_world_size() == 1
    mesh = init_device_mesh("cpu", (1,))
    out = {}
    for name, make in MAKERS.items():
        ref, sharded = model(seed), model(seed)
        fully_shard(sharded, mesh=mesh)
        o_ref, o_sh = make(list(ref.parameters())), make(list(sharded.parameters()))
        for step in range(STEPS):
            x, y = batch(seed, 0, step)
            for n, o in ((ref, o_ref), (sharded, o_sh)):
                o.zero_grad()
                nn.functional.mse_loss(n(x), y).backward()
                o.step()
        out[f"{name}/equal"] = all(torch.equal(a.detach(), b.full_tensor().detach())
                                   for a, b in zip(ref.parameters(), sharded.parameters()))
        out[f"{name}/steps"] = o_sh.steps_taken()
        out[f"{name}/placements"] = [str(p.placements) for p in sharded.parameters()]
    return out


def case_reduce_scatter(seed):
    """lowbit.Communicator.compressed_reduce_scatter over the ProcessGroup
    transport (the path a custom FSDP2 reduce-scatter would take): each
    rank's chunk is the mean over ranks of sign(x_j) s_j (a float64 model,
    within fp32 rounding; the C suite checks the bits), only the all-to-all
    moves bytes ((W-1) (4 + C/8) per call), and with a fixed input per rank
    the error feedback makes the running mean of the outputs approach the
    true mean of the inputs like 1/T (exactly: true mean - mean_j(e_j)/T)."""
    import numpy as np

    from lowbit.torch import process_group_communicator

    rank, W = dist.get_rank(), dist.get_world_size()
    comm = process_group_communicator()
    n = 8 * W * 125  # a multiple of 8W: torch's reduce_scatter_tensor layout
    off, c = comm.reduce_scatter_chunk(n)
    g = torch.Generator().manual_seed(seed * 31 + rank)
    fixed = (torch.randn(n, generator=g) * (1 + rank)).numpy()
    everyone = [None] * W
    dist.all_gather_object(everyone, fixed)
    true_mean = np.mean(np.stack(everyone).astype(np.float64), axis=0)[off:off + c]
    e = [np.zeros(n, np.float32) for _ in range(W)]
    T, total, worst_model = 50, np.zeros(c), 0.0
    comm.transport.reset_counters()
    for t in range(T):
        out = np.full(c, np.nan, np.float32)
        comm.compressed_reduce_scatter(fixed.copy(), out)
        model = np.zeros(c)
        for j in range(W):  # the rule, in float64 (scales rounded to fp32)
            x = everyone[j] + e[j]
            s = np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2) / n))
            q = np.where(x >= 0, s, -s).astype(np.float32)
            e[j] = (x - q).astype(np.float32)
            model += q[off:off + c]
        model /= W
        worst_model = max(worst_model, float(np.max(np.abs(out - model)) / np.max(np.abs(model))))
        total += out
    running = total / T
    bound = np.max(np.abs(np.mean(np.stack(e), axis=0)[off:off + c])) / T
    msg = 4 + (n // W) // 8
    return {"offset_ok": off == rank * (n // W) and c == n // W, "worst_vs_model": worst_model,
            "running_error": float(np.max(np.abs(running - true_mean))), "feedback_bound": float(bound),
            "first_error": float(np.max(np.abs(model - true_mean))),
            "alltoall_bytes": comm.transport.bytes_sent["alltoall"], "expected_bytes": T * (W - 1) * msg,
            "allgather_bytes": comm.transport.bytes_sent["allgather"],
            "lib_bytes": comm.stats()["compressed_bytes_sent"]}


def main():
    cases, seed = sys.argv[1].split(","), int(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    run = {"sharded": case_sharded, "replicated": case_replicated, "world1": case_world1,
           "reduce_scatter": case_reduce_scatter}
    out = {case: run[case](seed) for case in cases}
    out["world_size"] = dist.get_world_size()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # skips gloo's teardown at interpreter exit (it can abort: pytorch/pytorch#179291)


if __name__ == "__main__":
    main()

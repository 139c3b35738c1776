"""torchrun worker of test_torch_in_backward.py: on every CPU rank (gloo),
two copies of one model, one stepped by opt.step() after backward, one by
lowbit.torch.step_in_backward:
  ddp    DistributedDataParallel; the step goes through DDP's comm hook
         (each bucket after its all-reduce);
  fsdp2  fully_shard per layer; each sharded param is stepped when its
         reduced shard is accumulated.
Rank 0 prints RESULT {"equal": params equal bit for bit on every rank,
"steps": the step count}."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lowbit.torch as lt


def model(seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48), torch.nn.Tanh(),
                            torch.nn.Linear(48, 3))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def sharded(seed):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = model(seed)
    for layer in (m[0], m[2], m[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main():
    case, seed = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if case == "ddp":
        ref_model, hooked_model = DDP(model(seed), bucket_cap_mb=0.01), DDP(model(seed), bucket_cap_mb=0.01)
    else:
        ref_model, hooked_model = sharded(seed), sharded(seed)
    ref = lt.AdamW(ref_model.parameters(), lr=1e-2, state="8bit", min_quantized_numel=0)
    opt = lt.AdamW(hooked_model.parameters(), lr=1e-2, state="8bit", min_quantized_numel=0)
    lt.step_in_backward(opt, ddp_model=hooked_model if case == "ddp" else None)
    g = torch.Generator().manual_seed(seed * 31 + rank)
    for _ in range(4):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 3, (8,), generator=g)
        torch.nn.functional.cross_entropy(ref_model(x), y).backward()
        ref.step()
        ref.zero_grad()
        torch.nn.functional.cross_entropy(hooked_model(x), y).backward()
        opt.zero_grad()
    equal = all(torch.equal(full(a.detach()), full(b.detach()))
                for a, b in zip(ref_model.parameters(), hooked_model.parameters()))
    flag = torch.tensor([1.0 if equal else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    steps = opt.param_info(next(hooked_model.parameters())).step
    if rank == 0:
        print("RESULT " + json.dumps({"equal": bool(flag.item() == 1.0), "steps": steps}), flush=True)
    sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # skips gloo's teardown at interpreter exit (it can abort: pytorch/pytorch#179291)


if __name__ == "__main__":
    main()

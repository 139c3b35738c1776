"""torchrun worker of test_torch_offload.py: on every CPU rank (gloo), two
DistributedDataParallel copies of one model, one stepped by a plain
lowbit.torch AdamW after backward, one by lowbit.torch.CPUOffload(AdamW,
ddp_model=...), which takes each gradient after its DDP bucket's
all-reduce (a comm hook); case "clip" clips by global norm 0.5 (the plain
one with torch.nn.utils.clip_grad_norm_). LOCAL_WORLD_SIZE divides the
host threads. Rank 0 prints RESULT {"equal": params equal bit for bit on
every rank, "steps": the step count, "threads": the host step's threads}."""
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


def main():
    case, seed = sys.argv[1], int(sys.argv[2])
    clip = 0.5 if case == "clip" else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ref_model, off_model = DDP(model(seed), bucket_cap_mb=0.01), DDP(model(seed), bucket_cap_mb=0.01)
    ref = lt.AdamW(ref_model.parameters(), lr=1e-2, state="8bit", min_quantized_numel=0)
    off = lt.CPUOffload(lt.AdamW, off_model.parameters(), lr=1e-2, state="8bit", min_quantized_numel=0,
                        clip_grad_norm=clip, bucket_numel=1000, ddp_model=off_model)
    g = torch.Generator().manual_seed(seed * 31 + rank)
    for _ in range(4):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 3, (8,), generator=g)
        torch.nn.functional.cross_entropy(ref_model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref_model.parameters(), clip)
        ref.step()
        ref.zero_grad()
        torch.nn.functional.cross_entropy(off_model(x), y).backward()
        off.step()
        off.zero_grad()
    equal = all(torch.equal(a, b) for a, b in zip(ref_model.parameters(), off_model.parameters()))
    flag = torch.tensor([1.0 if equal else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    steps = off.param_info(next(off_model.parameters())).step
    threads = next(iter(off.inner.lowbit_handles().values())).num_threads
    if rank == 0:
        print("RESULT " + json.dumps({"equal": bool(flag.item() == 1.0), "steps": steps, "threads": threads,
                                      "expected_threads": lt.default_host_threads()}), flush=True)
    sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # skips gloo's teardown at interpreter exit (it can abort: pytorch/pytorch#179291)


if __name__ == "__main__":
    main()

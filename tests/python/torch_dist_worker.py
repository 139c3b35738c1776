"""One rank of the lowbit.torch DTensor / FSDP2 tests (test_torch_dtensor.py
starts WORLD of these, gloo on the CPU, rendezvous through a file store).

    python torch_dist_worker.py SCENARIO RANK WORLD OUTDIR

Scenarios (rank 0 writes its results with torch.save under OUTDIR):

- ``train``: a small MLP under FSDP2's fully_shard, lowbit AdamW 8-bit for
  STEPS steps on a fixed global batch split over the ranks; writes the full
  params (``train_params.pt``). Then a step where rank 0's grad holds an
  inf: every rank must skip it (``skip.pt``). Then a Shard(1) DTensor param
  (distribute_tensor, no FSDP): its state dict moments are DTensors with the
  param's placements (``shard1.pt``).
- ``save`` (2 ranks): per state format, train STEPS steps, save model and
  optimizer with torch.distributed.checkpoint (DCP) under OUTDIR/ckpt-FORMAT,
  then one more step; writes the full moments at the save and the params after
  the extra step (``save-FORMAT.pt``).
- ``load`` (any number of ranks): per state format, a fresh model and
  optimizer, DCP load of OUTDIR/ckpt-FORMAT (resharding), the same extra
  step; writes the full moments after the load and the params after the step
  (``loadWORLD-FORMAT.pt``).
- ``two`` (2 ranks): train, save and load in one launch (a launch costs
  seconds of imports).
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import lowbit.torch as lt
import seeding

STEPS = 3
LR = 1e-2
FORMATS = ("fp32", "8bit")
BATCH = 12  # divisible by 2 and 3
# fc1.weight 64x32 and fc2.weight 48x64 shard on whole 256-element blocks over
# 2 ranks; fc3.weight 20x48 (960 elements) does not; the biases keep fp32 state;
# shift (2 elements) leaves rank 2 of 3 an empty shard.
MIN_QUANTIZED = 256


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 48)
        self.fc3 = torch.nn.Linear(48, 20)
        self.shift = torch.nn.Parameter(torch.zeros(2))  # over 3 ranks: shards of 1, 1 and 0 elements

    def forward(self, x):
        logits = self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))
        return logits + torch.nn.functional.pad(self.shift, (0, 18))


def make_model(instance=0):
    g = torch.Generator().manual_seed(seeding.derive("torch_dist.model", instance))
    m = MLP()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def batch(step):
    g = torch.Generator().manual_seed(seeding.derive("torch_dist.batch", step))
    return torch.randn(BATCH, 32, generator=g), torch.randint(0, 20, (BATCH,), generator=g)


def loss_fn(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def make_opt(params, state):
    return lt.AdamW(params, lr=LR, weight_decay=0.05, state=state, min_quantized_numel=MIN_QUANTIZED, num_threads=1)


def local_batch(step, rank, world):
    x, y = batch(step)
    n = BATCH // world
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def sharded(world, instance=0):
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = make_model(instance)
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train_step(model, opt, step, rank, world):
    x, y = local_batch(step, rank, world)
    opt.zero_grad()
    loss_fn(model, x, y).backward()
    opt.step()


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_params(model):
    return {n: full(p.detach()).clone() for n, p in model.named_parameters()}


def full_moments(opt, model):
    out = {}
    for n, p in model.named_parameters():
        s = opt.state[p]
        out[n] = {k: (full(v).clone() if k != "step" else v.clone()) for k, v in s.items()}
    return out


def scenario_train(rank, world, outdir):
    model = sharded(world)
    opt = make_opt(model.parameters(), "8bit")
    for step in range(STEPS):
        train_step(model, opt, step, rank, world)
    params = full_params(model)
    formats = {n: opt.param_info(p).state_format for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"params": params, "formats": formats}, os.path.join(outdir, "train_params.pt"))

    # an inf in rank 0's shard of one grad: every rank skips the step
    x, y = local_batch(STEPS, rank, world)
    opt.zero_grad()
    loss_fn(model, x, y).backward()
    if rank == 0:
        model.fc2.weight.grad.to_local()[0, 0] = float("inf")
    before = full_params(model)
    opt.step()
    skipped = torch.tensor([1.0 if opt.last_step_skipped else 0.0])
    flags = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(flags, skipped)
    unchanged = all(torch.equal(a, b) for a, b in zip(before.values(), full_params(model).values()))
    steps = {n: opt.state[p]["step"].item() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"skipped": [f.item() for f in flags], "unchanged": unchanged, "steps": steps},
                   os.path.join(outdir, "skip.pt"))

    # a DTensor sharded on dim 1 (tensor parallel style), fp32 state
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(seeding.derive("torch_dist.shard1"))
    w0 = torch.randn(6, 10, generator=g)
    grads = [torch.randn(6, 10, generator=g) for _ in range(2)]
    w = torch.nn.Parameter(distribute_tensor(w0.clone(), mesh, [Shard(1)]))
    o = lt.AdamW([w], lr=LR, num_threads=1)
    for grad in grads:
        w.grad = distribute_tensor(grad.clone(), mesh, [Shard(1)])
        o.step()
    sd = o.state_dict()
    m = sd["state"][0]["exp_avg"]
    info = {"placements": str(m.placements), "same_as_param": tuple(m.placements) == tuple(w.placements),
            "shape": tuple(m.shape), "exp_avg": m.full_tensor(), "exp_avg_sq": sd["state"][0]["exp_avg_sq"].full_tensor(),
            "w": w.full_tensor().detach(), "w0": w0, "grads": grads, "step": sd["state"][0]["step"].item()}
    if rank == 0:
        torch.save(info, os.path.join(outdir, "shard1.pt"))


def scenario_save(rank, world, outdir):
    for state in FORMATS:
        model = sharded(world)
        opt = make_opt(model.parameters(), state)
        for step in range(STEPS):
            train_step(model, opt, step, rank, world)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(outdir, f"ckpt-{state}"))
        moments = full_moments(opt, model)
        train_step(model, opt, STEPS, rank, world)
        result = {"moments": moments, "params": full_params(model)}
        if rank == 0:
            torch.save(result, os.path.join(outdir, f"save-{state}.pt"))


def scenario_load(rank, world, outdir, ckptdir=None):
    ckptdir = ckptdir or outdir
    for state in FORMATS:
        model = sharded(world, instance=1)  # other values: all must come from the checkpoint
        opt = make_opt(model.parameters(), state)
        opt.param_groups[0]["lr"] = 0.5  # restored from the checkpoint
        msd, osd = get_state_dict(model, opt)  # a template laid out for this world size
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, checkpoint_id=os.path.join(ckptdir, f"ckpt-{state}"))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        moments = full_moments(opt, model)
        formats = {n: opt.param_info(p).state_format for n, p in model.named_parameters() if p in opt._where}
        lr = opt.param_groups[0]["lr"]
        empty = [None] * world  # per rank: the params whose shard there is empty
        dist.all_gather_object(empty, [n for n, p in model.named_parameters() if p in opt._empty_shards])
        train_step(model, opt, STEPS, rank, world)
        result = {"moments": moments, "params": full_params(model), "formats": formats, "lr": lr, "empty": empty}
        if rank == 0:
            torch.save(result, os.path.join(outdir, f"load{world}-{state}.pt"))


def scenario_two(rank, world, outdir):
    """What runs on 2 ranks, in one launch: train, save, load on 2."""
    scenario_train(rank, world, outdir)
    scenario_save(rank, world, outdir)
    scenario_load(rank, world, outdir)


def main():
    scenario, rank, world, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    torch.manual_seed(seeding.derive("torch_dist.global", rank))  # nothing should draw from it
    store = os.path.join(outdir, f"store-{scenario}-{world}")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        scenarios = {"train": scenario_train, "save": scenario_save, "load": scenario_load, "two": scenario_two}
        scenarios[scenario](rank, world, outdir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done, results written: leave without the interpreter's finalization,
    # where gloo's worker threads can still abort the process (SIGABRT,
    # "terminate called without an active exception"; pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

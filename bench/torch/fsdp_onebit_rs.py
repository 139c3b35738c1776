"""Prototype measurement for design (b) of issue 48 (docs/ONEBIT_SHARDED.md,
section 4): FSDP2 with its gradient reduce-scatter replaced, after a warm-up,
by lowbit's 1-bit compressed reduce-scatter with worker error feedback
(lowbit_comm_compressed_reduce_scatter, through FSDP2's
set_custom_reduce_scatter), the owned shard then stepped by Adam with its
variance frozen at the end of the warm-up. A measurement, not a product: the
frozen-variance Adam is written here in torch.

    torchrun --nproc-per-node 2 bench/torch/fsdp_onebit_rs.py [--steps 400] [--warmup 50] [--seed 1]

A small causal transformer LM (2 layers, d 64, vocab 64, sequences of 32 from
a fixed random bigram chain, batch 16 per rank) under fully_shard (each layer
and the root), the same init, data and schedule for every row:

  fp32 RS + AdamW            FSDP2 as shipped: the reference
  fp32 RS + frozen-v Adam    the variance frozen after the warm-up, gradients exact
  1-bit RS + AdamW           compressed gradients, the variance still updated
  1-bit RS + frozen-v Adam   design (b)
  1-bit RS, no feedback      design (b) with the worker error reset before every call
  FSDPOneBitAdam             design (b) as shipped (lowbit.torch.FSDPOneBitAdam, --product):
                             lowbit AdamW in the warm-up, then the frozen-variance step

Printed (rank 0): the loss on a held-out batch at the end (mean of the last 10
evaluations), its ratio to the reference, and the reduce-scatter bytes this
rank sent per step after the warm-up (lowbit's counters; fp32: (W-1)/W * 4
bytes per element, what a ring reduce-scatter sends), FSDP2's parameter
all-gather bytes per step (counted through set_custom_all_gather: forward,
and backward for the groups resharded after forward), and the ratio of all
of it, reference over this row. The chunk layout of
FSDP2's reduce-scatter input matches lowbit's when every group's shard numel
is a multiple of 8 (asserted: the model's sizes are chosen so).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

from lowbit.torch import FSDPOneBitAdam, process_group_communicator

VOCAB, D, LAYERS, SEQ, BATCH = 64, 64, 2, 32, 16


class Phase:
    compressed = False
    feedback = True


class LowbitReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter of one param group: fp32 (torch's) while
    Phase.compressed is False, else lowbit's compressed reduce-scatter on a
    communicator of this group's own (its worker error is this group's)."""

    def __init__(self, phase: Phase, error_format=None):
        self.phase = phase
        self.error_format = error_format
        self.comm = None
        self.fp32_bytes = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        W = group.size()
        n = input_tensor.numel()
        if not self.phase.compressed:
            self.fp32_bytes += (W - 1) * 4 * n // W
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        assert op == dist.ReduceOp.AVG and input_tensor.dtype == torch.float32, (op, input_tensor.dtype)
        if self.comm is None:
            self.comm = process_group_communicator(group, error_format=self.error_format)
        off, c = self.comm.reduce_scatter_chunk(n)
        assert c == output_tensor.numel() and off == group.rank() * c, "shard numel not a multiple of 8"
        if not self.phase.feedback:
            self.comm.reset_errors()
        self.comm.compressed_reduce_scatter(input_tensor.detach().numpy(), output_tensor.detach().numpy())
        return None


class CountingAllGather(DefaultAllGather):
    """FSDP2's own parameter all-gather, its bytes counted ((W-1) messages of
    this rank's shard)."""

    def __init__(self):
        self.bytes = 0

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.bytes += (group.size() - 1) * input_tensor.numel() * input_tensor.element_size()
        return super().__call__(output_tensor, input_tensor, group, async_op)


class FrozenVarianceAdam(torch.optim.Optimizer):
    """AdamW on the local shards; from step freeze_step + 1 on, v and its
    bias correction stay as they were at freeze_step (1-bit Adam's rule on
    the gradient instead of the momentum). freeze_step None: plain AdamW."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, freeze_step=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.freeze_step = freeze_step

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                x, g = p.to_local(), p.grad.to_local()
                st = self.state[p]
                if not st:
                    st.update(t=0, m=torch.zeros_like(x), v=torch.zeros_like(x), bc2=1.0)
                st["t"] += 1
                t = st["t"]
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                if self.freeze_step is None or t <= self.freeze_step:
                    st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    st["bc2"] = 1 - b2 ** t
                denom = (st["v"] / st["bc2"]).sqrt_().add_(group["eps"])
                x.mul_(1 - group["lr"] * group["weight_decay"])
                x.addcdiv_(st["m"], denom, value=-group["lr"] / (1 - b1 ** t))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(D, 4, 128, dropout=0.0, batch_first=True)
                                    for _ in range(LAYERS))
        self.head = nn.Linear(D, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens):
        h = self.emb(tokens) + self.pos
        for layer in self.layers:
            h = layer(h, src_mask=self.mask, is_causal=True)
        return self.head(h)


def bigram_data(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, VOCAB, generator=g) * 3
    return torch.softmax(logits, dim=1)


def sample(probs, n, g):
    out = torch.empty(n, SEQ + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for k in range(SEQ):
        out[:, k + 1] = torch.multinomial(probs[out[:, k]], 1, generator=g).squeeze(1)
    return out


def run(args, rs_compressed: bool, freeze: bool, feedback: bool = True, error_format=None,
        product: bool = False) -> dict:
    rank, W = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (W,))
    torch.manual_seed(args.seed)
    model = LM()
    phase = Phase()
    phase.feedback = feedback
    comms = []
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    gathers = []
    for module in list(model.layers) + [model]:
        if not product:
            comm = LowbitReduceScatter(phase, error_format)
            module.set_custom_reduce_scatter(comm)
            comms.append(comm)
        gathers.append(CountingAllGather())
        module.set_custom_all_gather(gathers[-1])
    if product:
        opt = FSDPOneBitAdam(model, lr=args.lr, weight_decay=0.01, freeze_step=args.warmup,
                             error_format=error_format or "fp32")
    else:
        opt = FrozenVarianceAdam(model.parameters(), lr=args.lr, weight_decay=0.01,
                                 freeze_step=args.warmup if freeze else None)
    probs = bigram_data(args.seed)
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    held = sample(probs, 64, torch.Generator().manual_seed(args.seed + 12345))
    losses = []
    for step in range(1, args.steps + 1):
        phase.compressed = rs_compressed and step > args.warmup
        if step == args.warmup + 1:
            for c in comms:
                c.fp32_bytes = 0
            for a in gathers:
                a.bytes = 0
        batch = sample(probs, BATCH, g)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step > args.steps - 10 * args.eval_every and step % args.eval_every == 0:
            counted = [x.bytes for x in gathers]
            with torch.no_grad():
                ev = nn.functional.cross_entropy(model(held[:, :-1]).reshape(-1, VOCAB), held[:, 1:].reshape(-1))
            for x, c in zip(gathers, counted):  # the evaluation's all-gathers are not the step's
                x.bytes = c
            losses.append(ev.item())
    after = args.steps - args.warmup
    if product:  # every reduce-scatter after the warm-up is the compressed one
        return {"loss": sum(losses) / len(losses), "bytes_per_step": opt.compressed_bytes_sent() / after,
                "rs_elements_per_step": None, "ag_bytes_per_step": sum(a.bytes for a in gathers) / after,
                "error_bytes_per_rank": opt.error_bytes()}
    lowbit_bytes = sum(c.comm.stats()["compressed_bytes_sent"] for c in comms if c.comm is not None)
    elements = sum(c.comm.stats()["compressed_elements"] for c in comms if c.comm is not None)
    return {"loss": sum(losses) / len(losses),
            "bytes_per_step": (lowbit_bytes + sum(c.fp32_bytes for c in comms)) / after,
            "rs_elements_per_step": elements / after if elements else None,
            "ag_bytes_per_step": sum(a.bytes for a in gathers) / after}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--error-formats", default="",
                    help="comma-separated: also design (b) with the worker error kept in these formats "
                         "(bf16, int8; issue 48, item 3)")
    ap.add_argument("--only-design-b", action="store_true",
                    help="only the reference and design (b) rows (with --error-formats: those too)")
    ap.add_argument("--product", action="store_true",
                    help="also lowbit.torch.FSDPOneBitAdam (design (b) as shipped), with each --error-formats too")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    rows = {"fp32 RS + AdamW": run(args, False, False)}
    if not args.only_design_b:
        rows["fp32 RS + frozen-v Adam"] = run(args, False, True)
        rows["1-bit RS + AdamW"] = run(args, True, False)
    rows["1-bit RS + frozen-v Adam"] = run(args, True, True)
    for fmt in filter(None, args.error_formats.split(",")):
        rows[f"1-bit RS + frozen-v, {fmt} err"] = run(args, True, True, error_format=fmt)
    if args.product:
        rows["FSDPOneBitAdam"] = run(args, True, True, product=True)
        for fmt in filter(None, args.error_formats.split(",")):
            rows[f"FSDPOneBitAdam, {fmt} err"] = run(args, True, True, error_format=fmt, product=True)
    if not args.only_design_b:
        rows["1-bit RS, no feedback"] = run(args, True, True, feedback=False)
    if dist.get_rank() == 0:
        ref = rows["fp32 RS + AdamW"]
        print(f"world {dist.get_world_size()}, {args.steps} steps, warm-up {args.warmup}, seed {args.seed}, "
              f"lr {args.lr}; held-out loss (mean of the last 10 evaluations); RS bytes sent per rank per step "
              f"after the warm-up")
        print(f"{'':28s} {'loss':>8s} {'/ ref':>7s} {'RS bytes/step':>14s} {'fp32 / this':>12s} "
              f"{'AG bytes/step':>14s} {'all: ref / this':>16s}")
        total = ref["bytes_per_step"] + ref["ag_bytes_per_step"]
        for name, r in rows.items():
            print(f"{name:28s} {r['loss']:8.4f} {r['loss'] / ref['loss']:7.4f} {r['bytes_per_step']:14.0f} "
                  f"{ref['bytes_per_step'] / r['bytes_per_step']:12.1f} {r['ag_bytes_per_step']:14.0f} "
                  f"{total / (r['bytes_per_step'] + r['ag_bytes_per_step']):16.2f}")
        print("RESULT " + json.dumps({"args": vars(args), "rows": rows}))
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()

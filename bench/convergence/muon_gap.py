#!/usr/bin/env python3
"""Muon's low-bit momentum against fp32 Muon on char_lm's task (issue 35):
the block matrices (qkv, proj, fc1, fc2) with Muon, the embeddings, head,
norms and biases with AdamW in the same optimizer (char_lm's AdamW settings),
Muon's lr adjusted by "match_rms_adamw" so that one schedule (char_lm.lr_at)
drives every group, weight decay 0.1. The same seed, batches and initial
weights for every configuration; the final validation loss and its gap to
lowbit's fp32 Muon, per seed and horizon.

  python3 bench/convergence/muon_gap.py                  # 600 and 3000 steps, 2 seeds (about 10 min on 2 cores)
  python3 bench/convergence/muon_gap.py --steps 300 --seeds 0

Configurations: torch (torch.optim.Muon + torch.optim.AdamW, fp32), fp32,
8bit and 4bit (lowbit.torch.Muon's state=, the AdamW group's state with it;
8-bit and 4-bit momentum of a Muon matrix are rank-1 normalised), 4bit-sr
(blocks, stochastic codes), 4bit-block and 8bit-block (blocks of 128 / 256),
and adamw (char_lm's AdamW alone, for scale)."""

from __future__ import annotations

import argparse
import os

import _paths  # noqa: F401,E402  (sys.path and LOWBIT_LIBRARY, before lowbit)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from run_gap import train_all  # noqa: E402


def _split(model):
    matrices, others = [], []
    for name, p in model.named_parameters():
        (matrices if p.ndim == 2 and name.startswith("blocks.") else others).append(p)
    return matrices, others


class _Pair:
    """torch.optim.Muon for the matrices and torch.optim.AdamW for the rest,
    as one optimizer for char_lm.train."""

    def __init__(self, model):
        import torch
        import char_lm as task
        m, o = _split(model)
        self.muon = torch.optim.Muon(m, lr=task.LR, weight_decay=task.WEIGHT_DECAY, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(o, lr=task.LR, betas=task.BETAS, weight_decay=task.WEIGHT_DECAY)
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def step(self):
        self.muon.step()
        self.adamw.step()


def _lowbit(state, ns_precision="fp32", **options):
    def make(model):
        import lowbit.torch as lbt
        import char_lm as task
        m, o = _split(model)
        groups = [{"params": m},
                  {"params": o, "algorithm": "adamw", "betas": task.BETAS, "weight_decay": task.WEIGHT_DECAY}]
        return lbt.Muon(groups, lr=task.LR, weight_decay=task.WEIGHT_DECAY, adjust_lr_fn="match_rms_adamw",
                        state=state, ns_precision=ns_precision, num_threads=1, **options)
    return make


def _adamw(model):
    import torch
    import char_lm as task
    return torch.optim.AdamW(model.parameters(), lr=task.LR, betas=task.BETAS, weight_decay=task.WEIGHT_DECAY)


CONFIGS = {
    "torch": _Pair,
    "fp32": _lowbit("fp32"),
    "bf16-ns": _lowbit("fp32", "bf16"),
    "8bit": _lowbit("8bit"),
    "4bit": _lowbit("4bit"),
    "4bit-sr": _lowbit("4bit-sr"),
    "4bit-block": _lowbit("4bit", first_normalization="block"),
    "8bit-block": _lowbit("8bit", first_normalization="block"),
    "adamw": _adamw,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["torch", "fp32", "8bit", "4bit", "4bit-sr", "adamw"],
                    choices=sorted(CONFIGS))
    ap.add_argument("--steps", nargs="+", type=int, default=[600, 3000])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    configs = args.configs if "fp32" in args.configs else ["fp32"] + args.configs
    losses = train_all("muon_gap:CONFIGS", configs, args.steps, args.seeds, args.jobs)
    head = "| config | " + " | ".join(f"{s} steps: loss (gap to fp32 Muon)" for s in args.steps) + " |"
    print(head)
    print("|---" * (1 + len(args.steps)) + "|")
    for c in configs:
        cells = []
        for s in args.steps:
            vals = [losses[("char_lm", c, s, seed)] for seed in args.seeds]
            gaps = [100 * (losses[("char_lm", c, s, seed)] / losses[("char_lm", "fp32", s, seed)] - 1) for seed in args.seeds]
            cells.append(f"{sum(vals) / len(vals):.4f} ({sum(gaps) / len(gaps):+.2f}%; "
                         + ", ".join(f"{g:+.2f}" for g in gaps) + ")")
        print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

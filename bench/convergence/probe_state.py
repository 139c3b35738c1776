#!/usr/bin/env python3
"""Where a quantized state's error goes (issues 37, 50): trains a task
(char_lm unless --task names another of run_gap.TASKS) with one
lowbit format while keeping, beside it, the exact fp32 moments of the same
gradient stream, and at chosen steps compares what the library holds
(read_moment) with them, element by element.

For each quantized param element, two factors by which the held state scales
its update (below 1: the update undershoots):
  r_v = (sqrt(v_exact) + eps) / (sqrt(v_held) + eps)
  r_m = m_held / m_exact
Elements are grouped by their exact moment over the largest of its block of
128 (the block's absmax), in decades: by v for r_v, by |m| for r_m. Per
group: its share of elements, the median and mean of the factor, and the
share scaled below 0.5 (for r_m: held with the wrong sign or zero included).

  python3 bench/convergence/probe_state.py --format 4bit --steps 3000 --at 100 600 1500 3000
  python3 bench/convergence/probe_state.py --task grammar_lm --format 4bit-sr --steps 600 --at 600
"""

from __future__ import annotations

import argparse

import _paths  # noqa: F401,E402  (sys.path and LOWBIT_LIBRARY, before lowbit)

import torch  # noqa: E402

import importlib  # noqa: E402

from gap_formats import FORMATS  # noqa: E402

BLOCK, EPS = 128, 1e-8
EDGES = [1.0, 1e-1, 1e-2, 1e-3, 1e-4, 0.0]


def block_absmax(x):
    flat = x.reshape(-1)
    pad = (-flat.numel()) % BLOCK
    b = torch.nn.functional.pad(flat, (0, pad)).view(-1, BLOCK)
    return b.abs().amax(1, keepdim=True).expand_as(b).reshape(-1)[: flat.numel()]


def table(what, rel, factor):
    print(f"  {what} / block absmax   share    median    mean   < 0.5")
    for hi, lo in zip(EDGES[:-1], EDGES[1:]):
        sel = (rel <= hi) & (rel > lo) if lo > 0 else (rel <= hi)
        if sel.sum() == 0:
            continue
        r = factor[sel]
        label = f"({lo:g}, {hi:g}]" if lo > 0 else f"[0, {hi:g}]"
        print(f"  {label:20s} {sel.float().mean() * 100:6.1f}%  {r.median():7.3f} {r.mean():7.3f}  "
              f"{(r < 0.5).float().mean() * 100:5.1f}%")


def report(step, rows):
    cat = [torch.cat([r[k] for r in rows]) for k in range(4)]
    print(f"step {step}: {cat[0].numel():,} quantized elements")
    table("v", cat[0], cat[1])
    table("|m|", cat[2], cat[3])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", default="4bit", choices=[f for f in FORMATS if f != "fp32" and not f.startswith("sim")])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--at", nargs="+", type=int, default=[100, 600, 1500, 3000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task", default="char_lm", choices=["char_lm", "shapes_cnn", "grammar_lm"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    task = importlib.import_module(args.task)
    b1, b2 = task.BETAS
    shadow = {}

    def probe(step, model, opt):
        t = step + 1
        rows = []
        for p in model.parameters():
            m, v = shadow.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            if t in args.at and p.numel() >= 4096:
                vq, mq = opt.read_moment(p, 1), opt.read_moment(p, 0)
                rel = (v / block_absmax(v).view_as(v).clamp_min(1e-38)).reshape(-1)
                bc2 = 1 - b2 ** t
                rv = ((v / bc2).sqrt() + EPS) / ((vq / bc2).sqrt() + EPS)
                nz = m.abs() > 0
                rel_m = (m.abs() / block_absmax(m.abs()).view_as(m).clamp_min(1e-38))[nz]
                rows.append((rel, rv.reshape(-1), rel_m.reshape(-1), (mq[nz] / m[nz]).reshape(-1)))
        if rows:
            report(t, rows)

    loss = task.train(FORMATS[args.format], args.steps, args.seed, probe=probe)
    print(f"final val loss {loss:.4f}")


if __name__ == "__main__":
    main()

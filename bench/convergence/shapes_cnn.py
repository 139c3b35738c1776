"""A vision task for bench/convergence (issue 50): a small CNN classifies
procedurally generated 16x16 RGB images into 8 shape classes (disc, square,
triangle, ring, plus, bar, hollow square, two dots), each drawn at a random
position, size, rotation, colour and contrast over a textured background
(two random gratings) with pixel noise. Every training batch is freshly
drawn (the stream depends on the training seed, as char_lm's batches do),
so that the long horizon does not overfit: a fixed set of 20,000 images
overfit by 3000 steps, and its final loss then moved by up to 5% between two
formats whose updates differ slightly (8-bit: -1.3%). The validation images
are a fixed set from DATA_SEED, the same for every run. AdamW with torch's default betas (0.9,
0.999) and weight decay 0.05, warm-up then cosine: another kind of model,
gradient and beta2 than char_lm's. The score is the cross-entropy over the
validation images (the task keeps a floor: small, faint shapes stay
ambiguous).

The module has char_lm's interface: dataset(), train(make_optimizer, steps,
seed, data, probe), and LR, BETAS, WEIGHT_DECAY for gap_formats."""

from __future__ import annotations

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZE, CLASSES = 16, 8
N_VAL, DATA_SEED = 4_000, 2050
WIDTH, BATCH = 32, 32
LR, BETAS, WEIGHT_DECAY, WARMUP = 2e-3, (0.9, 0.999), 0.05, 100
NAMES = ["disc", "square", "triangle", "ring", "plus", "bar", "hollow square", "two dots"]


def render(n, gen):
    """(n, 3, SIZE, SIZE) float images in [0, 1] and their labels, all from
    `gen` (a torch.Generator): every draw is one vectorised call, so the set
    depends on the seed and n only."""
    def u(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(n, *shape, generator=gen, dtype=torch.float64)

    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    # background: two gratings of random frequency, orientation and phase, in two random colours
    ys, xs = torch.meshgrid(torch.arange(SIZE, dtype=torch.float64), torch.arange(SIZE, dtype=torch.float64),
                            indexing="ij")
    bg = torch.zeros(n, 3, SIZE, SIZE, dtype=torch.float64)
    for _ in range(2):
        theta, freq, phase = u(0, math.pi, 1, 1), u(0.3, 1.6, 1, 1), u(0, 2 * math.pi, 1, 1)
        wave = torch.sin(freq * (xs * torch.cos(theta) + ys * torch.sin(theta)) + phase)  # (n, S, S)
        bg += u(0, 0.3, 3, 1, 1) * (0.5 + 0.5 * wave.unsqueeze(1))
    # the shape: centre, radius, rotation; coordinates (a, b) in the shape's frame, in radii
    cx, cy = u(4, SIZE - 4, 1, 1), u(4, SIZE - 4, 1, 1)
    r = u(3.0, 6.5, 1, 1)
    rot = u(0, 2 * math.pi, 1, 1)
    dx, dy = (xs + 0.5 - cx) / r, (ys + 0.5 - cy) / r
    a = dx * torch.cos(rot) + dy * torch.sin(rot)
    b = -dx * torch.sin(rot) + dy * torch.cos(rot)
    rad, box = torch.sqrt(a * a + b * b), torch.maximum(a.abs(), b.abs())
    masks = torch.stack([
        rad < 1.0,                                                        # disc
        box < 0.8,                                                        # square
        (b > -0.5) & (math.sqrt(3) * a.abs() + b < 1.0),                  # triangle
        (rad > 0.55) & (rad < 1.0),                                       # ring
        ((a.abs() < 0.3) & (b.abs() < 1.0)) | ((b.abs() < 0.3) & (a.abs() < 1.0)),  # plus
        (a.abs() < 0.28) & (b.abs() < 1.0),                               # bar
        (box > 0.5) & (box < 0.85),                                       # hollow square
        ((a - 0.55) ** 2 + b * b < 0.16) | ((a + 0.55) ** 2 + b * b < 0.16),  # two dots
    ], 1)  # (n, CLASSES, S, S)
    mask = masks[torch.arange(n), labels].unsqueeze(1).to(torch.float64)
    colour = u(0, 1, 3, 1, 1)
    alpha = u(0.5, 1.0, 1, 1, 1)
    img = bg * (1 - alpha * mask) + colour * alpha * mask
    img += 0.08 * torch.randn(n, 3, SIZE, SIZE, generator=gen, dtype=torch.float64)
    return img.clamp(0, 1).to(torch.float32), labels


def dataset():
    """(per-channel mean, per-channel std, validation images, validation
    labels): N_VAL images of render() from DATA_SEED, normalised by their
    own mean and std (which the training batches use too)."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    x, y = render(N_VAL, gen)
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    return mean, std, (x - mean) / std, y


def _conv(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GroupNorm(8, cout), nn.GELU())


class ShapesCNN(nn.Module):
    """Four 3x3 convolutions (32, 64 / 2, 64, 128 / 2 channels) with group
    norm and GELU, global average pooling, a linear head: 132k params, of
    which the three inner convolutions (18k, 37k, 74k) hold quantized state."""

    def __init__(self):
        super().__init__()
        w = WIDTH
        self.body = nn.Sequential(_conv(3, w, 1), _conv(w, 2 * w, 2), _conv(2 * w, 2 * w, 1), _conv(2 * w, 4 * w, 2))
        self.head = nn.Linear(4 * w, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


def lr_at(step, steps):
    """Linear warm-up over WARMUP steps, then cosine down to 10% of LR."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, steps - WARMUP)
    return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    total = sum(F.cross_entropy(model(x[i:i + 500]), y[i:i + 500], reduction="sum").item()
                for i in range(0, len(x), 500))
    model.train()
    return total / len(x)


def train(make_optimizer, steps, seed, data=None, probe=None):
    """Final validation loss of a run, as char_lm.train: `make_optimizer(model,
    task=this module)` gives the optimizer; the weights and the training
    images depend on `seed` only."""
    import sys
    mean, std, xva, yva = data or dataset()
    torch.manual_seed(seed)
    model = ShapesCNN()
    opt = make_optimizer(model, task=sys.modules[__name__])
    gen = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        x, y = render(BATCH, gen)
        loss = F.cross_entropy(model((x - mean) / std), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if probe is not None:
            probe(step, model, opt)
    return evaluate(model, xva, yva)


def num_params():
    return sum(p.numel() for p in ShapesCNN().parameters())


def _adamw(model, task=None):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)


if __name__ == "__main__":
    import time
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    t = time.time()
    data = dataset()
    print(f"{len(data[2]):,} validation images in {time.time() - t:.1f} s, {num_params():,} params")
    t = time.time()
    loss = train(_adamw, int(os.environ.get("STEPS", "50")), 0, data)
    print(f"val loss {loss:.4f}, {time.time() - t:.1f} s")

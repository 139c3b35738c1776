"""The convergence task of issue 37: a 2-layer, d=128 character-level
transformer trained on the repository's own source text with AdamW (lr 1e-3,
betas (0.9, 0.95), weight decay 0.1, warm-up then cosine), one optimizer-state
format per run, the same seed, data order and initial weights for every
format. The final validation loss is what the formats are compared on.

This module is the task; run_gap.py runs it over formats, seeds and horizons
and prints the table."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".c", ".h", ".cpp", ".hpp", ".cu", ".cuh", ".py", ".md", ".sh", ".cmake", ".txt"}
CORPUS_BYTES = 3_000_000
PINNED = "b7e4ca34b29633d32fa5acc0ecde0678c7c3433f"  # main on 2026-11-28, before this benchmark

D_MODEL, N_LAYERS, N_HEADS, CONTEXT, BATCH = 128, 2, 4, 64, 8
LR, BETAS, WEIGHT_DECAY, WARMUP = 1e-3, (0.9, 0.95), 0.1, 100
EVAL_BATCHES = 128


def corpus() -> bytes:
    """The repository's source text as of commit PINNED (the files it tracks
    with a suffix of TEXT_SUFFIXES, sorted by path), capped at CORPUS_BYTES:
    a fixed corpus, so that runs of different days compare. Where that
    commit is not in the clone (a shallow one) or git is absent: the same
    files of the working tree, which grow with the code (then compare
    formats within one run only); `source` says which."""
    try:
        names = _git("ls-tree", "-r", "--name-only", PINNED).decode().split("\n")
        names = [n for n in names if Path(n).suffix in TEXT_SUFFIXES and "golden" not in n]
        blobs = _git("cat-file", "--batch", stdin="".join(f"{PINNED}:{n}\n" for n in sorted(names)).encode())
        out, pos = bytearray(), 0
        while pos < len(blobs) and len(out) < CORPUS_BYTES:
            header_end = blobs.index(b"\n", pos)
            size = int(blobs[pos:header_end].split()[2])
            out += blobs[header_end + 1:header_end + 1 + size]
            pos = header_end + 1 + size + 1
        corpus.source = f"commit {PINNED[:12]}"
        return bytes(out[:CORPUS_BYTES])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        pass
    out = bytearray()
    for p in sorted(q for q in ROOT.rglob("*") if q.is_file() and not {"build", ".git", "golden"} & set(q.parts)):
        if p.suffix in TEXT_SUFFIXES:
            out += p.read_bytes()
            if len(out) >= CORPUS_BYTES:
                break
    corpus.source = "working tree"
    return bytes(out[:CORPUS_BYTES])


def _git(*args, stdin=None) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, input=stdin).stdout


def dataset():
    """(train tokens, validation tokens, vocabulary size): bytes mapped to
    the indices of the bytes that occur; the last 10% validate."""
    data = corpus()
    symbols = sorted(set(data))
    table = torch.full((256,), -1, dtype=torch.long)
    table[torch.tensor(symbols)] = torch.arange(len(symbols))
    tokens = table[torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
    cut = len(tokens) * 9 // 10
    return tokens[:cut], tokens[cut:], len(symbols)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.fc1, self.fc2 = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, N_HEADS, D_MODEL // N_HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D_MODEL))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharLM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, D_MODEL)
        self.pos = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def lr_at(step, steps):
    """Linear warm-up over WARMUP steps, then cosine down to 10% of LR."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, steps - WARMUP)
    return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def batch(tokens, gen):
    i = torch.randint(0, len(tokens) - CONTEXT - 1, (BATCH,), generator=gen)
    x = torch.stack([tokens[j:j + CONTEXT] for j in i.tolist()])
    y = torch.stack([tokens[j + 1:j + CONTEXT + 1] for j in i.tolist()])
    return x, y


@torch.no_grad()
def evaluate(model, tokens):
    gen = torch.Generator().manual_seed(12345)
    total = 0.0
    for _ in range(EVAL_BATCHES):
        x, y = batch(tokens, gen)
        total += F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    return total / EVAL_BATCHES


def train(make_optimizer, steps, seed, data=None, probe=None):
    """Final validation loss of a run: `make_optimizer(model)` gives the
    optimizer; the weights, the batches and the schedule depend on `seed` and
    `steps` only. `probe(step, model, opt)`, if given, runs after each step."""
    train_tokens, val_tokens, vocab = data or dataset()
    torch.manual_seed(seed)
    model = CharLM(vocab)
    opt = make_optimizer(model)
    gen = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        x, y = batch(train_tokens, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if probe is not None:
            probe(step, model, opt)
    return evaluate(model, val_tokens)


def num_params(vocab):
    return sum(p.numel() for p in CharLM(vocab).parameters())


if __name__ == "__main__":
    import time
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    tr, va, vocab = data = dataset()
    print(f"corpus {len(tr) + len(va):,} bytes, vocab {vocab}, {num_params(vocab):,} params")
    t = time.time()
    loss = train(lambda m: torch.optim.AdamW(m.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY),
                 int(os.environ.get("STEPS", "50")), 0, data)
    print(f"val loss {loss:.4f}, {time.time() - t:.1f} s")

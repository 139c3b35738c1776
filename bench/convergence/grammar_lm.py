"""A word-level language-model task for bench/convergence (issue 50): the
2-layer, d=128 transformer of char_lm (its Block), trained on text generated
from a fixed random grammar with a Zipfian lexicon of about 1,000 words.

The language: sentences "S -> NP VP ." with subject-verb number agreement
(across prepositional phrases and relative clauses), determiners that agree
with the noun, adjectives, verbs that prefer some object nouns (a fixed
random affinity from the lexicon seed), and an occasional conjunction of
two clauses. Word frequencies within each class follow a Zipf law, so most
rows of the embedding and of the output head see rare, sparse gradients:
another kind of gradient than char_lm's 119 dense symbols. The corpus is a
fixed stream of TOKENS tokens from DATA_SEED, the same for every run; the
last 10% validate.

The module has char_lm's interface: dataset(), train(make_optimizer, steps,
seed, data, probe), and LR, BETAS, WEIGHT_DECAY for gap_formats."""

from __future__ import annotations

import math
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

import char_lm

D_MODEL, N_LAYERS, CONTEXT, BATCH = char_lm.D_MODEL, char_lm.N_LAYERS, 64, 8
LR, BETAS, WEIGHT_DECAY, WARMUP = 1e-3, (0.9, 0.95), 0.1, 100
TOKENS, DATA_SEED = 800_000, 5050
N_NOUNS, N_VERBS, N_ADJS, N_PREPS = 320, 160, 90, 12
EVAL_BATCHES = 128


class Lexicon:
    """Token ids: the function words, then nouns (singular, plural), verbs
    (singular, plural), adjectives, prepositions."""

    FUNCTION = [".", "the", "a", "some", "this", "these", "that", "who", "and", "but", "not", "very"]

    def __init__(self, rng):
        self.words = list(self.FUNCTION)
        self.id = {w: i for i, w in enumerate(self.words)}

        def add(prefix, n):
            start = len(self.words)
            self.words += [f"{prefix}{i}" for i in range(n)]
            return start

        self.noun_sg, self.noun_pl = add("n", N_NOUNS), add("ns", N_NOUNS)
        self.verb_sg, self.verb_pl = add("v", N_VERBS), add("vp", N_VERBS)
        self.adj, self.prep = add("j", N_ADJS), add("p", N_PREPS)
        self.zipf = {n: [1.0 / (k + 1) ** 1.1 for k in range(n)] for n in (N_NOUNS, N_VERBS, N_ADJS, N_PREPS)}
        # each verb prefers a few object nouns: a fixed random affinity
        self.objects = [rng.sample(range(N_NOUNS), 12) for _ in range(N_VERBS)]
        self.transitive = [rng.random() < 0.7 for _ in range(N_VERBS)]
        # each noun has a few adjectives it takes
        self.adjs = [rng.sample(range(N_ADJS), 6) for _ in range(N_NOUNS)]

    def __len__(self):
        return len(self.words)


def _pick(rng, n, lex):
    return rng.choices(range(n), weights=lex.zipf[n])[0]


def _np(rng, lex, out, depth, noun=None):
    """A noun phrase; returns its number (True: plural)."""
    plural = rng.random() < 0.4
    n = _pick(rng, N_NOUNS, lex) if noun is None else noun
    det = rng.choice(["the", "some", "these"] if plural else ["the", "a", "this"])
    out.append(lex.id[det])
    if rng.random() < 0.35:
        if rng.random() < 0.2:
            out.append(lex.id["very"])
        out.append(lex.adj + rng.choice(lex.adjs[n]))
    out.append((lex.noun_pl if plural else lex.noun_sg) + n)
    r = rng.random()
    if depth < 2 and r < 0.15:
        out.append(lex.prep + _pick(rng, N_PREPS, lex))
        _np(rng, lex, out, depth + 1)
    elif depth < 2 and r < 0.27:
        out.append(lex.id[rng.choice(["that", "who"])])
        _vp(rng, lex, out, plural, depth + 1)
    return plural


def _vp(rng, lex, out, plural, depth):
    v = _pick(rng, N_VERBS, lex)
    if rng.random() < 0.1:
        out.append(lex.id["not"])
    out.append((lex.verb_pl if plural else lex.verb_sg) + v)
    if lex.transitive[v]:
        obj = rng.choice(lex.objects[v]) if rng.random() < 0.8 else None
        _np(rng, lex, out, depth + 1, obj)


def generate(tokens, seed):
    """`tokens` token ids of the language (a list) and the lexicon, from `seed`."""
    rng = random.Random(seed)
    lex = Lexicon(rng)
    out = []
    while len(out) < tokens:
        _vp(rng, lex, out, _np(rng, lex, out, 0), 0)
        if rng.random() < 0.15:
            out.append(lex.id[rng.choice(["and", "but"])])
            _vp(rng, lex, out, _np(rng, lex, out, 0), 0)
        out.append(lex.id["."])
    return out[:tokens], lex


def dataset():
    """(train tokens, validation tokens, vocabulary size)."""
    ids, lex = generate(TOKENS, DATA_SEED)
    t = torch.tensor(ids, dtype=torch.long)
    cut = len(t) * 9 // 10
    return t[:cut], t[cut:], len(lex)


class WordLM(nn.Module):
    """char_lm's CharLM with CONTEXT positions and the word vocabulary."""

    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, D_MODEL)
        self.pos = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList(char_lm.Block() for _ in range(N_LAYERS))
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
    """Final validation loss of a run, as char_lm.train: `make_optimizer(model,
    task=this module)` gives the optimizer."""
    import sys
    train_tokens, val_tokens, vocab = data or dataset()
    torch.manual_seed(seed)
    model = WordLM(vocab)
    opt = make_optimizer(model, task=sys.modules[__name__])
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
    return sum(p.numel() for p in WordLM(vocab).parameters())


def _adamw(model, task=None):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)


if __name__ == "__main__":
    import time
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    t = time.time()
    tr, va, vocab = data = dataset()
    ids, lex = generate(200, DATA_SEED)
    print(" ".join(lex.words[i] for i in ids[:60]))
    print(f"{len(tr) + len(va):,} tokens in {time.time() - t:.1f} s, vocab {vocab}, {num_params(vocab):,} params")
    t = time.time()
    loss = train(_adamw, int(os.environ.get("STEPS", "50")), 0, data)
    print(f"val loss {loss:.4f}, {time.time() - t:.1f} s")

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

import os
import random
import sys

import torch

import char_lm

# the model, schedule and batches are char_lm's (its sizes); gap_formats reads these
LR, BETAS, WEIGHT_DECAY = char_lm.LR, char_lm.BETAS, char_lm.WEIGHT_DECAY
TOKENS, DATA_SEED = 800_000, 5050
N_NOUNS, N_VERBS, N_ADJS, N_PREPS = 320, 160, 90, 12


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


def train(make_optimizer, steps, seed, data=None, probe=None):
    """Final validation loss of a run: char_lm's model, schedule, batches and
    evaluation (the same sizes) on this corpus; `make_optimizer(model,
    task=this module)` gives the optimizer."""
    task = sys.modules[__name__]
    return char_lm.train(lambda model: make_optimizer(model, task=task), steps, seed, data or dataset(), probe)


def num_params(vocab):
    return char_lm.num_params(vocab)


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

"""AdamW whose moments are stored the way a candidate 4-bit format would
store them, simulated in torch, so that candidates can be measured on the
task before any of them is written into the library (issue 37).

A stored moment is split into blocks of `block` elements over the flattened
tensor; each block keeps its largest |x| (after `transform`) and one code
per element: the nearest value of `qmap` to x / absmax (ties to the lower
code), or with `stochastic` one of the two neighbours with the probability
that makes the stored value unbiased. Tensors under MIN_QUANTIZED keep fp32
moments, as lowbit's default threshold does. The step itself follows
lowbit's rule: decode, update the moments in float, update the param with
the new moments, encode.

With m on the signed dynamic 4-bit map and v on the linear map without zero,
both in blocks of 128, this is lowbit's 4BIT format (run_gap's sim-4bit
checks that the simulation lands where the library does)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_QUANTIZED = 4096


def dynamic_map(exponents, unsigned):
    """The dynamic-exponent map as shared/golden/qmaps.json describes it, with
    E = `exponents`: for each exponent i the midpoints of linspace(0.1, 1,
    n_i) scaled by 10^(i-E+1), n_i = 2^(i+1)+1 unsigned (2^i+1 signed), plus
    0 and 1."""
    vals = [0.0, 1.0]
    for i in range(exponents):
        n = 2 ** (i + 1) + 1 if unsigned else 2 ** i + 1
        pts = torch.linspace(0.1, 1.0, n, dtype=torch.float64)
        mids = ((pts[:-1] + pts[1:]) / 2 * 10.0 ** (i - exponents + 1)).tolist()
        vals += mids if unsigned else mids + [-x for x in mids]
    return torch.tensor(sorted(set(vals)), dtype=torch.float64)


def linear_map(n=16):
    """{k/n, k = 1..n}: the 4BIT second moment's map (no zero)."""
    return torch.arange(1, n + 1, dtype=torch.float64) / n


def power_map(ratio, n=16):
    """{ratio^k, k = 0..n-1}: constant relative spacing, no zero."""
    return torch.tensor(sorted(ratio ** k for k in range(n)), dtype=torch.float64)


def signed_power_map(ratio):
    """0, +-ratio^k for k = 0..6 and ratio^7: 16 codes with constant relative
    spacing on each side of 0."""
    pos = [ratio ** k for k in range(7)]
    return torch.tensor(sorted([0.0, ratio ** 7] + pos + [-x for x in pos]), dtype=torch.float64)


@dataclass(frozen=True)
class Store:
    qmap: torch.Tensor  # sorted, float64, within [-1, 1]
    block: int = 128
    transform: str = "none"  # "sqrt": store sqrt(x) (x >= 0), decode its square
    stochastic: bool = False
    keep_positive: bool = False  # a positive x never stores as 0 (v)

    def roundtrip(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """x as it decodes after being stored."""
        flat = x.reshape(-1).double()
        if self.transform == "sqrt":
            flat = flat.clamp_min(0).sqrt()
        n = flat.numel()
        pad = (-n) % self.block
        blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, self.block)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        y = torch.where(absmax > 0, blocks / absmax.clamp_min(1e-300), torch.zeros_like(blocks))
        q = self.qmap
        if self.stochastic:
            hi = torch.searchsorted(q, y).clamp(1, len(q) - 1)
            lo_v, hi_v = q[hi - 1], q[hi]
            p = ((y - lo_v) / (hi_v - lo_v)).clamp(0, 1)
            u = torch.rand(y.shape, generator=gen, dtype=torch.float64)
            code = torch.where(u < p, hi, hi - 1)
        else:
            mids = (q[:-1] + q[1:]) / 2
            code = torch.searchsorted(mids, y)  # ties (y == mid) to the lower code
        if self.keep_positive:
            zero = int(torch.searchsorted(q, torch.tensor(0.0, dtype=torch.float64)))
            if zero < len(q) and q[zero] == 0:
                code = torch.where((y > 0) & (code == zero), code + 1, code)
        out = (q[code] * absmax).view(-1)[:n]
        if self.transform == "sqrt":
            out = out * out
        return out.view(x.shape).to(x.dtype)


class SimAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's math with m and v stored by `m_store` / `v_store`
    (None: fp32)."""

    def __init__(self, params, lr, betas, weight_decay, eps=1e-8, m_store=None, v_store=None, seed=0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, eps=eps))
        self.m_store, self.v_store = m_store, v_store
        self.gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                t, g = st["step"], p.grad
                m = b1 * st["m"] + (1 - b1) * g
                v = b2 * st["v"] + (1 - b2) * g * g
                p.mul_(1 - group["lr"] * group["weight_decay"])
                denom = (v / (1 - b2 ** t)).sqrt() + group["eps"]
                p.add_(-(group["lr"] / (1 - b1 ** t)) * m / denom)
                quantize = p.numel() >= MIN_QUANTIZED
                st["m"] = self.m_store.roundtrip(m, self.gen) if quantize and self.m_store else m
                st["v"] = self.v_store.roundtrip(v, self.gen) if quantize and self.v_store else v


M4 = Store(dynamic_map(3, unsigned=False))  # lowbit's 4BIT first moment (the values of qmaps.json, in float64)
V4 = Store(linear_map(), keep_positive=True)  # lowbit's 4BIT second moment

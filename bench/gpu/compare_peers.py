#!/usr/bin/env python3
"""lowbit.torch against the optimizers a PyTorch user would pick instead, on
one CUDA device, in one process, with the candidates interleaved round by
round (a noisy or throttling card affects them alike).

    python3 bench/gpu/compare_peers.py [--layout llama1b|many_small] [--steps 20] [--rounds 3]

Peers, each skipped with a message when absent: torch.optim.AdamW(fused=True)
(bf16 params: bf16 state, torch's own choice; fp32 params: fp32 state),
bitsandbytes AdamW8bit and Lion8bit. Every candidate owns its params and
grads (the same values) and is timed with CUDA events around optimizer.step()
alone (median over steps and rounds). The table gives ms/step, the bytes the
step must move per param, the fraction of the copy bandwidth measured in the
same run (a 1 GiB device-to-device copy_, read + write), and lowbit's ratio to
each peer. Not a test: prints a table, asserts nothing (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("LOWBIT_LIBRARY"):
    sys.path.insert(0, str(ROOT / "bindings"))

import torch  # noqa: E402


def layout(name):
    if name == "llama1b":  # TinyLlama-1.1B, as bench_gpu_step.cu
        h, inter, kv, vocab = 2048, 5632, 256, 32000
        t = [(vocab, h)]
        for _ in range(22):
            t += [(h, h), (kv, h), (kv, h), (h, h), (inter, h), (inter, h), (h, inter), (h,), (h,)]
        return t + [(h,), (vocab, h)]
    if name == "many_small":
        return [(128, 256)] * 2000
    raise SystemExit(f"unknown layout {name!r}")


def copy_bandwidth():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    ts = []
    for i in range(13):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        if i >= 3:
            ts.append(e0.elapsed_time(e1) * 1e-3)
    return 2 * a.numel() / statistics.median(ts)


def q8(n):  # one byte per element + an fp32 absmax per 256 (lowbit) / 256 (bnb blockwise)
    return n + 4 * ((n + 255) // 256)


def q4(n):
    return (n + 1) // 2 + 4 * ((n + 127) // 128)


def state_bytes(kind, n, elem):
    """Bytes of state read + written per step for one tensor of n elements."""
    small = n < 4096  # both lowbit and bnb keep fp32 state under 4096 elements
    if kind == "torch":
        return 2 * 2 * n * elem
    if kind in ("adamw8", "bnb_adamw8"):
        return 2 * (8 * n if small else 2 * q8(n))
    if kind in ("lion8", "bnb_lion8"):
        return 2 * (4 * n if small else q8(n))
    if kind == "adamw4":
        return 2 * (8 * n if small else 2 * q4(n))
    if kind == "adamw32":
        return 2 * 8 * n
    raise ValueError(kind)


class Candidate:
    def __init__(self, name, kind, make, dtype, shapes, seed):
        self.name, self.kind, self.dtype = name, kind, dtype
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.params = [torch.nn.Parameter((torch.randn(s, device="cuda", generator=g) * 0.02).to(dtype))
                       for s in shapes]
        for p in self.params:
            p.grad = (torch.randn(p.shape, device="cuda", generator=g) * 1e-3).to(dtype)
        self.opt = make(self.params)
        self.times = []
        elem = torch.finfo(dtype).bits // 8
        n = [p.numel() for p in self.params]
        self.bytes = sum(3 * elem * k + state_bytes(kind, k, elem) for k in n)
        self.numel = sum(n)

    def run(self, steps):
        for _ in range(steps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            self.opt.step()
            e1.record()
            self.times.append((e0, e1))

    def warm(self):
        for _ in range(3):
            self.opt.step()

    def ms(self):
        return statistics.median(e0.elapsed_time(e1) for e0, e1 in self.times)

    def free(self):
        del self.opt, self.params
        torch.cuda.empty_cache()


def candidates(dtype, with_check):
    """(name, kind, factory) for the params' dtype; peers only where importable."""
    out = []
    if dtype == torch.bfloat16:
        out.append(("torch AdamW fused (bf16 state)", "torch",
                    lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, fused=True)))
    else:
        out.append(("torch AdamW fused (fp32 state)", "torch",
                    lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, fused=True)))
    try:
        import lowbit.torch as lt
    except Exception as e:  # noqa: BLE001
        print(f"lowbit.torch not importable ({e}): nothing to compare", file=sys.stderr)
        raise SystemExit(1)
    if dtype == torch.bfloat16:
        out += [
            ("lowbit AdamW 8-bit", "adamw8",
             lambda ps: lt.AdamW(ps, lr=1e-4, weight_decay=0.01, state="8bit", skip_nonfinite=False)),
            ("lowbit AdamW 4-bit", "adamw4",
             lambda ps: lt.AdamW(ps, lr=1e-4, weight_decay=0.01, state="4bit", skip_nonfinite=False)),
            ("lowbit Lion 8-bit", "lion8",
             lambda ps: lt.Lion(ps, lr=1e-5, weight_decay=0.01, state="8bit", skip_nonfinite=False)),
        ]
        if with_check:
            out.append(("lowbit AdamW 8-bit, NaN check", "adamw8",
                        lambda ps: lt.AdamW(ps, lr=1e-4, weight_decay=0.01, state="8bit")))
        try:
            import bitsandbytes as bnb

            out += [
                ("bitsandbytes AdamW8bit", "bnb_adamw8",
                 lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-4, weight_decay=0.01)),
                ("bitsandbytes Lion8bit", "bnb_lion8",
                 lambda ps: bnb.optim.Lion8bit(ps, lr=1e-5, weight_decay=0.01)),
            ]
        except Exception as e:  # noqa: BLE001
            print(f"bitsandbytes skipped: {type(e).__name__}: {e}")
    else:
        out.append(("lowbit AdamW fp32", "adamw32",
                    lambda ps: lt.AdamW(ps, lr=1e-4, weight_decay=0.01, state="fp32", skip_nonfinite=False)))
    return out


def compare(shapes, dtype, steps, rounds, bw, with_check):
    cands = []
    for i, (name, kind, make) in enumerate(candidates(dtype, with_check)):
        try:
            c = Candidate(name, kind, make, dtype, shapes, seed=1234)
            c.warm()
            cands.append(c)
        except Exception as e:  # noqa: BLE001
            print(f"{name} skipped: {type(e).__name__}: {e}")
    torch.cuda.synchronize()
    for _ in range(rounds):
        for c in cands:
            c.run(steps)
        torch.cuda.synchronize()
    rows = [(c.name, c.ms(), c.bytes / c.numel, c.bytes / (c.ms() * 1e-3) / bw) for c in cands]
    for c in cands:
        c.free()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="llama1b", choices=("llama1b", "many_small"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32-params comparison")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    shapes = layout(args.layout)
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, layout {args.layout} "
          f"({len(shapes)} tensors), copy bandwidth {bw / 1e9:.0f} GB/s (read + write)")
    groups = [(torch.bfloat16, "bf16 params and grads")]
    if not args.no_fp32:
        groups.append((torch.float32, "fp32 params and grads"))
    for dtype, title in groups:
        rows = compare(shapes, dtype, args.steps, args.rounds, bw, with_check=dtype == torch.bfloat16)
        if not rows:
            continue
        print(f"\n{title}: median of {args.steps} x {args.rounds} steps, candidates interleaved")
        print(f"{'optimizer':<32} {'ms/step':>9} {'B/param':>8} {'of copy':>8}   ratios (lowbit / peer)")
        peers = {name: ms for name, ms, _, _ in rows if not name.startswith("lowbit")}
        for name, ms, bpp, frac in rows:
            ratio = ""
            if name.startswith("lowbit"):
                ratio = "  ".join(f"{ms / pm:.2f}x {pn.split(' (')[0]}" for pn, pm in peers.items())
            print(f"{name:<32} {ms:>9.3f} {bpp:>8.2f} {100 * frac:>7.1f}%   {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

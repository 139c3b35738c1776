"""8-bit Muon on the llama1b layout (TinyLlama-1.1B's 201 tensors, bf16) on one
GPU, in one process: lowbit.torch.Muon (8-bit and 4-bit rank-1 momentum, the
default bf16 Newton-Schulz products through cuBLAS) against torch.optim.Muon
(fp32 momentum) on the 154 matrices, the embedding, head and norms stepped by
AdamW beside it (lowbit: a hybrid group of the same optimizer; torch: a
torch.optim.AdamW). Per configuration: one warm-up step, then `steps` timed
optimizer steps (synchronised) on fixed random gradients; median ms/step,
optimizer state bytes, peak GPU memory above the params and grads.

    python3 bench/gpu/muon_llama1b.py [--steps 5]

Budget: about a minute on an H100/H200."""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

HIDDEN, INTER, LAYERS, VOCAB, KV = 2048, 5632, 22, 32000, 256


def llama1b_shapes():
    shapes = [(VOCAB, HIDDEN)]
    for _ in range(LAYERS):
        shapes += [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (INTER, HIDDEN), (INTER, HIDDEN),
                   (HIDDEN, INTER), (HIDDEN,), (HIDDEN,)]
    return shapes + [(HIDDEN,), (VOCAB, HIDDEN)]


def make_params():
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=torch.bfloat16) * 0.02) for s in llama1b_shapes()]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def split(ps):
    # Muon for the block matrices; AdamW for the embedding, the head and the norms.
    matrices = [p for i, p in enumerate(ps) if p.ndim == 2 and 0 < i < len(ps) - 1]
    others = [p for i, p in enumerate(ps) if not (p.ndim == 2 and 0 < i < len(ps) - 1)]
    return matrices, others


def run(name, make, steps):
    ps = make_params()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    opts = make(ps)
    for o in opts:
        o.step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for o in opts:
            o.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    state = torch.cuda.memory_allocated() - base
    print(f"{name:44s} {1000 * statistics.median(times):9.1f} ms {state / 2**30:9.2f} GiB {peak:9.2f} GiB",
          flush=True)
    del opts, ps
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    import lowbit.torch

    print(f"{torch.cuda.get_device_name()}, llama1b layout (bf16), {args.steps} timed steps")
    print(f"{'optimizer':44s} {'step':>12s} {'state+ws':>13s} {'peak':>13s}")

    def torch_muon(ps):
        m, o = split(ps)
        return [torch.optim.Muon(m, lr=0.02, adjust_lr_fn="match_rms_adamw"),
                torch.optim.AdamW(o, lr=1e-3, fused=True)]

    def lowbit_muon(state):
        def make(ps):
            m, o = split(ps)
            return [lowbit.torch.Muon([{"params": m}, {"params": o, "algorithm": "adamw", "lr": 1e-3}], lr=0.02,
                                      adjust_lr_fn="match_rms_adamw", state=state)]
        return make

    run("torch.optim.Muon (fp32) + AdamW (fused)", torch_muon, args.steps)
    run("lowbit.torch.Muon, 8-bit (+ AdamW 8-bit)", lowbit_muon("8bit"), args.steps)
    run("lowbit.torch.Muon, 4-bit (+ AdamW 4-bit)", lowbit_muon("4bit"), args.steps)


if __name__ == "__main__":
    main()

"""GPU memory and step time of the memory modes (issue 33) on a 1B-parameter
bf16 model, in one process on one GPU: lowbit 8-bit AdamW (state on the GPU),
lowbit 8-bit AdamW stepped inside backward, lowbit.torch.CPUOffload of 8-bit
AdamW, and torchao's CPUOffloadOptimizer (fp32 state in host memory) when
torchao is importable; torch's fused AdamW for scale.

    python3 bench/gpu/offload_1b.py [--layers 15] [--width 8192] [--steps 3]

Model: `layers` bf16 Linear(width, width) layers (15 x 8192^2 = 1.0B params),
a batch of 8 rows. Per configuration: a fresh model, one warm-up step, then
`steps` timed steps (forward, backward, step, synchronised); peak GPU memory
(torch.cuda.max_memory_allocated) over the timed steps and the median
ms/step. Budget: about 2 minutes on an H100/H200."""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch


def model(args):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width, bias=False), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).to(device="cuda", dtype=torch.bfloat16)


def run(name, make, args):
    m = model(args)
    opt, hooks = make(m)
    x = torch.randn(8, args.width, device="cuda", dtype=torch.bfloat16)

    def step():
        m(x).float().pow(2).mean().backward()
        if not hooks:
            opt.step()
            opt.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name:34s} {peak:8.2f} GiB {1000 * statistics.median(times):9.1f} ms", flush=True)
    del opt, m
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    import lowbit.torch as lt

    n = args.layers * args.width**2
    print(f"{torch.cuda.get_device_name()}: {n / 1e9:.2f}B bf16 params, batch 8; peak GPU memory, median step")
    configs = [
        ("torch AdamW (fused, bf16 state)", lambda m: (torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True), None)),
        ("lowbit 8-bit", lambda m: (lt.AdamW(m.parameters(), lr=1e-4, state="8bit"), None)),
        ("lowbit 8-bit, in backward",
         lambda m: (lambda o: (o, lt.step_in_backward(o)))(lt.AdamW(m.parameters(), lr=1e-4, state="8bit"))),
        ("lowbit 8-bit, CPUOffload", lambda m: (lt.CPUOffload(lt.AdamW, m.parameters(), lr=1e-4, state="8bit"), None)),
    ]
    try:
        from torchao.optim import CPUOffloadOptimizer

        configs.append(("torchao CPUOffloadOptimizer (fp32)",
                        lambda m: (CPUOffloadOptimizer(m.parameters(), torch.optim.AdamW, lr=1e-4), None)))
    except Exception as e:  # noqa: BLE001
        print(f"torchao's CPUOffloadOptimizer not available: {e}")
    for name, make in configs:
        try:
            run(name, make, args)
        except Exception as e:  # noqa: BLE001
            print(f"{name:34s} failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()

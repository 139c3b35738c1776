"""Peak memory and time of a training step, with and without the step
inside backward (lowbit.torch.step_in_backward), on a GPT-2-small-sized model
(124M params, random init, fp32) on the CPU, torch.optim.AdamW alongside.

    python3 bench/torch/in_backward_memory.py [--steps 4] [--seq 128] [--untied]

Each configuration runs in its own process, with glibc's mmap threshold at
64 KiB (MALLOC_MMAP_THRESHOLD_) so that a freed tensor leaves the RSS at once
and the RSS follows the live memory: the model and the optimizer are built,
the peak RSS is reset (/proc/self/clear_refs), then one warm-up step (state
allocated) and --steps training steps (forward, backward, step) run. Shown:
the RSS before them, their peak RSS, the peak above the RSS before ("step
peak": state, activations, gradients), the median time per measured step.
"grads saved" is the peak RSS of the same optimizer after backward minus its
peak inside backward, over the bytes of all gradients. With GPT-2's tied embeddings (the default) the embedding's 154 MB
gradient is created by the LM head at the start of backward and completed by
the embedding at its end, so it lives through the whole backward in either
mode; --untied unties them (163M params)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = [
    ("torch AdamW", "torch", None, False),
    ("lowbit 8-bit", "lowbit", "8bit", False),
    ("lowbit 8-bit, in backward", "lowbit", "8bit", True),
    ("lowbit 4-bit-sr", "lowbit", "4bit-sr", False),
    ("lowbit 4-bit-sr, in backward", "lowbit", "4bit-sr", True),
]


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(args) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(tie_word_embeddings=not args.untied)
    model = GPT2LMHeadModel(cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    if args.kind == "torch":
        opt = torch.optim.AdamW(params, lr=1e-4, fused=False, foreach=True)
    else:
        import lowbit.torch as lt

        opt = lt.AdamW(params, lr=1e-4, state=args.state)
        if args.in_backward:
            lt.step_in_backward(opt)
    g = torch.Generator().manual_seed(1)

    def step():
        x = torch.randint(0, cfg.vocab_size, (1, args.seq), generator=g)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if not args.in_backward:
            opt.step()
            opt.zero_grad(set_to_none=True)

    import gc

    gc.collect()
    base = rss_kb("VmRSS")  # model and optimizer built, no state yet (lowbit: allocated at the first step)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (the peak RSS) to the current RSS
    step()  # state allocated
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = rss_kb("VmHWM")
    print(json.dumps({"base_mb": base / 1024, "peak_mb": peak / 1024, "step_peak_mb": (peak - base) / 1024,
                      "grad_mb": grad_bytes / 2**20, "params": sum(p.numel() for p in params),
                      "ms": 1000 * statistics.median(times)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--kind")
    ap.add_argument("--state")
    ap.add_argument("--in-backward", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    rows = []
    for name, kind, state, inb in CONFIGS:
        if kind is None:
            continue
        cmd = [sys.executable, __file__, "--child", "--kind", kind, "--steps", str(args.steps), "--seq", str(args.seq)]
        if state:
            cmd += ["--state", state]
        if inb:
            cmd.append("--in-backward")
        if args.untied:
            cmd.append("--untied")
        out = subprocess.run(cmd, capture_output=True, text=True,
                             env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
        if out.returncode:
            print(out.stdout, out.stderr)
            raise SystemExit(f"{name} failed")
        rows.append((name, kind, state, inb, json.loads(out.stdout.strip().splitlines()[-1])))
    r0 = rows[0][4]
    print(f"GPT-2 small ({r0['params'] / 1e6:.0f}M params, {'untied' if args.untied else 'tied'} embeddings), "
          f"batch 1 x {args.seq} tokens, fp32, CPU, {args.steps} measured steps; all gradients: {r0['grad_mb']:.0f} MB")
    print(f"{'configuration':30s} {'RSS before':>11s} {'peak RSS':>9s} {'step peak':>10s} {'ms/step':>8s} {'grads saved':>12s} {'time vs after':>14s}")
    after = {state: r for _, kind, state, inb, r in rows if kind == "lowbit" and not inb}
    for name, kind, state, inb, r in rows:
        saved = vs = ""
        if inb:
            a = after[state]
            saved = f"{100 * (a['peak_mb'] - r['peak_mb']) / r['grad_mb']:.0f}%"
            vs = f"{r['ms'] / a['ms']:.3f}x"
        print(f"{name:30s} {r['base_mb']:9.0f}MB {r['peak_mb']:7.0f}MB {r['step_peak_mb']:8.0f}MB {r['ms']:8.0f} {saved:>12s} {vs:>14s}")


if __name__ == "__main__":
    main()

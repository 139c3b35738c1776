"""Peak memory and time of a training step, with and without the step
inside backward (lowbit.torch.step_in_backward), on a GPT-2-small-sized model
(124M params, random init, fp32) on the CPU, torch.optim.AdamW alongside.

    python3 bench/torch/in_backward_memory.py [--steps 4] [--seq 128] [--untied] [--sparse-embedding]
        [--trace]

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
mode; --untied unties them (163M params).

--sparse-embedding builds the token embedding with sparse gradients
(``wte.sparse = True``, as ``nn.Embedding(sparse=True)``) in the lowbit
runs: its backward then gives the rows of the batch's tokens only (a small
torch.sparse_coo tensor) instead of a dense 154 MB tensor; tied, autograd
adds it into the LM head's dense gradient; untied, the param's gradient is
sparse and lowbit densifies it for its step (the usual AdamW step on the
dense gradient, not SparseAdam). The torch AdamW row keeps the dense
embedding (torch.optim.AdamW refuses sparse gradients), so it is the same
in both modes; "grads saved" compares lowbit after backward and inside
backward with the same embedding.

--trace (lowbit runs) prints, for the last measured step, the RSS at each
event (forward done, each post-accumulate-grad hook of a param of 1M+
elements, end of backward, after opt.step()) and the peak RSS since the
previous event (the peak is reset at each event), to stderr: where the peak
of a step is (the table's peaks stay exact: the maximum over the
intervals; the traced step's time includes the tracing)."""

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


def _grad_mb(g) -> float:
    """A gradient's bytes (a sparse one's: its indices and values), in MB."""
    if g.is_sparse:
        return (g._indices().nbytes + g._values().nbytes) / 2**20
    return g.nbytes / 2**20


def child(args) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(tie_word_embeddings=not args.untied)
    model = GPT2LMHeadModel(cfg)
    model.train()
    if args.sparse_embedding:
        model.transformer.wte.sparse = True  # nn.Embedding(sparse=True): sparse_coo gradients
    params = [p for p in model.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    trace = []  # (event, VmRSS kB, peak kB since the previous event)
    tracing = [False]
    peak_seen = [0]  # the peak over the intervals between events (each resets VmHWM)

    def mark(event):
        if tracing[0]:
            hwm = rss_kb("VmHWM")
            peak_seen[0] = max(peak_seen[0], hwm)
            trace.append((event, rss_kb("VmRSS"), hwm))
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    if args.trace:
        names = {p: n for n, p in model.named_parameters()}
        for p in params:
            if p.numel() >= 1 << 20:  # before step_in_backward's hooks: the gradient is still there
                p.register_post_accumulate_grad_hook(
                    lambda q: mark(f"grad of {names[q]} ({q.grad.layout}, {_grad_mb(q.grad):.0f} MB)"))
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
        mark("start")
        loss = model(input_ids=x, labels=x).loss
        mark("forward done")
        loss.backward()
        mark("end of backward")
        if not args.in_backward:
            opt.step()
            mark("after opt.step()")
            opt.zero_grad(set_to_none=True)

    import gc

    gc.collect()
    base = rss_kb("VmRSS")  # model and optimizer built, no state yet (lowbit: allocated at the first step)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (the peak RSS) to the current RSS
    step()  # state allocated
    times = []
    for i in range(args.steps):
        tracing[0] = args.trace and i == args.steps - 1
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = max(rss_kb("VmHWM"), peak_seen[0])
    if args.trace:  # the peak was reset at each event: only the timeline means something
        print(f"{'event':60s} {'RSS':>8s} {'peak since previous':>20s}", file=sys.stderr)
        for event, rss, hwm in trace:
            print(f"{event:60s} {rss / 1024:6.0f}MB {hwm / 1024:18.0f}MB", file=sys.stderr)
    print(json.dumps({"base_mb": base / 1024, "peak_mb": peak / 1024, "step_peak_mb": (peak - base) / 1024,
                      "grad_mb": grad_bytes / 2**20, "params": sum(p.numel() for p in params),
                      "ms": 1000 * statistics.median(times)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--sparse-embedding", action="store_true",
                    help="the lowbit runs' token embedding with sparse gradients (the torch row stays dense)")
    ap.add_argument("--trace", action="store_true", help="print the RSS at each event of the last step (stderr)")
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
        if args.sparse_embedding and kind == "lowbit":
            cmd.append("--sparse-embedding")
        if args.trace and kind == "lowbit":
            cmd.append("--trace")
        out = subprocess.run(cmd, capture_output=True, text=True,
                             env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
        if out.returncode:
            print(out.stdout, out.stderr)
            raise SystemExit(f"{name} failed")
        if args.trace and kind == "lowbit":
            print(f"-- {name}: the last step's events", flush=True)
            print("\n".join(l for l in out.stderr.splitlines() if not l.startswith("W")), flush=True)
        rows.append((name, kind, state, inb, json.loads(out.stdout.strip().splitlines()[-1])))
    r0 = rows[0][4]
    sparse = ", lowbit rows with a sparse token embedding gradient" if args.sparse_embedding else ""
    print(f"GPT-2 small ({r0['params'] / 1e6:.0f}M params, {'untied' if args.untied else 'tied'} embeddings{sparse}), "
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

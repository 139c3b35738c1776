#!/usr/bin/env python3
"""lowbit demo: one small real model trained with every optimizer-state format.

A numpy MLP (2 -> 128 -> 128 -> 128 -> 4, tanh) learns to classify points of
four interleaved spiral arms (a data set generated from a fixed formula plus
seeded noise: 8,000 training and 2,000 test points). The same model, started
from the same weights and fed the same mini-batches, is trained with

  AdamW, fp32 state (the full-precision baseline)
  AdamW, bf16 state
  AdamW, 8-bit blockwise state
  AdamW, 4-bit blockwise state (and lpmm's rank-1 / Factor presets, and 4bit-sr)
  AdamW, FP8 (e4m3) state
  Lion,  8-bit state
  Muon,  fp32, 8-bit and 4-bit momentum (the weight matrices; the biases with
         AdamW in the same optimizer, the usual hybrid)

through the `lowbit` Python package (ctypes over liblowbit; the weights and
gradient buffers are numpy arrays the library updates in place, or, with
`--device cuda`, CuPy arrays on the GPU that the CUDA engine updates). It prints
progress while training, then a table of final loss, test accuracy, optimizer
state bytes per parameter and optimizer step time, and writes the loss curves
to a PNG.

Needs numpy and matplotlib (and CuPy for `--device cuda`). Run it with `make -f Makefile.python demo`, or with
LOWBIT_LIBRARY=build-py/liblowbit.so PYTHONPATH=bindings python3 examples/demo.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# The matrices here are small (128 x 128): BLAS threads only add contention,
# with each other and with the optimizer. Must be set before numpy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

try:
    import lowbit  # noqa: E402
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings"))
    import lowbit

# The array module the model runs on: numpy, or cupy under --device cuda.
xp = np

N_CLASSES = 4
HIDDEN = 128
BATCH = 128

RUNS = [
    # label, algorithm, state format, peak lr, weight decay
    ("AdamW fp32", "adamw", "fp32", 3e-3, 1e-4),
    ("AdamW bf16", "adamw", "bf16", 3e-3, 1e-4),
    ("AdamW 8-bit", "adamw", "8bit", 3e-3, 1e-4),
    ("AdamW 4-bit", "adamw", "4bit", 3e-3, 1e-4),
    ("4-bit rank-1", "adamw", "4bit-rank1", 3e-3, 1e-4),  # lpmm's 4-bit AdamW: v rank-1 normalised
    ("4-bit Factor", "adamw", "4bit-factor", 3e-3, 1e-4),  # lpmm's 4-bit Factor: v factored
    ("4-bit SR", "adamw", "4bit-sr", 3e-3, 1e-4),  # m with stochastic 4-bit codes: keeps fp32's loss on long runs
    ("AdamW fp8", "adamw", "fp8", 3e-3, 1e-4),
    ("Lion 8-bit", "lion", "8bit", 1e-3, 1e-3),
    # Muon: lr adjusted as Moonshot's match_rms_adamw, so AdamW's peak lr serves both groups
    ("Muon fp32", "muon", "fp32", 3e-3, 1e-4),
    ("Muon 8-bit", "muon", "8bit", 3e-3, 1e-4),
    ("Muon 4-bit", "muon", "4bit", 3e-3, 1e-4),
]


# ----------------------------------------------------------------- data


def make_spirals(n: int, seed: int):
    """Four spiral arms of 1.25 turns out to radius 3, with Gaussian angular
    noise large enough that neighbouring arms overlap (the loss cannot reach
    0, so the formats are compared on a loss that means something)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, N_CLASSES, size=n)
    r = rng.uniform(0.05, 1.0, size=n)
    theta = y * (2 * np.pi / N_CLASSES) + 2.5 * np.pi * r + rng.normal(0.0, 0.35, size=n)
    x = 3.0 * np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1)
    return x.astype(np.float32), y


# ----------------------------------------------------------------- model


class MLP:
    """tanh MLP with softmax cross-entropy, forward/backward in numpy.
    Weights and gradient buffers are float32 arrays updated in place."""

    def __init__(self, sizes, seed):
        rng = np.random.default_rng(seed)
        self.params, self.grads, self.names = [], [], []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            self.params += [xp.asarray(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)),
                            xp.zeros(fan_out, np.float32)]
            self.names += [f"W{i + 1}", f"b{i + 1}"]
        self.grads = [xp.zeros_like(p) for p in self.params]

    @property
    def num_params(self):
        return sum(p.size for p in self.params)

    def copy_weights_from(self, other):
        for p, q in zip(self.params, other.params):
            p[...] = q

    def loss(self, x, y, backward=False):
        acts = [x]
        h = x
        layers = len(self.params) // 2
        for i in range(layers):
            w, b = self.params[2 * i], self.params[2 * i + 1]
            z = h @ w.T + b
            h = xp.tanh(z) if i < layers - 1 else z
            acts.append(h)
        logits = acts[-1]
        logits = logits - logits.max(axis=1, keepdims=True)
        logp = logits - xp.log(xp.exp(logits).sum(axis=1, keepdims=True))
        n = x.shape[0]
        loss = float(-logp[xp.arange(n), y].mean())
        correct = int((logp.argmax(axis=1) == y).sum())
        if backward:
            d = xp.exp(logp)
            d[xp.arange(n), y] -= 1.0
            d /= n
            for i in reversed(range(layers)):
                gw, gb = self.grads[2 * i], self.grads[2 * i + 1]
                xp.matmul(d.T, acts[i], out=gw)
                xp.sum(d, axis=0, out=gb)
                if i > 0:
                    d = (d @ self.params[2 * i]) * (1.0 - acts[i] * acts[i])
        return loss, correct


# ----------------------------------------------------------------- training


def lr_at(step, total, peak):
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1.0 + np.cos(np.pi * t)))


def train(label, algorithm, state, peak_lr, wd, init, data, steps, log_every):
    xtr, ytr, xte, yte = data
    model = MLP([2, HIDDEN, HIDDEN, HIDDEN, N_CLASSES], seed=0)
    model.copy_weights_from(init)
    rng = np.random.default_rng(1234)  # identical batches for every run
    curve = np.empty(steps, dtype=np.float64)
    step_times = np.empty(steps, dtype=np.float64)
    # num_threads=1: a model this small gains nothing from threads, and the
    # engine's threads would compete with numpy's BLAS threads.
    device = "cpu" if xp is np else "cuda"
    options = {}
    if algorithm == "muon":  # quantized momentum of a matrix: rank-1 scales (one max vector per dim)
        options = dict(adjust_lr="match_rms_adamw", first_normalization="rank1" if "bit" in state else None)
    with lowbit.Optimizer(algorithm, lr=peak_lr, weight_decay=wd, state=state, num_threads=1, device=device,
                          **options) as opt:
        biases = opt.add_group(algorithm="adamw", lr=peak_lr, weight_decay=wd) if algorithm == "muon" else 0
        for p, g in zip(model.params, model.grads):
            if algorithm == "muon" and p.ndim == 2:
                opt.add_param(p, g, shape=p.shape)  # a matrix: Muon
            else:
                opt.add_param(p, g, group=biases)  # updated in place from the registered grad buffer
        state_bytes = opt.state_bytes()
        formats = sorted({opt.param_info(i).state_format for i in range(len(model.params))})
        t0 = time.perf_counter()
        ema = None
        tty = sys.stdout.isatty()
        for step in range(steps):
            idx = xp.asarray(rng.integers(0, xtr.shape[0], size=BATCH))
            loss, _ = model.loss(xtr[idx], ytr[idx], backward=True)
            opt.set_lr(lr_at(step, steps, peak_lr))
            s0 = time.perf_counter()
            opt.step()
            if xp is not np:  # the CUDA step only enqueues: time it to completion
                xp.cuda.get_current_stream().synchronize()
            step_times[step] = time.perf_counter() - s0
            curve[step] = loss
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            if (step + 1) % log_every == 0 or step + 1 == steps:
                bar = "#" * int(20 * (step + 1) / steps)
                line = f"  {label:<12} [{bar:<20}] step {step + 1:>5}/{steps}  loss {ema:.4f}"
                if tty:
                    print("\r" + line, end="", flush=True)
                elif (step + 1) % (log_every * 5) == 0 and step + 1 != steps:
                    print(line, flush=True)  # a log file gets a line every quarter
        if not tty:
            print(line, end="")
        seconds = time.perf_counter() - t0
    train_loss, _ = model.loss(xtr, ytr)
    test_loss, test_correct = model.loss(xte, yte)
    print(f"  ({seconds:.1f} s)")
    return {
        "label": label,
        "algorithm": algorithm,
        "state": state,
        "curve": curve,
        "train_loss": train_loss,
        "test_loss": test_loss,
        "test_acc": test_correct / xte.shape[0],
        "state_bytes": state_bytes,
        "bytes_per_param": state_bytes / model.num_params,
        "step_us": float(np.median(step_times) * 1e6),
        "seconds": seconds,
        "formats": formats,
    }


# The loss plot: one panel per optimizer family (small multiples), each
# state format in the same colour and line style in every panel, and AdamW
# fp32 (the baseline) as a thin grey line in the others.
FAMILIES = (("adamw", "AdamW"), ("lion", "Lion"), ("muon", "Muon (+ AdamW for the biases)"))
FAMILY_COLOURS = {"adamw": "tab:blue", "lion": "tab:green", "muon": "tab:red"}
FORMAT_STYLES = {  # state format: (colour, line style)
    "fp32": ("black", "-"),
    "bf16": ("tab:blue", "--"),
    "8bit": ("tab:green", "-"),
    "fp8": ("tab:olive", ":"),
    "4bit": ("tab:orange", "-"),
    "4bit-rank1": ("tab:red", "--"),
    "4bit-factor": ("tab:purple", "-."),
    "4bit-sr": ("tab:brown", ":"),
}


def plot(results, path, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig = plt.figure(figsize=(15, 8.5))
    grid = fig.add_gridspec(2, 3, height_ratios=[3, 2], width_ratios=[1.4, 1, 1])
    panels = [fig.add_subplot(grid[0, 0])]
    panels += [fig.add_subplot(grid[0, k], sharey=panels[0]) for k in (1, 2)]
    window = max(1, steps // 60)
    kernel = np.ones(window) / window
    x = np.arange(window, steps + 1)
    smooth = {id(r): np.convolve(r["curve"], kernel, mode="valid") for r in results}
    base = results[0]
    for ax, (family, title) in zip(panels, FAMILIES):
        if family != base["algorithm"]:
            ax.plot(x, smooth[id(base)], color="0.6", lw=1.0, label=f"{base['label']} (baseline)")
        for r in results:
            if r["algorithm"] != family:
                continue
            colour, style = FORMAT_STYLES.get(r["state"], ("tab:gray", "-"))
            ax.plot(x, smooth[id(r)], color=colour, ls=style, lw=1.6,
                    label=f"{r['label']} (final {r['train_loss']:.3f})")
        ax.set_yscale("log")
        # 0.2, not 2 x 10^-1; minor labels at 2, 3 and 5 only, clear of the decades'
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** np.floor(np.log10(v)), 6) in (2, 3, 5) else ""))
        ax.set_xlabel("step")
        ax.set_title(title, color=FAMILY_COLOURS[family])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    panels[0].set_ylabel(f"training loss (mean over {window} steps)")
    for ax in panels[1:]:
        ax.tick_params(labelleft=False)

    bx = fig.add_subplot(grid[1, :])
    labels = [r["label"] for r in results]
    values = [r["bytes_per_param"] for r in results]
    colours = [FAMILY_COLOURS.get(r["algorithm"], "tab:gray") for r in results]
    bars = bx.barh(labels[::-1], values[::-1], color=colours[::-1])
    for bar, v in zip(bars, values[::-1]):
        bx.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.2f}", va="center", fontsize=8)
    bx.set_xlabel("optimizer state, bytes per parameter (colour: the family)")
    bx.set_xlim(0, max(values) * 1.15)
    bx.tick_params(axis="y", labelsize=8)
    bx.set_title("optimizer memory")
    fig.suptitle("4-class spirals, MLP 2-128-128-128-4: every optimizer-state format")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500, help="training steps per optimizer (default 1500)")
    ap.add_argument("--out", default=os.path.join("out", "lowbit_demo.png"), help="PNG path for the loss curves")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model and the optimizer run (cuda: CuPy arrays, lowbit's CUDA engine)")
    args = ap.parse_args(argv)
    global xp
    if args.device == "cuda":
        try:
            import cupy
        except ImportError:
            ap.error("--device cuda needs CuPy (pip install cupy-cuda12x or cupy-cuda13x)")
        xp = cupy
    else:
        xp = np

    steps = args.steps
    x, y = make_spirals(10000, seed=7)
    x, y = xp.asarray(x), xp.asarray(y)
    data = (x[:8000], y[:8000], x[8000:], y[8000:])
    init = MLP([2, HIDDEN, HIDDEN, HIDDEN, N_CLASSES], seed=42)
    print(f"lowbit {lowbit.version()} ({lowbit.library_path()})")
    print(f"model: MLP 2-{HIDDEN}-{HIDDEN}-{HIDDEN}-{N_CLASSES} ({init.num_params:,} params), "
          f"data: 4-class spirals (8,000 train / 2,000 test), batch {BATCH}, {steps} steps per optimizer, "
          f"on {args.device}")
    print("tensors under 4,096 elements (biases, first and last layer) keep fp32 state with the quantized formats\n")

    results = []
    for label, algorithm, state, lr, wd in RUNS:
        results.append(train(label, algorithm, state, lr, wd, init, data, steps, log_every=max(1, steps // 20)))

    base = results[0]
    print()
    header = (f"{'optimizer':<12} {'final loss':>10} {'vs fp32':>8} {'test acc':>9} {'state B/param':>14} "
              f"{'state bytes':>12} {'step time':>10}")
    print(header)
    print("-" * len(header))
    for r in results:
        rel = (r["train_loss"] / base["train_loss"] - 1.0) * 100.0
        print(f"{r['label']:<12} {r['train_loss']:>10.4f} {rel:>+7.1f}% {100 * r['test_acc']:>8.1f}% "
              f"{r['bytes_per_param']:>14.2f} {r['state_bytes']:>12,} {r['step_us']:>8.0f}us")
    print("(final loss: cross-entropy over the whole training set; step time: median of lowbit's optimizer step)")

    if not args.no_plot:
        plot(results, args.out, steps)
        print(f"\nloss curves written to {os.path.abspath(args.out)}")
    return results


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""lowbit.jax against optax.adamw on one CUDA device, in one process, on a
pytree of the llama1b shapes (bench_gpu_step.cu's layout, fp32 leaves).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/gpu/compare_jax.py [--steps 20] [--rounds 3]

Candidates, each on its own params (same values) and the same grads, all
under jax.jit with params and state donated: optax.adamw (fp32 state),
lowbit.jax.adamw(...).step with fp32 and with 8-bit state (the CUDA FFI
handler, skip_nonfinite off: optax checks nothing). Rounds interleave the
candidates; ms/step is the median over rounds of the time of --steps steps
dispatched back to back (one wait at the end) over --steps; "synced" waits
after every step (the host's dispatch of ~800 buffers included). Prints the
bytes each step moves per param, the fraction of a copy's bandwidth (an
in-place, donated elementwise pass over 1 GiB under jit, read + write) and
the ratios to optax. Not a test: asserts nothing (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("LOWBIT_LIBRARY"):
    sys.path.insert(0, str(ROOT / "bindings"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError as e:
    print(f"compare_jax: {e.name} is not installed; skipped")
    sys.exit(0)

import lowbit.jax as ljax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_peers import layout, q8  # noqa: E402

LR, WD = 1e-4, 1e-2


def timed(fn, steps):
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def copy_bandwidth():
    """Read + write bytes per second of an in-place elementwise pass over 1 GiB
    (donated, so XLA allocates nothing), 10 passes back to back."""
    box = [jnp.ones((1 << 28,), jnp.float32)]
    f = jax.jit(lambda x: x * 1.0000001, donate_argnums=0)
    box[0] = jax.block_until_ready(f(box[0]))

    def ten():
        for _ in range(10):
            box[0] = f(box[0])
        jax.block_until_ready(box[0])
    ts = timed(ten, 5)
    return 2 * box[0].nbytes * 10 / min(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="llama1b", choices=("llama1b", "many_small"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--any-backend", action="store_true", help="run on the CPU too (to check this script)")
    args = ap.parse_args(argv)
    if jax.default_backend() != "gpu" and not args.any_backend:
        print(f"jax backend is {jax.default_backend()}: no GPU, nothing to measure")
        return 0
    shapes = layout(args.layout)
    key = jax.random.PRNGKey(0)
    keys = jax.random.split(key, len(shapes))
    p0 = {f"t{i:03d}": 0.02 * jax.random.normal(k, s, jnp.float32) for i, (k, s) in enumerate(zip(keys, shapes))}
    grads = {k: 1e-3 * jax.random.normal(jax.random.fold_in(key, i), v.shape, jnp.float32)
             for i, (k, v) in enumerate(p0.items())}
    sizes = [v.size for v in p0.values()]
    n = sum(sizes)
    bw = copy_bandwidth()
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}, optax {optax.__version__}, "
          f"layout {args.layout} ({len(shapes)} fp32 leaves, {n:,} params), copy {bw / 1e9:.0f} GB/s")

    def fresh():
        return jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), p0)

    tx = optax.adamw(LR, weight_decay=WD)

    def optax_step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    runs = {}
    p = fresh()
    f = jax.jit(optax_step, donate_argnums=(0, 1))
    # bytes: params read + written and grads read (12 B), two fp32 moments read + written (16 B)
    runs["optax.adamw (fp32 state)"] = [f, {"p": p, "s": tx.init(p)}, "psg", 28 * n]
    for st in ("fp32", "8bit"):
        opt = ljax.adamw(LR, weight_decay=WD, state_format=st, skip_nonfinite=False)
        p = fresh()
        state_b = 16 * n if st == "fp32" else sum(2 * (8 * k if k < 4096 else 2 * q8(k)) for k in sizes)
        runs[f"lowbit.jax adamw {st}"] = [jax.jit(opt.step, donate_argnums=(0, 2)), {"p": p, "s": opt.init(p)},
                                          "pgs", 12 * n + state_b]

    def stepper(entry, steps):
        """`steps` steps dispatched back to back, then one wait: the device's
        time per step once the host's dispatch of ~800 buffers per call runs
        ahead (as inside a jitted training step); `synced` waits after each."""
        fn, box, order, _ = entry

        def one():
            if order == "pgs":
                box["p"], box["s"] = fn(box["p"], grads, box["s"])
            else:
                box["p"], box["s"] = fn(box["p"], box["s"], grads)

        def run():
            for _ in range(steps):
                one()
            jax.block_until_ready(box["p"])

        def synced():
            one()
            jax.block_until_ready(box["p"])
        return run, synced

    fns = {name: stepper(e, args.steps) for name, e in runs.items()}
    for _, synced in fns.values():
        synced()  # compile
    times = {name: [] for name in runs}
    sync_times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (run, synced) in fns.items():
            times[name] += [t / args.steps for t in timed(run, 1)]
            sync_times[name] += timed(synced, 3)
    ref = statistics.median(times["optax.adamw (fp32 state)"])
    print(f"{'candidate':<28} {'ms/step':>9} {'synced':>9} {'B/param':>8} {'of copy':>8} {'vs optax':>9}")
    for name, ts in times.items():
        m = statistics.median(ts)
        b = runs[name][3]
        print(f"{name:<28} {m * 1e3:>9.3f} {statistics.median(sync_times[name]) * 1e3:>9.3f} {b / n:>8.2f} "
              f"{100 * b / m / bw:>7.1f}% {m / ref:>8.2f}x")
    a = jnp.concatenate([v.ravel() for v in jax.tree_util.tree_leaves(runs["optax.adamw (fp32 state)"][1]["p"])])
    b = jnp.concatenate([v.ravel() for v in jax.tree_util.tree_leaves(runs["lowbit.jax adamw fp32"][1]["p"])])
    print(f"check: max |lowbit.jax fp32 - optax| = {float(jnp.max(jnp.abs(a - b))):.3g} "
          f"after {1 + args.rounds * (args.steps + 3)} steps (same grads every step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""lowbit.jax vs optax.adamw on the CPU, in one process, and the C engine on
the same layout (lowbit.Optimizer) so that the cost of the JAX path shows.

    OMP_WAIT_POLICY=PASSIVE python3 bench/cpu/compare_jax.py [--rounds 15] [--threads 0]

Layout: 8M params in 16 float32 leaves of 500,000 (--leaves, --numel).

Candidates, each on its own params (same initial values) and the same grads:
  optax            optax.adamw under jax.jit, params and state donated
  ljax.step        lowbit.jax.adamw(...).step under jit, params and state
                   donated (the fused step, in place)
  ljax.step nodon  the same without donation: XLA copies params and state
                   before the in-place custom call
  ljax.step eager  opt.step called outside jit (op-by-op dispatch, no donation)
  ljax.update      lowbit.jax's optax-style update + optax.apply_updates under
                   jit, donated (the fused step, then updates = new - old and
                   old + updates)
  capi             lowbit.Optimizer (ctypes) over numpy arrays: the C engine
                   alone, one lowbit_optimizer_step per step
for state fp32 and 8bit (lowbit) and fp32 (optax). lowbit runs with
skip_nonfinite=False unless --skip-nonfinite (optax checks nothing).

Timing: one warm-up step each (compiles), then --rounds rounds of one timed
step each (jax.block_until_ready included), the order rotated every round;
median ms/step, "spread" = (max - min) / median, and the ratios "vs optax" /
"vs capi" = the median over rounds of the two times measured in the same
round (robust to the machine's load changing between rounds).
"""

from __future__ import annotations

import argparse
import os
import sys

import _common  # sets OMP_WAIT_POLICY and the library path before the imports below
from _common import interleave, loadavg, med, paired_ratio, spread, table

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError as e:
    print(f"compare_jax: {e.name} is not installed (pip install jax optax); skipped")
    sys.exit(0)

import numpy as np

import lowbit

try:
    import lowbit.jax as ljax

    ljax.library_path()
except ImportError as e:
    print(f"compare_jax: lowbit.jax is not available: {e}")
    sys.exit(0)

LR, WD = 1e-3, 1e-2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--numel", type=int, default=500_000, help="elements per leaf")
    ap.add_argument("--threads", type=int, default=0, help="lowbit threads (0: all OpenMP threads)")
    ap.add_argument("--states", nargs="+", default=["fp32", "8bit"])
    ap.add_argument("--skip-nonfinite", action="store_true")
    ap.add_argument("--only", nargs="+", default=None, help="run only these candidates (names as printed)")
    args = ap.parse_args()

    print(f"jax {jax.__version__} ({jax.default_backend()}), optax {optax.__version__}, lowbit {lowbit.version()} "
          f"({ljax.library_path()}), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    rng = np.random.default_rng(0)
    shapes = [(args.numel,)] * args.leaves
    p0 = {f"w{i:02d}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    g0 = {k: (1e-3 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in p0.items()}
    n = sum(v.size for v in p0.values())
    grads = jax.tree_util.tree_map(jnp.asarray, g0)

    steps = {}
    finals = {}

    def fresh():
        return jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), p0)

    # optax
    tx = optax.adamw(LR, weight_decay=WD)

    def optax_step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    def jitted(fn, donate):
        return jax.jit(fn, donate_argnums=donate)

    def runner(name, fn, params, state, order):
        box = {"p": params, "s": state}

        def one():
            if order == "pgs":
                box["p"], box["s"] = fn(box["p"], grads, box["s"])
            else:
                box["p"], box["s"] = fn(box["p"], box["s"], grads)
            jax.block_until_ready(box["p"])

        steps[name] = one
        finals[name] = box

    p = fresh()
    runner("optax fp32", jitted(optax_step, (0, 1)), p, tx.init(p), "psg")

    for st in args.states:
        opt = ljax.adamw(LR, weight_decay=WD, state_format=st, skip_nonfinite=args.skip_nonfinite,
                         num_threads=args.threads)
        p = fresh()
        runner(f"ljax.step {st}", jitted(opt.step, (0, 2)), p, opt.init(p), "pgs")
        if st == "fp32":
            p = fresh()
            runner(f"ljax.step nodon {st}", jax.jit(opt.step), p, opt.init(p), "pgs")

            def upd(p, s, g, opt=opt):
                u, s = opt.update(g, s, p)
                return optax.apply_updates(p, u), s

            p = fresh()
            runner(f"ljax.update {st}", jitted(upd, (0, 1)), p, opt.init(p), "psg")
            p = fresh()
            runner(f"ljax.step eager {st}", opt.step, p, opt.init(p), "pgs")
        # the C engine on the same layout
        h = lowbit.Optimizer("adamw", lr=LR, weight_decay=WD, state=st, skip_nonfinite=args.skip_nonfinite,
                             num_threads=args.threads)
        arrays = {k: v.copy() for k, v in p0.items()}
        for k in arrays:
            h.add_param(arrays[k], g0[k])
        steps[f"capi {st}"] = h.step
        finals[f"capi {st}"] = {"p": arrays}

    if args.only:
        steps = {k: v for k, v in steps.items() if k in args.only}
    load0 = loadavg()
    times = interleave(steps, rounds=args.rounds, warmup=1)
    load1 = loadavg()
    print(f"\n== {args.leaves} leaves of {args.numel:,} float32 ({n:,} params), {args.rounds} rounds, "
          f"load average {load0} -> {load1}, lowbit threads {args.threads or 'all'}, "
          f"skip_nonfinite={args.skip_nonfinite}")
    ref = times.get("optax fp32")
    rows = []
    for name, ts in times.items():
        ms = 1e3 * med(ts)
        capi = times.get(f"capi {name.split()[-1]}")
        rows.append((name, f"{ms:.2f}", spread(ts), f"{paired_ratio(ts, ref):.2f}x" if ref else "",
                     f"{paired_ratio(ts, capi):.2f}x" if capi and not name.startswith("optax") else ""))
    print(table(rows, ("candidate", "ms/step", "spread", "vs optax", "vs capi (same state)")))

    # cross-check: fp32 AdamW is the same update in optax and lowbit
    if "optax fp32" in finals and "ljax.step fp32" in finals:
        a = np.concatenate([np.asarray(v).ravel() for v in jax.tree_util.tree_leaves(finals["optax fp32"]["p"])])
        b = np.concatenate([np.asarray(v).ravel() for v in jax.tree_util.tree_leaves(finals["ljax.step fp32"]["p"])])
        print(f"check: max |lowbit.jax fp32 - optax| = {np.abs(a - b).max():.3g} after {1 + args.rounds} steps")


if __name__ == "__main__":
    main()

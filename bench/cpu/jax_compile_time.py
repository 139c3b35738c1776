"""How long XLA takes to compile lowbit.jax's fused step as the pytree grows,
and the step time it then runs at (CPU).

    python3 bench/cpu/jax_compile_time.py [--leaves 100 200 300 500] [--numel 4096] [--state fp32]

Each leaf is a float32 vector of --numel; the step is jax.jit(opt.step,
donate_argnums=(0, 2)), compiled ahead of time (lower().compile()), then run
1 + 20 times (median printed). A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _common  # noqa: F401  (environment and library path, before the imports below)

try:
    import jax
    import jax.numpy as jnp
except ImportError as e:
    print(f"jax_compile_time: {e.name} is not installed; skipped")
    sys.exit(0)

import lowbit.jax as ljax


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, nargs="+", default=[100, 200, 300, 500])
    ap.add_argument("--numel", type=int, default=4096)
    ap.add_argument("--state", default="fp32")
    args = ap.parse_args()
    print(f"jax {jax.__version__}, lowbit.jax FFI protocol {ljax.PROTOCOL_VERSION}, state {args.state}, "
          f"leaves of {args.numel:,} float32")
    print(f"{'leaves':>7} {'compile s':>10} {'step ms':>9}")
    for n in args.leaves:
        params = {f"w{i:05d}": jnp.zeros(args.numel, jnp.float32) for i in range(n)}
        grads = {k: jnp.ones(args.numel, jnp.float32) for k in params}
        opt = ljax.adamw(1e-3, weight_decay=1e-2, state_format=args.state, skip_nonfinite=False)
        state = opt.init(params)
        t0 = time.perf_counter()
        step = jax.jit(opt.step, donate_argnums=(0, 2)).lower(params, grads, state).compile()
        compile_s = time.perf_counter() - t0
        params, state = step(params, grads, state)
        jax.block_until_ready(params)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            params, state = step(params, grads, state)
            jax.block_until_ready(params)
            times.append(time.perf_counter() - t0)
        print(f"{n:>7} {compile_s:>10.2f} {1e3 * statistics.median(times):>9.2f}")


if __name__ == "__main__":
    main()

"""The Python cost of lowbit.Optimizer.step on tiny arrays (issue 45, item 15):
the median wall time of one step() over 1 and over 8 fp32 numpy params of 64
elements (fp32 state: the library's own work is a few hundred nanoseconds),
with the registered grads (step()) and with grads passed at each call
(step(grads)), over many calls. Not a timed test: run it on a quiet machine.

    LOWBIT_LIBRARY=build/liblowbit.so PYTHONPATH=bindings python3 bench/python/step_overhead.py [--calls N]
"""

import argparse
import statistics
import time

import numpy as np

import lowbit


def _median_us(fn, calls: int, repeats: int = 5) -> float:
    """The median over `repeats` runs of the mean time of `calls` calls, in us."""
    for _ in range(max(10, calls // 20)):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def measure(n_params: int, calls: int, numel: int = 64) -> dict:
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(numel).astype(np.float32) for _ in range(n_params)]
    grads = [rng.standard_normal(numel).astype(np.float32) * 1e-3 for _ in range(n_params)]
    with lowbit.Optimizer("adamw", lr=1e-4, num_threads=1) as opt:
        for p, g in zip(params, grads):
            opt.add_param(p, g)
        registered = _median_us(opt.step, calls)
        passed = _median_us(lambda: opt.step(grads), calls)
    return {"registered": registered, "passed": passed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000, help="calls per timed run (5 runs, median)")
    args = ap.parse_args()
    print(f"lowbit {lowbit.__version__}: median us per Optimizer.step, fp32 params of 64 elements, fp32 state")
    print(f"{'params':>6} {'step()':>10} {'step(grads)':>12}")
    results = {n: measure(n, args.calls) for n in (1, 8)}
    for n, r in results.items():
        print(f"{n:>6} {r['registered']:>10.1f} {r['passed']:>12.1f}")
    for key, label in (("registered", "step()"), ("passed", "step(grads)")):
        per = (results[8][key] - results[1][key]) / 7
        print(f"{label}: {per:.1f} us per further param")


if __name__ == "__main__":
    main()

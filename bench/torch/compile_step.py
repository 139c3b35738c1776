"""torch.compile over `opt.step()`: lowbit.torch against torch.optim.AdamW,
in one process, PyTorch's recipe for compiled optimizers (the lr a tensor in
the param groups, an lr scheduler writing it every step).

    LOWBIT_LIBRARY=build/liblowbit.so PYTHONPATH=bindings \\
        python3 bench/torch/compile_step.py [--layers 4] [--width 256] [--steps 50] [--device cpu|cuda]
        [--states fp32,8bit] [--mode default|reduce-overhead] [--warm-cache]

Params: a transformer-like set of tensors (per layer 4 d*d attention
matrices, d*4d and 4d*d MLP matrices, their biases and two norms' weights and
biases), fp32, fixed random grads. Per optimizer (torch AdamW, foreach, the
library's default; lowbit AdamW for each --states), after torch._dynamo.reset():

* graph breaks / graphs: from torch._dynamo.explain(fn) on the optimizer
  after its first step (torch's first step initialises its state behind a
  deliberate graph break), and the graph-break events and unique graphs
  counted by torch._dynamo.utils.counters over the whole run;
* recompiles: torch._dynamo.utils.counters["recompiles"] over --steps steps
  of CosineAnnealingLR(T_max=steps) (lr=torch.tensor(1e-3));
* first compiled step: wall time of the first call of the compiled function
  (tracing and inductor's compile included), after a warm-up compile of an
  unrelated function so that neither optimizer pays inductor's one-time
  start; inductor's caches go to a fresh directory unless --warm-cache;
* steady state: median time of the compiled step over the last half of the
  steps, and of the eager step (same optimizer class, own params) for
  reference. On CUDA each timed call ends with a synchronize.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--states", default="fp32,8bit", help="lowbit state formats, comma-separated")
    ap.add_argument("--mode", default="default", help="torch.compile mode (default, reduce-overhead, ...)")
    ap.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk caches (default: a fresh dir)")
    return ap.parse_args()


def shapes(layers: int, d: int) -> list:
    out = [(d,), (d,)]  # final norm
    for _ in range(layers):
        out += [(d, d)] * 4 + [(d,)] * 4 + [(4 * d, d), (4 * d,), (d, 4 * d), (d,)] + [(d,)] * 4
    return out


def main() -> None:
    args = parse()
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lowbit-compile-bench-")
    import torch
    from torch._dynamo.utils import counters

    import lowbit.torch as lt

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    mode = None if args.mode == "default" else args.mode
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sizes = shapes(args.layers, args.width)
    n_elems = sum(torch.Size(s).numel() for s in sizes)

    def make_params():
        g = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.02).to(device)) for s in sizes]
        for p in params:
            p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(device)
        return params

    makers = [("torch AdamW", lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(1e-3), weight_decay=0.01))]
    for state in [s for s in args.states.split(",") if s]:
        makers.append((f"lowbit AdamW {state}",
                       lambda ps, state=state: lt.AdamW(ps, lr=torch.tensor(1e-3), weight_decay=0.01, state=state)))

    print(f"torch {torch.__version__}, device {device}, {len(sizes)} params, {n_elems / 1e6:.2f}M elements, "
          f"{args.steps} steps, mode {args.mode}, threads {torch.get_num_threads()}, "
          f"inductor cache {'warm' if args.warm_cache else 'fresh'}")

    # inductor's one-time start (imports, codegen toolchain) paid here, by neither optimizer
    torch.compile(lambda x: (x * 2 + 1).sum(), mode=mode)(torch.ones(8, device=device))
    sync()

    rows = []
    for name, make in makers:
        torch._dynamo.reset()
        counters.clear()
        params = make_params()
        opt = make(params)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

        def fn():
            opt.step()

        compiled = torch.compile(fn, mode=mode)
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            compiled()
            sync()
            times.append(time.perf_counter() - t)
            sched.step()
        breaks_run = sum(counters["graph_break"].values())
        graphs_run = counters["stats"]["unique_graphs"]
        recompiles = sum(counters["recompiles"].values())
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)()  # the optimizer has stepped: torch's state exists

        eager_params = make_params()
        eager = make(eager_params)
        eager_times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            eager.step()
            sync()
            eager_times.append(time.perf_counter() - t)
        half = args.steps // 2
        rows.append((name, explained.graph_break_count, explained.graph_count, breaks_run, graphs_run, recompiles,
                     times[0], statistics.median(times[half:]), statistics.median(eager_times[half:])))
        del opt, eager, params, eager_params

    head = ("optimizer", "breaks", "graphs", "break events", "graphs (run)", "recompiles",
            "1st compiled step s", "compiled step ms", "eager step ms")
    print(" | ".join(head))
    for r in rows:
        print(f"{r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.2f} | {r[7] * 1e3:.3f} | {r[8] * 1e3:.3f}")
    torch_first = rows[0][6]
    for r in rows[1:]:
        print(f"{r[0]}: first compiled step {r[6]:.2f} s = {r[6] / torch_first:.2f}x torch AdamW's {torch_first:.2f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""lowbit vs torch.optim.AdamW(fused=True) on the CPU, in one process.

    OMP_WAIT_POLICY=PASSIVE python3 bench/cpu/compare_torch.py [--threads 2]
        [--layout default|many_small|all] [--rounds 9] [--cases ...]
        [--peers torchao bnb] [--targets avx2|avx512]

LOWBIT_CPU_KERNELS=avx2 measures the AVX2 level on an AVX-512 machine; the
header names the CPU (lscpu's model and its SIMD flags) and the level that ran.

Candidates, each on its own params (same initial values) and the same grads:
  torch     torch.optim.AdamW(fused=True), fp32 params + state, or bf16
            params (whose fused AdamW keeps bf16 state)
  torch.lb  lowbit.torch (AdamW / Lion), the drop-in optimizer, its thread
            count left at the default (torch.get_num_threads())
  capi.lb   lowbit.Optimizer, the ctypes API: one lowbit_optimizer_step call
            per step over registered grads, num_threads=--threads
Cases and the targets (lowbit time / torch time), by level (--targets; the
level that runs by default): avx512 (issue 14) / avx2 (issue 49)
  adamw fp32 state, fp32 params  vs torch fp32          <= 1.05 / 1.05
  adamw bf16 state, bf16 params  vs torch bf16 (bf16 state)  <= 1.05 / 1.05
  adamw 8bit, bf16 params        vs torch bf16          <= 1.00 / 1.50
  adamw fp8,  bf16 params        vs torch bf16          <= 1.00 / 1.30
  lion  8bit, bf16 params        vs torch bf16 AdamW    <= 1.00 / 1.00
  adamw 4bit, bf16 params        vs torch bf16          <= 1.10 / 1.70
  adamw 4bit-sr, bf16 params     vs torch bf16          <= 1.10 / 1.70
  adamw 8bit, fp32 params        vs torch fp32          <= 1.00 / 1.00
      (the host step of an offloaded optimizer: torchao's CPUOffloadOptimizer
      runs torch's fused fp32 AdamW on the host)
Peers (--peers, on the bf16 params): torchao's AdamW8bit (torch.compile'd;
its first step compiles, outside the timed rounds) and bitsandbytes'
AdamW8bit (CPU backend), each with the lowbit 8-bit row's "vs" column
against it: lowbit's time / the peer's.
Layouts: default = 32M params in 16 tensors of 2M; many_small = 2000 tensors
of 4096.

Timing: every candidate takes one warm-up step, then --rounds rounds of one
timed step each, the order rotated every round (noise hits all alike); the
table gives the median ms/step, "spread" = (max - min) / median, and "vs
torch" = the median over rounds of lowbit's time / torch's time in the same
round (robust to the machine's load changing between rounds). lowbit runs with skip_nonfinite=False by default
(torch's fused AdamW without a grad scaler checks nothing; --skip-nonfinite
measures lowbit's default, one more read of the grads).

Copy reference, in the same process and rounds: torch copy_ (b = a),
torch.add(b, c, alpha=s, out=a) (triad) and a.add_(c, alpha=s) (update: reads
and writes the same array, as a step does with params and state, so it pays
no write-allocate read) on float32 arrays of max(4 x LLC, 128 MiB), torch's
threads = --threads, counted as bytes read + written (2x, 3x and 3x the
array), best round of each; the reference is the largest, so that "of bw"
does not flatter. "of bw" = bytes the step must move / median time /
reference, where the bytes are param (read + write) + grad (read) + state
(read + write).
"""

from __future__ import annotations

import argparse
import sys

import _common  # sets OMP_WAIT_POLICY and the library path before the imports below
from _common import copy_array_bytes, interleave, loadavg, med, paired_ratio, spread, table

try:
    import torch
except ImportError:
    print("compare_torch: torch is not installed (pip install torch); nothing to compare against, skipped")
    sys.exit(0)

import lowbit
import lowbit.torch as lbt

LAYOUTS = {
    "default": ("32M params in 16 tensors", 16, 2_000_000),
    "many_small": ("2000 tensors of 4096", 2000, 4096),
}

# name: (algorithm, state, param dtype, peer dtype, {level: target ratio})
CASES = {
    "adamw-fp32": ("adamw", "fp32", torch.float32, torch.float32, {"avx512": 1.05, "avx2": 1.05}),
    "adamw-bf16": ("adamw", "bf16", torch.bfloat16, torch.bfloat16, {"avx512": 1.05, "avx2": 1.05}),
    "adamw-8bit": ("adamw", "8bit", torch.bfloat16, torch.bfloat16, {"avx512": 1.00, "avx2": 1.50}),
    "adamw-fp8": ("adamw", "fp8", torch.bfloat16, torch.bfloat16, {"avx512": 1.00, "avx2": 1.30}),
    "lion-8bit": ("lion", "8bit", torch.bfloat16, torch.bfloat16, {"avx512": 1.00, "avx2": 1.00}),
    "adamw-4bit": ("adamw", "4bit", torch.bfloat16, torch.bfloat16, {"avx512": 1.10, "avx2": 1.70}),
    "adamw-4bit-sr": ("adamw", "4bit-sr", torch.bfloat16, torch.bfloat16, {"avx512": 1.10, "avx2": 1.70}),
    "adamw-8bit-fp32": ("adamw", "8bit", torch.float32, torch.float32, {"avx512": 1.00, "avx2": 1.00}),
}


def cpu_model() -> str:
    """lscpu's model name and the SIMD flags that decide the level."""
    name, flags = "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name == "?":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vbmi", "avx512_bf16", "amx_bf16")
            if f in flags]
    return f"{name} ({' '.join(simd) or 'no AVX'})"


def make_peer(kind, params):
    """A peer 8-bit AdamW over `params` (bf16) and a one-line description, or
    None (not installed, or it cannot run here) with the reason."""
    try:
        if kind == "torchao":
            from torchao.optim import AdamW8bit
            return AdamW8bit(params, lr=LR, weight_decay=WD), "torchao AdamW8bit (torch.compile)"
        if kind == "bnb":
            import bitsandbytes as bnb
            return bnb.optim.AdamW8bit(params, lr=LR, weight_decay=WD), f"bitsandbytes {bnb.__version__} AdamW8bit"
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        return None, f"{kind}: {type(e).__name__}: {e}"
    return None, f"{kind}: unknown peer"

LR, WD, LION_LR = 1e-3, 1e-2, 1e-4
ES = {torch.float32: 4, torch.bfloat16: 2}


def make_tensors(layout, dtype, seed):
    """The layout's params (normal) in `dtype`, deterministic in `seed`."""
    _, count, numel = layout
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g).to(dtype) for _ in range(count)]


def clone_params(src):
    return [t.clone().requires_grad_(True) for t in src]


def attach(params, grads):
    for p, g in zip(params, grads):
        p.grad = g


def run_layout(args, layout_name):
    layout = LAYOUTS[layout_name]
    title, count, numel = layout
    n = count * numel
    threads = args.threads
    torch.set_num_threads(threads)
    cases = [c for c in args.cases]
    dtypes = sorted({CASES[c][2] for c in cases} | {CASES[c][3] for c in cases} |
                    ({torch.bfloat16} if args.peers else set()), key=str)

    init = {dt: make_tensors(layout, dt, 1) for dt in dtypes}
    grads = {dt: [x * 1e-3 for x in make_tensors(layout, dt, 2)] for dt in dtypes}

    step = {}
    meta = {}  # candidate -> (case or peer dtype, bytes per param)
    holders = {}  # candidate -> the params it updates (for the cross-check)
    es = ES
    extra_grad_read = 1 if args.skip_nonfinite else 0

    # peers: torch fused AdamW, one per dtype
    for dt in sorted({CASES[c][3] for c in cases}, key=str):
        ps = clone_params(init[dt])
        attach(ps, grads[dt])
        opt = torch.optim.AdamW(ps, lr=LR, weight_decay=WD, fused=True)
        name = f"torch {str(dt).replace('torch.', '')}"
        step[name] = opt.step
        meta[name] = (dt, 3 * es[dt] + 2 * 2 * es[dt])
        holders[name] = ps

    peers = {}  # name -> description
    for kind in args.peers:
        ps = clone_params(init[torch.bfloat16])
        attach(ps, grads[torch.bfloat16])
        opt, what = make_peer(kind, ps)
        if opt is None:
            print(f"peer {what}: left out")
            continue
        name = f"peer {kind}"
        step[name] = opt.step
        peers[name] = what
        meta[name] = (torch.bfloat16, None)

    for c in cases:
        algo, state, pdt, _, _ = CASES[c]
        lr = LION_LR if algo == "lion" else LR
        # lowbit.torch
        ps = clone_params(init[pdt])
        attach(ps, grads[pdt])
        cls = lbt.AdamW if algo == "adamw" else lbt.Lion
        opt = cls(ps, lr=lr, weight_decay=WD, state=state, skip_nonfinite=args.skip_nonfinite)
        name = f"{c} torch.lb"
        step[name] = opt.step  # the warm-up step registers the params
        meta[name] = (c, opt)
        holders[name] = ps
        # lowbit.Optimizer (ctypes)
        ps2 = [t.clone() for t in init[pdt]]
        h = lowbit.Optimizer(algo, lr=lr, weight_decay=WD, state=state, skip_nonfinite=args.skip_nonfinite,
                             num_threads=threads)
        for p, g in zip(ps2, grads[pdt]):
            h.add_param(p, g)
        name = f"{c} capi.lb"
        step[name] = h.step
        meta[name] = (c, h)
        holders[name] = ps2

    # copy reference, interleaved with the steps
    nbytes = copy_array_bytes()
    ca = torch.ones(nbytes // 4)
    cb = torch.full_like(ca, 2.0)
    cc = torch.full_like(ca, 0.5)
    step["copy"] = lambda: cb.copy_(ca)
    step["triad"] = lambda: torch.add(cb, cc, alpha=3.0, out=ca)
    step["update"] = lambda: cb.add_(cc, alpha=1e-3)

    load0 = loadavg()
    times = interleave(step, rounds=args.rounds, warmup=1)
    load1 = loadavg()

    for name, (what, opt) in list(meta.items()):
        if not name.startswith(("torch ", "peer ")):  # lowbit: state bytes as the library reports them
            pdt = CASES[what][2]
            meta[name] = (what, (3 + extra_grad_read) * es[pdt] + 2 * opt.state_bytes() / n)

    copy_bw = 2 * nbytes / min(times["copy"])
    triad_bw = 3 * nbytes / min(times["triad"])
    update_bw = 3 * nbytes / min(times["update"])
    ref = max(copy_bw, triad_bw, update_bw)

    info = lowbit.build_info()
    level = args.targets or info["cpu_kernels"] or "avx512"  # a library before 0.8: its best level
    print(f"\n== {title} ({n:,} params), {threads} threads, {args.rounds} rounds, "
          f"load average {load0} -> {load1}, skip_nonfinite={args.skip_nonfinite}")
    print(f"CPU {cpu_model()}; lowbit CPU kernels {info['cpu_kernels'] or '(not reported)'} (codec {info['cpu_codec'] or '?'}), "
          f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}; targets of the {level} level")
    print(f"copy reference {ref / 1e9:.2f} GB/s = max(copy_ {copy_bw / 1e9:.2f}, triad {triad_bw / 1e9:.2f}, "
          f"update {update_bw / 1e9:.2f}) "
          f"(torch, {threads} threads, bytes read + written, best round, {nbytes >> 20} MiB arrays)")

    rows = []
    peer_ms = {}
    for name, (what, bpp) in meta.items():
        if name.startswith("torch "):
            ms = 1e3 * med(times[name])
            peer_ms[what] = ms
    for name, what in peers.items():
        ms = 1e3 * med(times[name])
        rows.append((what, "peer", f"{ms:.2f}", spread(times[name]), "", "", "", "", ""))
    for dt, ms in sorted(peer_ms.items(), key=lambda kv: -ES[kv[0]]):
        name = f"torch {str(dt).replace('torch.', '')}"
        bpp = meta[name][1]
        rows.append((f"torch fused AdamW {str(dt).replace('torch.', '')}", "torch", f"{ms:.2f}",
                     spread(times[name]), f"{bpp:.2f}", f"{100 * bpp * n / (ms * 1e-3) / ref:.0f}%", "", "", ""))
    results = []
    for c in cases:
        algo, state, pdt, peer, targets = CASES[c]
        target = targets.get(level, targets["avx512"])
        for api in ("torch.lb", "capi.lb"):
            name = f"{c} {api}"
            ms = 1e3 * med(times[name])
            bpp = meta[name][1]
            ratio = paired_ratio(times[name], times[f"torch {str(peer).replace('torch.', '')}"])
            ok = "ok" if ratio <= target else "MISS"
            results.append((layout_name, c, api, ms, ratio, target))
            rows.append((f"{algo} {state} state, {str(pdt).replace('torch.', '')} params", api, f"{ms:.2f}",
                         spread(times[name]), f"{bpp:.2f}", f"{100 * bpp * n / (ms * 1e-3) / ref:.0f}%",
                         f"{ratio:.2f}x", f"<={target:.2f}x", ok))
            if state == "8bit" and pdt == torch.bfloat16:
                for pname, what in peers.items():
                    r = paired_ratio(times[name], times[pname])
                    rows.append((f"  {api} vs {what}", "", "", "", "", "", f"{r:.2f}x", "<1.00x",
                                 "ok" if r < 1.0 else "MISS"))
    print(table(rows, ("case", "impl", "ms/step", "spread", "B/param", "of bw", "vs torch", "target", "")))

    # cross-check: the same algorithm on the same inputs gives close params
    steps_done = 1 + args.rounds
    for c in cases:
        algo, state, pdt, peer, _ = CASES[c]
        if algo != "adamw" or state not in ("fp32", "bf16"):
            continue
        a = torch.cat([t.detach().float() for t in holders[f"{c} torch.lb"]])
        b = torch.cat([t.detach().float() for t in holders[f"torch {str(peer).replace('torch.', '')}"]])
        print(f"check {c}: max |lowbit.torch - torch| = {float((a - b).abs().max()):.3g} after {steps_done} steps "
              f"(params ~1, lr {LR})")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads of torch and lowbit (default 2)")
    ap.add_argument("--layout", choices=[*LAYOUTS, "all"], default="all")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--peers", nargs="*", choices=["torchao", "bnb"], default=[],
                    help="8-bit peers timed in the same rounds (torchao's AdamW8bit, bitsandbytes' AdamW8bit)")
    ap.add_argument("--targets", choices=["avx2", "avx512"], default=None,
                    help="whose targets to print (default: the level that runs)")
    ap.add_argument("--skip-nonfinite", action="store_true",
                    help="lowbit with skip_nonfinite=True (its default): one more read of the grads")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    print(f"torch {torch.__version__}, lowbit {lowbit.version()} ({lowbit.library_path()}), "
          f"OMP_WAIT_POLICY={_common.os.environ.get('OMP_WAIT_POLICY')}")
    layouts = list(LAYOUTS) if args.layout == "all" else [args.layout]
    for name in layouts:
        run_layout(args, name)


if __name__ == "__main__":
    main()

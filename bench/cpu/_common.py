"""What compare_torch.py and compare_jax.py share: the environment, the
layouts, interleaved timing and the table.

Import this module before torch, jax or lowbit: it sets OMP_WAIT_POLICY
(PASSIVE unless the caller set it: with two OpenMP runtimes in one process,
torch's and lowbit's, spinning idle threads of one steal the cores of the
other), points LOWBIT_LIBRARY at ./build when unset, and puts bindings/ on
sys.path when the library comes from a build tree.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if not os.environ.get("LOWBIT_LIBRARY") and (ROOT / "build" / "liblowbit.so").exists():
    os.environ["LOWBIT_LIBRARY"] = str(ROOT / "build" / "liblowbit.so")
if os.environ.get("LOWBIT_LIBRARY") or importlib.util.find_spec("lowbit") is None:
    sys.path.insert(0, str(ROOT / "bindings"))


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def llc_bytes() -> int:
    """Largest cache level of cpu0 from sysfs (glibc's sysconf may take a
    VM's cpuid at its word); 32 MiB when unknown."""
    largest = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in range(8):
        try:
            s = (base / f"index{idx}" / "size").read_text().strip()
        except OSError:
            continue
        unit = 1024 * 1024 if s.endswith("M") else 1024
        try:
            largest = max(largest, int(s.rstrip("KM")) * unit)
        except ValueError:
            pass
    return largest or 32 << 20


def copy_array_bytes() -> int:
    """STREAM's rule: each array at least 4x the last-level cache."""
    return max(4 * llc_bytes(), 128 << 20)


def interleave(candidates: dict, rounds: int, warmup: int = 1, timer=time.perf_counter) -> dict:
    """Runs each candidate (name -> zero-argument callable doing one step)
    `warmup` times, then `rounds` rounds of one timed call each. The order
    rotates from round to round, so that a slow phase of the machine and
    cache or frequency effects of the predecessor hit every candidate alike.
    Returns name -> list of seconds."""
    names = list(candidates)
    for _ in range(warmup):
        for n in names:
            candidates[n]()
    times = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            fn = candidates[n]
            t0 = timer()
            fn()
            times[n].append(timer() - t0)
    return times


def med(ts) -> float:
    return statistics.median(ts)


def paired_ratio(a, b) -> float:
    """Median over rounds of a[r] / b[r]: both timed in the same round, a
    few milliseconds apart, so a slow phase of the machine (other work on the
    cores) cancels out of each ratio, where a ratio of medians keeps it."""
    return statistics.median(x / y for x, y in zip(a, b))


def spread(ts) -> str:
    """(max - min) / median of a candidate's rounds, a noise indicator."""
    m = med(ts)
    return f"{100 * (max(ts) - min(ts)) / m:.0f}%" if m > 0 else "?"


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 or i == 1 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*header)]
    out += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(out)

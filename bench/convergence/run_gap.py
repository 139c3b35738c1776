#!/usr/bin/env python3
"""How far each optimizer-state format's final validation loss falls behind
fp32 AdamW, at a short and a 5x longer horizon, over seeds, on one or more
tasks (issues 37 and 50). Every run is one process-pool task on one thread;
the table gives the gap in percent, the mean over seeds and each seed's, one
table per task.

Tasks (TASKS; each a module of this folder with char_lm's interface):
  char_lm     2-layer char-level transformer on the repository's source text
  shapes_cnn  small CNN on generated 16x16 images of 8 shape classes
  grammar_lm  2-layer word-level transformer on text of a generated grammar

  python3 bench/convergence/run_gap.py                       # the default table (about 8 min on 2 cores)
  python3 bench/convergence/run_gap.py --formats fp32 4bit 4bit-v --steps 600 --seeds 0
  python3 bench/convergence/run_gap.py --tasks char_lm shapes_cnn grammar_lm --steps 600
  python3 bench/convergence/run_gap.py --json out.json       # the raw losses too
  python3 bench/convergence/run_gap.py --report a.json b.json  # one table (a column per task and horizon)
                                                             # of the runs in earlier --json files
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import _paths  # noqa: F401,E402  (sys.path and LOWBIT_LIBRARY, before lowbit)
os.environ.setdefault("OMP_NUM_THREADS", "1")

# task -> its seconds per step on one core of the 2-core VM (for the order of the pool only)
TASKS = {"char_lm": 0.04, "shapes_cnn": 0.05, "grammar_lm": 0.06}
_DATA = {}


def _run(job):
    import importlib
    import torch
    torch.set_num_threads(1)
    table, task_name, name, steps, seed = job
    task = importlib.import_module(task_name)
    if task_name not in _DATA:
        _DATA[task_name] = task.dataset()
    module, attr = table.split(":")
    make = getattr(importlib.import_module(module), attr)[name]
    t = time.time()
    loss = task.train(make, steps, seed, _DATA[task_name])
    return (task_name, name, steps, seed), loss, time.time() - t


def train_all(table, names, steps_list, seeds, jobs, tasks=("char_lm",)):
    """task.train of every (task, name, steps, seed) on a pool of `jobs`
    processes, long runs first (so that the pool ends together). `table`:
    "module:dict" of name -> function(model) -> optimizer, in this folder
    (char_lm calls it with the model; the other tasks add task=module).
    Prints each run as it ends; returns {(task, name, steps, seed): final loss}."""
    work = sorted(((table, t, n, s, seed) for t in tasks for s in steps_list for seed in seeds for n in names),
                  key=lambda j: -j[3] * TASKS.get(j[1], 0.05))
    losses, t0 = {}, time.time()
    with ProcessPoolExecutor(jobs) as pool:
        for (t, n, s, seed), loss, secs in pool.map(_run, work):
            losses[(t, n, s, seed)] = loss
            print(f"  {t:10s} {n:14s} {s:5d} steps seed {seed}: val loss {loss:.4f} ({secs:.0f} s)", flush=True)
    print(f"\n{len(work)} runs in {time.time() - t0:.0f} s\n")
    return losses


def main(argv=None):
    from gap_formats import FORMATS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", nargs="+", default=["fp32", "8bit", "4bit", "4bit-rank1", "4bit-factor"],
                    choices=sorted(FORMATS))
    ap.add_argument("--steps", nargs="+", type=int, default=[600, 3000])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--tasks", nargs="+", default=["char_lm"], choices=sorted(TASKS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write every run's loss here")
    ap.add_argument("--report", nargs="+", metavar="JSON", help="run nothing: print the table of these --json files")
    args = ap.parse_args(argv)
    if args.report:
        losses = {}
        for f in args.report:
            for r in json.loads(Path(f).read_text()):
                losses[(r.get("task", "char_lm"), r["format"], r["steps"], r["seed"])] = r["loss"]
        print(wide_table(losses))
        return
    formats = args.formats if "fp32" in args.formats else ["fp32"] + args.formats
    losses = train_all("gap_formats:FORMATS", formats, args.steps, args.seeds, args.jobs, args.tasks)
    for t in args.tasks:
        print(f"{t}:\n" + table({k[1:]: v for k, v in losses.items() if k[0] == t}, formats, args.steps, args.seeds)
              + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps([dict(task=t, format=f, steps=s, seed=seed, loss=l)
                                               for (t, f, s, seed), l in sorted(losses.items())], indent=1))


def gap(losses, fmt, steps, seed):
    ref = losses[("fp32", steps, seed)]
    return 100.0 * (losses[(fmt, steps, seed)] - ref) / ref


def wide_table(losses):
    """Markdown table of {(task, format, steps, seed): loss}: a row per
    format, a column per horizon and task; fp32's cells give its losses, the
    others the mean gap over the seeds both ran, then each seed's."""
    tasks = [t for t in TASKS if any(k[0] == t for k in losses)]
    from gap_formats import FORMATS
    order = list(FORMATS)
    formats = sorted({k[1] for k in losses}, key=lambda f: (order.index(f) if f in order else len(order), f))
    steps_list = sorted({k[2] for k in losses})
    cols = [(s, t) for s in steps_list for t in tasks if any(k[0] == t and k[2] == s for k in losses)]
    rows = ["| format | " + " | ".join(f"{t}, {s} steps" for s, t in cols) + " |", "|---|" + "---|" * len(cols)]
    for f in formats:
        cells = []
        for s, t in cols:
            seeds = sorted(k[3] for k in losses if k[:3] == (t, f, s) and (t, "fp32", s, k[3]) in losses)
            if not seeds:
                cells.append("")
            elif f == "fp32":
                cells.append("loss " + ", ".join(f"{losses[(t, f, s, x)]:.4f}" for x in seeds))
            else:
                g = [100.0 * (losses[(t, f, s, x)] / losses[(t, "fp32", s, x)] - 1) for x in seeds]
                cells.append(f"{sum(g) / len(g):+.2f}% (" + ", ".join(f"{x:+.2f}" for x in g) + ")")
        rows.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table(losses, formats, steps_list, seeds):
    """Markdown table of {(format, steps, seed): loss} (one task's)."""
    head = "| format | " + " | ".join(f"{s} steps: gap (per seed)" for s in steps_list) + " |"
    rows = [head, "|---|" + "---|" * len(steps_list)]
    for f in formats:
        cells = []
        for s in steps_list:
            if f == "fp32":
                cells.append("loss " + ", ".join(f"{losses[(f, s, seed)]:.4f}" for seed in seeds))
                continue
            g = [gap(losses, f, s, seed) for seed in seeds]
            cells.append(f"{sum(g) / len(g):+.2f}% (" + ", ".join(f"{x:+.2f}" for x in g) + ")")
        rows.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()

"""Run by torchrun (tests/python/test_torch_zeroone_lamb.py): DDP +
lowbit.torch.ZeroOneAdam and DDP + lowbit.torch.OneBitLamb (with
onebit_ddp_comm_hook) against uncompressed references of the same
algorithms (below, pure torch, exact averages where lowbit sends 1 bit), on
the model and data of torch_onebit_worker.py, on CPU with gloo. Rank 0
prints one JSON line of results; every rank checks what it can.

    torchrun --nproc-per-node N torch_zeroone_lamb_worker.py <case> <seed>
case: train | robust (resume, non-finite gradients, mismatched sizes)
"""
import dataclasses
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lowbit
import lowbit.torch as lt
from torch_onebit_worker import BATCH, data, global_loss, model, same_on_all_ranks

LR_ADAM, LR_LAMB = 1e-3, 1e-2


# ----------------------------------------------------------------- references


def average(tensors):
    """The exact mean over the ranks of a list of tensors (one all_reduce)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    return [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


class ZeroOneSchedule:
    """0/1 Adam's schedules as capi/lowbit.h documents them (DeepSpeed's
    ZeroOneAdam, counting steps from 1): t is the number of steps applied."""

    def __init__(self, var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper):
        self.F, self.kappa = var_freeze_step, var_update_scaler
        self.local_scaler, self.clipper = local_step_scaler, local_step_clipper
        self.t, self.var_interval, self.var_counter = 0, 1, 0
        self.local_interval, self.local_counter = 1, 0

    def next_phase2(self):
        return self.t + 1 > self.F

    def next_variance(self):
        """The next step is a variance step (on gradients averaged uncompressed)."""
        return not self.next_phase2() and (self.t + 1) % self.var_interval == 0

    def next_sync(self):
        return self.next_phase2() and (self.t + 1) % self.local_interval == 0

    def advance(self):
        variance, phase2 = self.next_variance(), self.next_phase2()
        self.t += 1
        if variance:
            self.var_counter += 1
            if self.var_counter == self.kappa:
                self.var_counter, self.var_interval = 0, 2 * self.var_interval
        if phase2:
            self.local_counter += 1
            if self.local_counter == self.local_scaler:
                self.local_counter = 0
                self.local_interval = min(self.clipper, 2 * self.local_interval)

    def fields(self):
        return dict(var_interval=self.var_interval, var_counter=self.var_counter,
                    local_step_interval=self.local_interval, local_step_counter=self.local_counter,
                    next_full_average=self.next_variance())


class RefZeroOneAdam:
    """0/1 Adam (capi/lowbit.h) without compression: the exact mean over the
    ranks where lowbit sends 1 bit. Phase 1: every step on the averaged
    gradient, v only on variance steps; phase 2: local steps on this rank's
    gradient, and at each synchronisation the exact mean of the updates since
    the last one. No bias correction; decoupled weight decay."""

    def __init__(self, params, lr, betas, eps, weight_decay, **schedule):
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.s = ZeroOneSchedule(**schedule)
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.sync = [p.detach().clone() for p in self.params]
        self.lrs = 0.0

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        lr, b1, b2 = self.lr, self.b1, self.b2
        grads = [p.grad for p in self.params]
        if not self.s.next_phase2():
            variance = self.s.next_variance()
            for p, m, v, g in zip(self.params, self.m, self.v, average(grads)):
                m.mul_(b1).add_(g, alpha=1 - b1)
                if variance:
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                p.mul_(1 - lr * self.wd).addcdiv_(m, v.sqrt() + self.eps, value=-lr)
            self.sync = [p.detach().clone() for p in self.params]  # phase 2 starts from here
        else:
            sync = self.s.next_sync()
            self.lrs += lr
            for p, m, v, g in zip(self.params, self.m, self.v, grads):
                m.mul_(b1).add_(g, alpha=1 - b1)
                p.mul_(1 - lr * self.wd).addcdiv_(m, v.sqrt() + self.eps, value=-lr)
            if sync:
                D = [v.sqrt() + self.eps for v in self.v]
                d = average([(ps - p) * Di for ps, p, Di in zip(self.sync, self.params, D)])
                for p, m, ps, di, Di in zip(self.params, self.m, self.sync, d, D):
                    m.copy_(di / self.lrs)
                    p.copy_(ps - di / Di)
                self.sync = [p.detach().clone() for p in self.params]
                self.lrs = 0.0
        self.s.advance()


class RefLamb:
    """LAMB without bias correction on gradients averaged exactly: m, v as
    Adam's, u = m / (sqrt(v) + eps) + wd p, per-tensor trust ratio ||p|| /
    ||u|| clipped to [min_coeff, max_coeff] (1 if a norm is 0)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_coeff=10.0,
                 min_coeff=0.01):
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.max_coeff, self.min_coeff = max_coeff, min_coeff
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m, v, g in zip(self.params, self.m, self.v, average([p.grad for p in self.params])):
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            u = m / (v.sqrt() + self.eps) + self.wd * p
            w, r = p.norm().item(), u.norm().item()
            c = min(max(w / r, self.min_coeff), self.max_coeff) if w > 0 and r > 0 else 1.0
            p.sub_(u, alpha=self.lr * c)


class RefOneBitLambExact:
    """1-bit LAMB (capi/lowbit.h) with the exact mean where lowbit sends 1
    bit: warm-up = RefLamb recording the EMA of the trust ratio (steps where
    it is exactly 1 left out) and seeding the fresh variance at t ==
    freeze_step; then v and the EMA are frozen, the momentum moves with the
    averaged gradient (the per-tensor scaling cancels in an exact mean), the
    fresh variance with the reconstructed gradient (= the averaged one), and
    the coefficient is the frozen EMA times the clipped factor."""

    def __init__(self, params, lr, freeze_step, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_coeff=10.0,
                 min_coeff=0.01, coeff_beta=0.9, factor_max=4.0, factor_min=0.5, factor_threshold=0.1):
        self.params = list(params)
        self.lr, self.freeze, (self.b1, self.b2), self.eps, self.wd = lr, freeze_step, betas, eps, weight_decay
        self.max_coeff, self.min_coeff, self.coeff_beta = max_coeff, min_coeff, coeff_beta
        self.fmax, self.fmin, self.fthr = factor_max, factor_min, factor_threshold
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.vf = [torch.zeros_like(p) for p in self.params]
        self.coeff = [0.0] * len(self.params)
        self.last = [1.0] * len(self.params)
        self.t = 0

    zero_grad = RefLamb.zero_grad

    @torch.no_grad()
    def step(self):
        self.t += 1
        warm = self.t <= self.freeze
        for i, (p, m, v, g) in enumerate(zip(self.params, self.m, self.v, average([p.grad for p in self.params]))):
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            D = v.sqrt() + self.eps
            if warm:
                v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
                D = v.sqrt() + self.eps
                if self.t == self.freeze:
                    self.vf[i].copy_(v)
                u = m / D + self.wd * p
                w, r = p.norm().item(), u.norm().item()
                c = min(max(w / r, self.min_coeff), self.max_coeff) if w > 0 and r > 0 else 1.0
                if c != 1.0:
                    self.coeff[i] = self.coeff_beta * self.coeff[i] + (1 - self.coeff_beta) * c
            else:
                self.vf[i].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
                pre = m / D
                u = pre + self.wd * p
                f = (D / (self.vf[i].sqrt() + self.eps)).max().item()
                if self.wd > 0:
                    r = u.norm().item()
                    rho = min(1.0, pre.norm().item() / r) if r > 0 else 1.0
                    f = f * rho + 1 - rho
                f = min(max(f, self.fmin), self.fmax)
                f = min(max(f, self.last[i] * (1 - self.fthr)), self.last[i] * (1 + self.fthr))
                self.last[i] = f
                c = self.coeff[i] * f
            p.sub_(u, alpha=self.lr * c)


def local_hook(state, bucket):
    """A DDP comm hook that leaves the gradients local (the references average
    them themselves)."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


# ----------------------------------------------------------------- training


def set_lr(opt, lr):
    if hasattr(opt, "param_groups"):
        for group in opt.param_groups:
            group["lr"] = lr
    else:
        opt.lr = lr


def train(seed, make_opt, steps, *, lowbit_hook, before_step=None, after_step=None, poison=None, hidden=64,
          lr_at=None):
    """DDP training on this rank's data; lowbit_hook: onebit_ddp_comm_hook
    (a lowbit optimizer), else the gradients stay local (a reference)."""
    rank = dist.get_rank()
    net = model(seed, hidden)
    ddp = DDP(net)
    opt = make_opt(net.parameters())
    ddp.register_comm_hook(None, lt.onebit_ddp_comm_hook(opt) if lowbit_hook else local_hook)
    x, y = data(seed, rank)
    g = torch.Generator().manual_seed(seed * 7 + rank)
    for t in range(steps):
        idx = torch.randint(0, x.shape[0], (BATCH,), generator=g)  # a fresh minibatch per step
        opt.zero_grad()
        if lr_at is not None:
            set_lr(opt, lr_at(t))
        loss = nn.functional.mse_loss(ddp(x[idx]), y[idx])
        if poison is not None and poison(t, opt) and rank == dist.get_world_size() - 1:
            loss = loss * float("nan")  # a NaN in this rank's backward, before DDP's all-reduce
        loss.backward()
        if before_step:
            before_step(t, net, opt)
        opt.step()
        if after_step:
            after_step(t, net, opt)
    return net, opt, x, y


# 0/1 Adam in the training case follows DeepSpeed's recipe for it (the 0/1
# Adam tutorial and DeepSpeedExamples' BERT-large seq128 configuration:
# 125000 steps, lr warmup over the first 10% then exponential decay to 0.114x
# (0.99 every 520 steps), var_freeze_step = the end of the warm-up (12500),
# var_update_scaler 16, local_step_scaler 32678 = 29% of the steps after the
# freeze, local_step_clipper 16), scaled to 1280 steps: warm-up and variance
# until step 128, local_step_scaler 336. Phase 1 sees variance intervals 1, 2,
# 4, 8; phase 2 local intervals 1, 2, 4, 8 as in the recipe (the last step,
# 1280, is a synchronisation: every interval divides it). The decay is what
# makes 1-bit exchanges harmless: at a constant lr the same schedule ends 3%
# below to 138% above the reference, and the recipe over 640 steps +0.7% to
# +4.7% (bench/NOTES.md).
ZO_TRAIN = dict(var_freeze_step=128, var_update_scaler=16, local_step_scaler=336, local_step_clipper=16)
ZO_STEPS = 1280
ZO_FINAL_LR = 0.114  # the recipe's decay over the steps after the warm-up: 0.99 ** ((125000 - 12500) / 520)


def zeroone_lr(t):
    """The lr of step t + 1 (t counts from 0, as in train()): linear warm-up
    to LR_ADAM at var_freeze_step, then exponential decay to ZO_FINAL_LR x
    LR_ADAM at the last step. The same for every optimizer it is compared with."""
    s, w = t + 1, ZO_TRAIN["var_freeze_step"]
    return LR_ADAM * (s / w if s <= w else ZO_FINAL_LR ** ((s - w) / (ZO_STEPS - w)))
# The final loss of a 0/1 Adam run and of its reference: the mean of the
# full-data loss at the last 8 synchronisations (the local interval is 8 by
# then), where every replica holds the same params. One step's loss swings by
# a few percent from one synchronisation to the next at this loss level (0.09).
ZO_TAIL = range(ZO_STEPS - 56, ZO_STEPS + 1, 8)
LAMB_FREEZE, LAMB_STEPS = 160, 640


def make_zeroone(p, schedule=ZO_TRAIN, **kw):
    return lt.ZeroOneAdam(p, lr=LR_ADAM, num_threads=1, **schedule, **kw)


def make_lamb(p, freeze=LAMB_FREEZE, **kw):
    return lt.OneBitLamb(p, lr=LR_LAMB, freeze_step=freeze, num_threads=1, **kw)


def case_train(seed):
    W = dist.get_world_size()
    out = {}
    numel = sum(p.numel() for p in model(seed).parameters())
    out["numel"] = numel
    x, y = data(seed, dist.get_rank())
    out["initial_loss"] = global_loss(model(seed), x, y)
    out["ddp_fp32_bytes_per_step"] = 2 * (W - 1) * 4 * numel // W  # a ring all-reduce of fp32 gradients

    # -- 0/1 Adam: lowbit against the uncompressed reference, the schedules step by step
    tails = {"ref": [], "lowbit": []}

    def record_tail(which):
        def after(t, net, opt):
            if t + 1 in ZO_TAIL:
                tails[which].append((global_loss(net, x, y), same_on_all_ranks(net)))
        return after

    net, _, x, y = train(seed, lambda p: RefZeroOneAdam(p, LR_ADAM, (0.9, 0.999), 1e-8, 0.0, **ZO_TRAIN),
                         ZO_STEPS, lowbit_hook=False, lr_at=zeroone_lr, after_step=record_tail("ref"))
    out["ref_zeroone_loss"] = global_loss(net, x, y)
    out["ref_zeroone_tail_loss"] = sum(loss for loss, _ in tails["ref"]) / len(ZO_TAIL)
    out["ref_zeroone_same"] = same_on_all_ranks(net)
    # for information: DDP + torch.optim.Adam (bias-corrected, every step on averaged gradients)
    out["adam_loss"] = global_loss(train_ddp_plain(seed, lambda p: torch.optim.Adam(p, lr=LR_ADAM), ZO_STEPS,
                                                   lr_at=zeroone_lr), x, y)

    sched = ZeroOneSchedule(**ZO_TRAIN)
    mismatches = []
    windows = {"zeroone_phase1": (ZO_TRAIN["var_freeze_step"] - 16, ZO_TRAIN["var_freeze_step"]),
               "zeroone_phase2": (ZO_STEPS - 128, ZO_STEPS)}
    sent = {}

    def count(t, net, opt, windows=windows, sent=sent):
        tr = opt.communicator.transport
        for name, (a, b) in windows.items():
            if t + 1 == a:
                tr.reset_counters()
            if t + 1 == b:
                sent[name] = tr.wire_bytes_sent() / (b - a)

    def check_schedule(t, net, opt):
        sched.advance()
        st = opt.onebit_status()
        mine = dict(var_interval=st.var_interval, var_counter=st.var_counter,
                    local_step_interval=st.local_step_interval, local_step_counter=st.local_step_counter,
                    next_full_average=st.next_full_average)
        if st.step != sched.t or mine != sched.fields():
            mismatches.append({"t": sched.t, "step": st.step, "lowbit": mine, "reference": sched.fields()})
        count(t, net, opt)
        record_tail("lowbit")(t, net, opt)

    net, opt, x, y = train(seed, make_zeroone, ZO_STEPS, lowbit_hook=True, after_step=check_schedule,
                           lr_at=zeroone_lr)
    out["zeroone_loss"] = global_loss(net, x, y)
    out["zeroone_tail_loss"] = sum(loss for loss, _ in tails["lowbit"]) / len(ZO_TAIL)
    # the tail steps are synchronisations: the replicas agree there
    out["zeroone_tail_synchronised"] = len(tails["lowbit"]) == len(ZO_TAIL) and all(same for _, same in tails["lowbit"])
    out["zeroone_same"] = same_on_all_ranks(net)
    out["zeroone_schedule_mismatches"] = mismatches[:5]
    out["zeroone_status"] = dataclasses.asdict(opt.onebit_status())

    # -- 1-bit LAMB: lowbit against plain LAMB on averaged gradients
    net, _, _, _ = train(seed, lambda p: RefLamb(p, LR_LAMB), LAMB_STEPS, lowbit_hook=False)
    out["ref_lamb_loss"] = global_loss(net, x, y)
    out["ref_lamb_same"] = same_on_all_ranks(net)
    net, _, _, _ = train(seed, lambda p: RefOneBitLambExact(p, LR_LAMB, LAMB_FREEZE), LAMB_STEPS, lowbit_hook=False)
    out["ref_lamb_exact_loss"] = global_loss(net, x, y)
    lamb_windows = {"lamb_warmup": (LAMB_FREEZE - 64, LAMB_FREEZE), "lamb_compressed": (LAMB_STEPS - 128, LAMB_STEPS)}
    averaged = []

    def lamb_count(t, net, opt):
        averaged.append(opt.onebit_status().next_full_average)
        count(t, net, opt, lamb_windows)

    net, opt, x, y = train(seed, make_lamb, LAMB_STEPS, lowbit_hook=True, after_step=lamb_count)
    out["lamb_loss"] = global_loss(net, x, y)
    out["lamb_same"] = same_on_all_ranks(net)
    # the warm-up is steps 1..freeze_step: the next step is averaged while t < freeze_step
    out["lamb_averaged_ok"] = averaged == [t + 1 < LAMB_FREEZE for t in range(LAMB_STEPS)]

    # -- 1-bit Adam, for the bytes table
    ob_windows = {"onebit_adam_warmup": (LAMB_FREEZE - 64, LAMB_FREEZE - 1),
                  "onebit_adam_compressed": (LAMB_STEPS - 128, LAMB_STEPS)}
    train(seed, lambda p: lt.OneBitAdam(p, lr=LR_ADAM, freeze_step=LAMB_FREEZE, num_threads=1), LAMB_STEPS,
          lowbit_hook=True, after_step=lambda t, net, opt: count(t, net, opt, ob_windows))
    out["bytes_per_step"] = sent
    return out


def train_ddp_plain(seed, make_opt, steps, lr_at=None):
    """DDP with its own fp32 all-reduce (no hook) and a torch optimizer."""
    rank = dist.get_rank()
    net = model(seed)
    ddp = DDP(net)
    opt = make_opt(net.parameters())
    x, y = data(seed, rank)
    g = torch.Generator().manual_seed(seed * 7 + rank)
    for t in range(steps):
        idx = torch.randint(0, x.shape[0], (BATCH,), generator=g)
        opt.zero_grad()
        if lr_at is not None:
            set_lr(opt, lr_at(t))
        nn.functional.mse_loss(ddp(x[idx]), y[idx]).backward()
        opt.step()
    return net


# ----------------------------------------------------------------- resume, non-finite, bad sizes

# Short schedules: phase 1 variance intervals 1, 2, 4, 8; phase 2 local
# intervals 1, 2, 4.
ZO_SHORT = dict(var_freeze_step=30, var_update_scaler=4, local_step_scaler=6, local_step_clipper=4)
ZO_SHORT_STEPS = 60  # a synchronisation
LAMB_SHORT_FREEZE, LAMB_SHORT_STEPS = 12, 30


def zeroone_kind(s: ZeroOneSchedule) -> str:
    """What 0/1 Adam's next step is."""
    if s.next_variance():
        return "variance" if s.var_interval > 1 else "variance1"
    if not s.next_phase2():
        return "onebit_gradient"
    if s.t == s.F:
        return "first_phase2"
    if s.next_sync():
        return "sync" if s.local_interval > 1 else "sync1"
    return "local"


ZEROONE_SYNCED = ("variance1", "variance", "onebit_gradient", "first_phase2", "sync1", "sync")  # same params after


def lamb_kind(t, freeze):
    """What 1-bit LAMB's next step is, after t steps."""
    if t + 1 < freeze:
        return "warmup"
    if t + 1 == freeze:
        return "last_warmup"
    return "first_compressed" if t == freeze else "compressed"


def params_of(net):
    return [p.detach().clone() for p in net.parameters()]


def equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def all_ranks(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def resume(seed, make_opt, steps, kind_of):
    """Snapshot the first step of each kind (model, optimizer state dict, the
    gradients the step got), run on; then restore each snapshot into a fresh
    model and optimizer (after onebit_ddp_comm_hook, like the original) and
    take that step again: the params, status and error buffers must be the
    same bits."""
    snaps, kinds_seen = {}, set()

    def before(t, net, opt):
        kind = kind_of(t, opt)
        if kind not in kinds_seen:
            kinds_seen.add(kind)
            snaps[t] = dict(kind=kind, model={k: v.clone() for k, v in net.state_dict().items()},
                            opt=opt.state_dict(), grads=[p.grad.clone() for p in net.parameters()])

    def after(t, net, opt):
        if t in snaps:
            snaps[t]["after"] = params_of(net)
            snaps[t]["status"] = opt.onebit_status()
            snaps[t]["errors"] = opt.communicator.save_errors()

    train(seed, make_opt, steps, lowbit_hook=True, before_step=before, after_step=after)
    out = {}
    for t, s in sorted(snaps.items()):
        net2 = model(seed + 1)
        net2.load_state_dict(s["model"])
        opt2 = make_opt(net2.parameters())
        lt.onebit_ddp_comm_hook(opt2)  # the gradients of averaged steps come averaged, as in the original
        for p in net2.parameters():
            p.grad = torch.zeros_like(p)  # registration needs a grad
        opt2.load_state_dict(s["opt"])
        for p, g in zip(net2.parameters(), s["grads"]):
            p.grad = g.clone()
        opt2.step()
        out[f"{s['kind']}@{t}"] = (equal(s["after"], net2.parameters()) and opt2.onebit_status() == s["status"]
                                   and opt2.communicator.save_errors() == s["errors"])
    return out


def nonfinite(seed, make_opt, steps, kind_of, kinds, synced):
    """A NaN in the last rank's gradients at the first step of each kind:
    every rank skips it (params, step count and schedules unchanged); the
    params are the same on every rank after each step of the `synced` kinds."""
    poisoned, checks = {}, []
    state = {"same": []}

    def poison(t, opt):
        kind = kind_of(t, opt)
        if kind in kinds and kind not in poisoned.values():
            poisoned[t] = kind
            return True
        return False

    def before(t, net, opt):
        state["kind"] = kind_of(t, opt)
        if t in poisoned:
            state["params"], state["status"] = params_of(net), opt.onebit_status()

    def after(t, net, opt):
        if state["kind"] in synced and not opt.last_step_skipped:
            state["same"].append(same_on_all_ranks(net))
        if t in poisoned:
            st = opt.onebit_status()
            checks.append({"kind": poisoned[t], "skipped": opt.last_step_skipped,
                           "unchanged": equal(state["params"], net.parameters()),
                           "status_unchanged": st == state["status"] if state["status"] is not None else
                           st.step == 0})

    net, opt, _, _ = train(seed, make_opt, steps, lowbit_hook=True, before_step=before, after_step=after,
                           poison=poison)
    return {"checks": all_ranks(checks), "same": all(state["same"]) and len(state["same"]) > steps // 2,
            "finite": all(torch.isfinite(p).all().item() for p in net.parameters()),
            "step": opt.onebit_status().step, "poisoned": sorted(poisoned.values())}


def bad_sizes(seed, make_opt):
    """Rank 0 has a wider model: the first step fails on every rank with a
    clear error, nothing changed."""
    rank = dist.get_rank()
    net = model(seed, hidden=64 if rank else 65)
    opt = make_opt(net.parameters())
    x, y = data(seed, rank)
    nn.functional.mse_loss(net(x), y).backward()
    before = params_of(net)
    try:
        opt.step()
        err = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        err = f"{type(e).__name__}: {e}"
    return {"errors": all_ranks(err), "unchanged": all_ranks(equal(before, net.parameters()))}


def case_robust(seed):
    out = {}

    def zo_kind(t, opt):
        return zeroone_kind(state_schedule(opt))

    def state_schedule(opt):
        """The reference schedule at this optimizer's step count."""
        s = ZeroOneSchedule(**ZO_SHORT)
        status = opt.onebit_status()
        for _ in range(status.step if status is not None else 0):
            s.advance()
        return s

    def make_zo(p, **kw):
        return make_zeroone(p, ZO_SHORT, **kw)

    def make_lb(p, **kw):
        return make_lamb(p, LAMB_SHORT_FREEZE, **kw)

    def lb_kind(t, opt):
        status = opt.onebit_status()
        return lamb_kind(status.step if status is not None else 0, LAMB_SHORT_FREEZE)

    out["zeroone_resume"] = resume(seed, make_zo, ZO_SHORT_STEPS, zo_kind)
    out["lamb_resume"] = resume(seed, make_lb, LAMB_SHORT_STEPS, lb_kind)
    out["zeroone_nonfinite"] = nonfinite(seed, make_zo, ZO_SHORT_STEPS, zo_kind, ZEROONE_SYNCED + ("local",),
                                         ZEROONE_SYNCED)
    lamb_kinds = ("warmup", "last_warmup", "first_compressed", "compressed")
    out["lamb_nonfinite"] = nonfinite(seed, make_lb, LAMB_SHORT_STEPS, lb_kind, lamb_kinds, lamb_kinds)
    out["zeroone_bad_sizes"] = bad_sizes(seed, make_zo)
    out["lamb_bad_sizes"] = bad_sizes(seed, make_lb)
    return out


def main():
    case, seed = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out = {"train": case_train, "robust": case_robust}[case](seed)
    out["world_size"] = dist.get_world_size()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out, default=str), flush=True)
    sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # skips gloo's teardown at interpreter exit (it can abort: pytorch/pytorch#179291)


if __name__ == "__main__":
    main()

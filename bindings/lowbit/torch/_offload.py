"""Offloaded optimizer state (:class:`CPUOffload`): the params stay on their
device (a GPU, or the CPU), the lowbit state lives in host memory next to a
host copy of each param, and each param is stepped on the host as soon as
its gradient has been copied there, on a worker thread, while backward goes
on; the updated param is copied back. ``memory_report`` says where the bytes
are."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import torch

from ._base import LowbitOptimizer
from ._tensors import _device_key, _is_dtensor, _tensor_ref

_HOST = "cpu"
_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def default_host_threads() -> int:
    """Threads of one rank's host steps: the CPUs divided among the ranks of
    this host (``LOCAL_WORLD_SIZE``, set by torchrun; 1 when unset), and no
    more than the CPUs this process may run on."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    except ValueError:
        local = 1
    n = max(1, (os.cpu_count() or 1) // max(1, local))
    if hasattr(os, "sched_getaffinity"):
        n = min(n, max(1, len(os.sched_getaffinity(0))))
    return n


def _nbytes(t: torch.Tensor) -> int:
    return 0 if t.device.type == "meta" else t.numel() * t.element_size()


class CPUOffload(torch.optim.Optimizer):
    """A lowbit.torch optimizer whose state lives in host memory.

    ``CPUOffload(AdamW, model.parameters(), lr=3e-4, state="8bit")`` builds
    an ``AdamW`` (any lowbit.torch optimizer class but the 1-bit ones; the
    remaining keywords are its own) over host copies of the params, each in
    the param's dtype (pinned when a param is on CUDA); the params stay where
    they are. In each backward:

    * each gradient is copied to a host buffer as soon as it is accumulated
      (on CUDA: a non-blocking copy on a side stream, after the work that
      produced it);
    * without ``clip_grad_norm``, the host step of a bucket of params (at
      least ``bucket_numel`` elements; what is left when backward ends) runs
      on a worker thread as soon as its copies have landed, overlapping the
      rest of backward, and the updated params are copied back (on CUDA: a
      second side stream, one event per param);
    * ``step()`` waits for the host steps and, on CUDA, makes the current
      stream wait for the copies back (or, after :meth:`wait_in_forward`,
      each module's forward waits for its own params only).

    With ``clip_grad_norm=max_norm`` the gradients are clipped by their
    global 2-norm as ``torch.nn.utils.clip_grad_norm_(params, max_norm)``
    would clip them, params in the groups' order: each gradient's norm is
    computed on its device as it arrives (the ops torch uses), and the host
    step waits for the total, at ``step()``. Then no step overlaps backward:
    ``step()`` costs the whole host step plus the copies back (the gradient
    copies still overlap backward). A NaN/Inf gradient then skips the whole
    step, as with the plain optimizer; without clipping it skips its bucket
    only.

    Each param gets the bits the plain optimizer's ``step()`` gives it (the
    same kernel on the same values), and ``state_dict()`` is the plain
    optimizer's: it loads into ``AdamW(...)`` over the same params and back.
    Param groups, ``add_param_group`` and lr schedulers work as usual
    (hyper-parameters are read at the first gradient of each backward; with
    clipping at ``step()``).

    One backward per ``step()``: for gradient accumulation run the backward
    passes but the last inside ``with opt.accumulating():`` (with DDP,
    ``ddp_model.no_sync()`` does the same). Params must not move after this
    is built: the first gradient of each backward checks every param and
    raises before anything is written, and ``step()`` checks again (with
    clipping before any step; without, the steps have run); a param changed in place outside the
    optimizer (``model.load_state_dict``) is copied to the host again at the
    next backward (torch's version counter says which). ``GradScaler`` is not
    supported (steps run inside backward, before it can unscale).

    ``num_threads``: the host step's threads; by default
    ``LOWBIT_NUM_THREADS`` when set, else the CPUs divided among the local
    ranks (:func:`default_host_threads`). With DDP pass ``ddp_model``: the
    gradients are taken after each DDP bucket's all-reduce (a comm hook).
    ``free_grads=True`` drops each device gradient once copied.
    DTensor (FSDP2) params are not supported."""

    def __init__(self, optimizer_class, params, *, clip_grad_norm=None, num_threads=None, bucket_numel: int = 1 << 22,
                 free_grads: bool = False, ddp_model=None, **optimizer_kwargs):
        from ._onebit import _OneBitBase

        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, LowbitOptimizer)):
            raise TypeError(f"CPUOffload needs a lowbit.torch optimizer class (AdamW, Adam, Lion, SGD), got "
                            f"{optimizer_class!r}")
        if issubclass(optimizer_class, _OneBitBase):
            raise TypeError("CPUOffload: the 1-bit optimizers exchange every param in one collective per step; "
                            "they cannot step params one by one on the host")
        if clip_grad_norm is not None:
            clip_grad_norm = float(clip_grad_norm)
            if not clip_grad_norm >= 0.0 or clip_grad_norm == float("inf"):
                raise ValueError(f"clip_grad_norm = {clip_grad_norm} must be a finite max norm >= 0 (or None)")
        if int(bucket_numel) < 0:
            raise ValueError(f"bucket_numel = {bucket_numel} must be >= 0")
        if ddp_model is not None and free_grads:
            raise ValueError("free_grads=True cannot be used with ddp_model: DDP keeps the gradients in its buckets")
        groups = self._as_groups(params)
        all_params = [p for g in groups for p in g["params"]]
        for p in all_params:
            self._check_param(p)
        self._pin = any(p.device.type == "cuda" for p in all_params) and torch.cuda.is_available()

        # The host copies, group by group; frozen params get a placeholder
        # (meta, no memory) so that the indices of a state dict stay the
        # plain optimizer's.
        host_of = {}
        host_groups = []
        for g in groups:
            hg = {k: v for k, v in g.items() if k != "params"}
            hg["params"] = []
            for p in g["params"]:
                if p not in host_of:
                    host_of[p] = self._host_copy(p)
                hg["params"].append(host_of[p])
            host_groups.append(hg)
        if num_threads is None and not os.environ.get("LOWBIT_NUM_THREADS", "").strip():
            num_threads = default_host_threads()
        inner = optimizer_class(host_groups, num_threads=num_threads, **optimizer_kwargs)

        self._inner = None  # add_param_group, called by torch's __init__, does only torch's part until set
        self._clip = clip_grad_norm
        self._bucket_numel = int(bucket_numel)
        self._free = bool(free_grads)
        self._ddp = ddp_model
        self._lock = threading.RLock()
        # per offloaded param i (trainable, non-empty), in the groups' order
        self._params: list = []  # the params (on their device)
        self._hosts: list = []  # their host copies
        self._host_grads: list = []  # host gradient buffers
        self._where: list = []  # (device, data_ptr, numel) when built
        self._versions: list = []  # the param's version counter after our last write
        self._index: dict = {}  # param -> i
        self._d2h_events: dict = {}  # i -> CUDA event of its gradient's copy to the host
        self._h2d_events: dict = {}  # i -> CUDA event of its copy back
        self._streams: dict = {}  # CUDA device -> (d2h stream, h2d stream)
        self._waited_in_forward: set = set()  # i whose copy back a module's forward pre-hook waits for
        self._handles: list = []  # hooks
        self._accumulating = 0
        self._armed = False  # a backward of this iteration has started delivering gradients
        self._got: list = []  # per i: its gradient of this iteration was taken
        self._norms: dict = {}  # i -> its gradient's 2-norm (clipping), a 0-dim tensor on its device
        self._bucket: list = []
        self._bucket_size = 0
        self._futures: list = []
        self._skipped = False
        self.last_grad_norm = None  # with clipping: the total norm of the last step (a tensor)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lowbit-offload")
        self._closed = False
        # The groups as the inner optimizer filled them: its add_param_group
        # may fill a group with defaults of its own (Muon's AdamW groups get
        # AdamW's, not Muon's), which _sync_groups copies back at each step.
        super().__init__([{**{k: v for k, v in ig.items() if k != "params"}, "params": g["params"]}
                          for g, ig in zip(groups, inner.param_groups)], inner.defaults)
        self._inner = inner
        self._host_of = host_of
        self._attach(range(len(self.param_groups)))
        if ddp_model is not None:
            ddp_model.register_comm_hook(None, self._ddp_hook)

    # -- construction

    @staticmethod
    def _as_groups(params) -> list:
        if isinstance(params, torch.Tensor):
            raise TypeError("params argument given to CPUOffload should be an iterable of Tensors or dicts, but got "
                            + torch.typename(params))
        params = list(params)
        if not params:
            raise ValueError("CPUOffload got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        groups = []
        for g in params:
            g = dict(g)
            ps = g["params"]
            g["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            groups.append(g)
        return groups

    @staticmethod
    def _check_param(p) -> None:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"CPUOffload can only optimize Tensors, got {torch.typename(p)}")
        if _is_dtensor(p):
            raise TypeError("CPUOffload: DTensor params (FSDP2, tensor parallelism) are not supported; offload "
                            "plain tensors (each rank's replica under DDP, or its own shard as a plain tensor)")
        if p.device.type not in ("cpu", "cuda"):
            raise ValueError(f"CPUOffload: a param is on {p.device}; params must be on the CPU or on CUDA")

    def _host_copy(self, p: torch.Tensor) -> torch.Tensor:
        if not p.requires_grad:
            return torch.empty(p.shape, dtype=p.dtype, device="meta")
        h = torch.empty(p.shape, dtype=p.dtype, device=_HOST, pin_memory=self._pin and p.numel() > 0)
        h.copy_(p.detach())
        return h

    def _attach(self, group_indices) -> None:
        """Registers the offloaded params of these groups (in the groups'
        order, so that each gets the id, and so the bits, the plain
        optimizer gives it) in the inner optimizer, and hooks them."""
        inner = self._inner
        for gi in group_indices:
            group, igroup = self.param_groups[gi], inner.param_groups[gi]
            for p, h in zip(group["params"], igroup["params"]):
                if p in self._index or not p.requires_grad or p.numel() == 0:
                    continue
                i = len(self._params)
                self._index[p] = i
                self._params.append(p)
                self._hosts.append(h)
                self._host_grads.append(torch.empty(p.shape, dtype=p.dtype, device=_HOST,
                                                    pin_memory=self._pin))
                self._where.append((p.device, p.data_ptr(), p.numel()))
                self._versions.append(p._version)
                self._got.append(False)
                if h not in inner._where:
                    inner._register(h, gi, igroup)
                self.state[p] = inner.state[h]
                if self._ddp is None:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_inner", None) is None:  # torch's __init__
            super().add_param_group(param_group)
            return
        with self._lock:
            self._check_open("add_param_group()")
            if self._armed:
                raise RuntimeError("CPUOffload.add_param_group: a backward's gradients are waiting for step(); "
                                   "add groups between steps")
            group = dict(param_group)
            ps = group["params"]
            group["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            for p in group["params"]:
                self._check_param(p)
            hosts = [self._host_of[p] if p in self._host_of else self._host_copy(p) for p in group["params"]]
            # the inner optimizer first: it fills the group's defaults (as at construction)
            self._inner.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": hosts})
            try:
                ig = self._inner.param_groups[-1]
                super().add_param_group({**{k: v for k, v in ig.items() if k != "params"}, "params": group["params"]})
            except BaseException:
                self._inner.param_groups.pop()
                raise
            group = self.param_groups[-1]
            for p, h in zip(group["params"], hosts):
                self._host_of[p] = h
            self._attach([len(self.param_groups) - 1])

    def __getstate__(self):
        raise TypeError("CPUOffload cannot be pickled; use state_dict() / load_state_dict()")

    # -- the pipeline

    def _hook(self, p: torch.Tensor) -> None:
        if p.grad is None or self._accumulating:
            return
        self._on_grad(p, p.grad, end_of_backward=True)

    def _ddp_hook(self, state, bucket):
        from ._dist import average_bucket_then

        def then(params, grads):
            if not self._accumulating:
                with self._lock:
                    for p, g in zip(params, grads):
                        if p in self._index:
                            self._on_grad(p, g, end_of_backward=False)
                    self._submit_bucket()

        return average_bucket_then(bucket, then)

    def _on_grad(self, p: torch.Tensor, grad: torch.Tensor, end_of_backward: bool) -> None:
        with self._lock:
            self._check_open("a gradient arrived (a DDP comm hook cannot be removed)")
            i = self._index.get(p)
            if i is None:
                return
            if not self._armed:
                self._arm(end_of_backward)
            if self._got[i]:
                raise RuntimeError(
                    f"CPUOffload: {self._name(i)} got a second gradient before step(): each backward steps the "
                    "params; call step() after every backward, and run the backward passes of gradient "
                    "accumulation but the last inside `with opt.accumulating():`")
            if grad.layout is torch.sparse_coo:
                raise RuntimeError(
                    f"CPUOffload: the gradient of {self._name(i)} is sparse (torch.sparse_coo, e.g. from "
                    "nn.Embedding(sparse=True)); CPUOffload copies each gradient as it arrives into the param's "
                    "dense host buffer and steps it on a worker thread, and takes dense gradients only: build "
                    "this module with sparse=False (the plain lowbit.torch optimizers and step_in_backward take "
                    "sparse gradients)")
            if grad.layout != torch.strided or grad.numel() != p.numel() or grad.device != p.device:
                raise RuntimeError(f"CPUOffload: the gradient of {self._name(i)} is not a dense tensor of the "
                                   f"param's size on its device ({grad.layout}, {grad.numel()} elements, "
                                   f"{grad.device})")
            if grad.dtype not in _GRAD_DTYPES:
                raise RuntimeError(f"CPUOffload: the gradient of {self._name(i)} is {grad.dtype}; gradients must be "
                                   "float32, bfloat16 or float16")
            self._got[i] = True
            self._to_host(i, grad)
            if self._clip is not None:
                self._norms[i] = self._grad_norm(grad)
            else:
                self._bucket.append(i)
                self._bucket_size += p.numel()
                if self._bucket_size >= self._bucket_numel:
                    self._submit_bucket()
            if self._free and p.grad is grad:
                p.grad = None

    def _arm(self, end_of_backward: bool) -> None:
        """The first gradient of an iteration: nothing is written before
        every param is checked."""
        self._check_unmoved()
        self._refresh_changed_params()
        self._got = [False] * len(self._params)
        self._norms = {}
        self._skipped = False
        self._push_hparams()
        if end_of_backward:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._armed = True

    def _end_of_backward(self) -> None:
        with self._lock:
            self._submit_bucket()

    def _grad_norm(self, g: torch.Tensor) -> torch.Tensor:
        """The 2-norm of a gradient, by the op clip_grad_norm_ uses for it."""
        from torch.utils._foreach_utils import _has_foreach_support

        if _has_foreach_support([g], g.device):
            return torch._foreach_norm([g], 2.0)[0]
        return torch.linalg.vector_norm(g, 2.0)

    def _streams_of(self, device: torch.device):
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return s

    def _to_host(self, i: int, grad: torch.Tensor) -> None:
        hg = self._host_grads[i]
        if hg.dtype != grad.dtype:
            hg = self._host_grads[i] = torch.empty(hg.shape, dtype=grad.dtype, device=_HOST, pin_memory=self._pin)
        with torch.no_grad():
            if grad.device.type != "cuda":
                hg.copy_(grad.view(hg.shape) if grad.is_contiguous() else grad.reshape(hg.shape))
                return
            d2h, _ = self._streams_of(grad.device)
            d2h.wait_stream(torch.cuda.current_stream(grad.device))
            ev = self._d2h_events.get(i)
            if ev is None:
                ev = self._d2h_events[i] = torch.cuda.Event()
            with torch.cuda.stream(d2h):
                hg.copy_(grad.reshape(hg.shape), non_blocking=True)
                ev.record(d2h)
            if self._free:
                grad.record_stream(d2h)

    def _submit_bucket(self) -> None:
        if not self._bucket:
            return
        ids, self._bucket, self._bucket_size = self._bucket, [], 0
        self._futures.append(self._pool.submit(self._host_step, ids, None))

    def _host_step(self, ids: list, coef) -> None:
        """On the worker: wait for the gradients' copies, step the host
        copies (one lowbit call), copy them back."""
        inner = self._inner
        with torch.no_grad():
            for i in ids:
                ev = self._d2h_events.get(i)
                if ev is not None and self._params[i].device.type == "cuda":
                    ev.synchronize()
            if coef is not None:
                for i in ids:
                    self._host_grads[i].mul_(coef)
            with inner._step_lock:
                key, _ = inner._where[self._hosts[ids[0]]]
                handle = inner._devices[key].handle
                pids = [inner._where[self._hosts[i]][1] for i in ids]
                applied = handle.step_params(pids, [_tensor_ref(self._host_grads[i], "grad") for i in ids])
                inner._opt_called = True
            if not applied:
                self._skipped = True
                return
            for i in ids:
                p, h = self._params[i], self._hosts[i]
                if p.device.type != "cuda":
                    p.detach().copy_(h)
                    continue
                _, h2d = self._streams_of(p.device)
                ev = self._h2d_events.get(i)
                if ev is None:
                    ev = self._h2d_events[i] = torch.cuda.Event()
                with torch.cuda.device(p.device), torch.cuda.stream(h2d):
                    # after the gradient's copy, so after every kernel queued
                    # before the gradient was complete (those that read p)
                    h2d.wait_event(self._d2h_events[i])
                    p.detach().copy_(h, non_blocking=True)
                    ev.record(h2d)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Waits for this iteration's host steps (with clipping: clips and
        runs them) and for the copies back; see the class."""
        if "grad_scaler" in kwargs or getattr(self, "found_inf", None) is not None:
            raise RuntimeError("CPUOffload does not support GradScaler: the host steps run inside backward, before "
                               "the gradients could be unscaled (use bf16 autocast, which needs no scaler)")
        if kwargs:
            raise TypeError(f"step() got unexpected keyword arguments {sorted(kwargs)}")
        self._check_open("step()")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._lock:
            if self._clip is not None:
                self._check_unmoved()
                self._clip_and_submit()
            else:
                self._submit_bucket()
            futures, self._futures = self._futures, []
            self._armed = False
        error = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:  # every host step ends before the first error is raised
                error = error or e
        if error is not None:
            raise error
        if futures and self._clip is None:
            self._check_unmoved(after_steps=True)
        self._after_copies_back()
        return loss

    def _clip_and_submit(self) -> None:
        ids = [i for i, got in enumerate(self._got) if got]
        if not ids:
            return
        from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

        self._push_hparams()  # the plain optimizer reads them at step()
        norms = [self._norms[i] for i in ids]
        # The order in which torch stacks the norms: grouped by device and
        # dtype as torch groups the gradients (the norms have their dtype).
        grouped = _group_tensors_by_device_and_dtype([norms], with_indices=True)
        order = [k for _, (_, idx) in grouped.items() for k in idx]
        first = norms[0].device
        total = torch.linalg.vector_norm(torch.stack([norms[k].to(first) for k in order]), 2.0)
        coef = torch.clamp(self._clip / (total + 1e-6), max=1.0)
        self.last_grad_norm = total
        self._norms = {}
        self._futures.append(self._pool.submit(self._host_step, ids, coef.to(_HOST)))

    def _after_copies_back(self) -> None:
        for i, p in enumerate(self._params):
            self._versions[i] = p._version
            if p.device.type == "cuda" and i not in self._waited_in_forward:
                ev = self._h2d_events.get(i)
                if ev is not None:
                    torch.cuda.current_stream(p.device).wait_event(ev)

    def wait_in_forward(self, module: torch.nn.Module) -> None:
        """CUDA: instead of ``step()`` making the current stream wait for
        every param's copy back, each submodule's forward (pre-hook) waits
        for its own params only. Only for params used inside the forward of
        a module that holds them."""
        for m in module.modules():
            ids = [self._index[p] for p in m.parameters(recurse=False) if p in self._index]
            if ids:
                self._handles.append(m.register_forward_pre_hook(functools.partial(self._wait_params, ids)))
                self._waited_in_forward.update(ids)

    def _wait_params(self, ids, module, args) -> None:
        for i in ids:
            ev = self._h2d_events.get(i)
            if ev is not None:
                torch.cuda.current_stream(self._params[i].device).wait_event(ev)

    @contextlib.contextmanager
    def accumulating(self):
        """Backward passes inside only accumulate the gradients on their
        device (gradient accumulation): the next backward outside takes and
        steps them."""
        with self._lock:
            self._accumulating += 1
        try:
            yield self
        finally:
            with self._lock:
                self._accumulating -= 1

    # -- checks and hyper-parameters

    def _name(self, i: int) -> str:
        p = self._params[i]
        for gi, g in enumerate(self.param_groups):
            for k, q in enumerate(g["params"]):
                if q is p:
                    return f"param {k} of group {gi} (shape {tuple(p.shape)})"
        return f"param (shape {tuple(p.shape)})"

    def _check_unmoved(self, after_steps: bool = False) -> None:
        for i, p in enumerate(self._params):
            device, ptr, numel = self._where[i]
            if p.device != device or p.data_ptr() != ptr or p.numel() != numel:
                raise RuntimeError(
                    f"CPUOffload: {self._name(i)} moved to another device after CPUOffload was built (it was on "
                    f"{device} at 0x{ptr:x}, it is on {p.device} at 0x{p.data_ptr():x} with {p.numel()} elements of "
                    f"{numel}: was the model moved or its .data replaced or resized?); build it "
                    "again after moving the model. "
                    + ("This backward's host steps had already run (the copies back went to its old memory)"
                       if after_steps else "Nothing was changed"))
        if not after_steps:
            # the host copies the library steps (inner.param_groups; host_param)
            self._inner._check_unmoved()

    def _refresh_changed_params(self) -> None:
        """Params written outside the optimizer since our last copy back
        (their version counter moved): copy them to the host again."""
        for i, p in enumerate(self._params):
            if p._version != self._versions[i]:
                with torch.no_grad():
                    self._hosts[i].copy_(p.detach())
                self._versions[i] = p._version

    def _sync_groups(self) -> None:
        """The outer groups' hyper-parameters (lr schedulers write there) into
        the inner optimizer's."""
        for g, ig in zip(self.param_groups, self._inner.param_groups):
            for k, v in g.items():
                if k != "params":
                    ig[k] = v

    def _push_hparams(self) -> None:
        self._sync_groups()
        inner = self._inner
        for dev in inner._devices.values():
            inner._push_hparams(dev)

    def _wait_idle(self) -> None:
        with self._lock:
            if self._armed:
                raise RuntimeError("CPUOffload: a backward's gradients are waiting for step(); call step() first")

    # -- state dicts and what the library keeps

    def state_dict(self) -> dict:
        """The plain optimizer's state dict (lowbit.torch's format): it loads
        into ``optimizer_class(params, ...)`` over the same params."""
        self._wait_idle()
        self._sync_groups()
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a state dict of this or of the plain optimizer (any format
        the plain one loads)."""
        self._wait_idle()
        inner = self._inner
        self._sync_groups()
        inner.load_state_dict(state_dict)
        for g, ig in zip(self.param_groups, inner.param_groups):
            for k, v in ig.items():
                if k != "params":
                    g[k] = v
        # params without saved state: registered after the loaded ones, in
        # the groups' order (as the plain optimizer does at their first step)
        for gi, ig in enumerate(inner.param_groups):
            for h in ig["params"]:
                if h.device.type != "meta" and h.numel() > 0 and h not in inner._where:
                    inner._register(h, gi, ig)
        self.state = defaultdict(dict)
        for p, h in zip(self._params, self._hosts):
            self.state[p] = inner.state[h]

    @property
    def inner(self) -> LowbitOptimizer:
        """The lowbit.torch optimizer over the host copies."""
        return self._inner

    @property
    def last_step_skipped(self) -> bool:
        """True if a host step of the last iteration found a NaN/Inf gradient
        and left its params alone."""
        return self._skipped

    @property
    def _step_supports_amp_scaling(self) -> bool:
        return True  # GradScaler then calls step() directly, which refuses it

    def param_info(self, p: torch.Tensor):
        return self._inner.param_info(self._host_of[p])

    def read_moment(self, p: torch.Tensor, moment: int = 0) -> torch.Tensor:
        return self._inner.read_moment(self._host_of[p], moment)

    def state_bytes(self) -> int:
        return self._inner.state_bytes()

    def host_param(self, p: torch.Tensor) -> torch.Tensor:
        """The host copy of a param."""
        return self._host_of[p]

    def memory_report(self) -> dict:
        """Bytes by the device they occupy: ``{device: {"state_bytes",
        "host_param_bytes", "host_grad_bytes", "pinned_bytes"}}``. The state,
        the host copies of the params and the host gradient buffers are all
        in host memory (``"cpu"``); ``pinned_bytes`` is the part of the
        copies and buffers that is pinned (params on CUDA). The params'
        devices are listed too, with nothing kept there."""
        report = {}
        for p in self._params:
            report.setdefault(_device_key(p.device), _empty_entry())
        host = report.setdefault(_HOST, _empty_entry())
        host["state_bytes"] = self._inner.state_bytes()
        hosts = [h for h in self._host_of.values() if h.device.type != "meta"]
        host["host_param_bytes"] = sum(map(_nbytes, hosts))
        host["host_grad_bytes"] = sum(map(_nbytes, self._host_grads))
        host["pinned_bytes"] = sum(_nbytes(t) for t in hosts + self._host_grads if self._pin and t.is_pinned())
        return report

    def close(self) -> None:
        """Removes the hooks and stops the worker thread (after the pending
        host steps). Then backward only accumulates the params' gradients on
        their devices, as without an optimizer, and ``step()`` (or a DDP
        comm hook's gradient, or ``add_param_group``) raises RuntimeError
        instead of doing nothing. Calling it again does nothing."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._closed = True
        self._pool.shutdown(wait=True)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"CPUOffload: {what} after close(): its hooks are removed and its worker stopped, so "
                               "nothing would be stepped; build a new CPUOffload (its state_dict() still reads)")

    def __repr__(self):
        clip = "" if self._clip is None else f", clip_grad_norm={self._clip}"
        return f"CPUOffload({type(self._inner).__name__}, {len(self._params)} params{clip})"


def _empty_entry() -> dict:
    return {"state_bytes": 0, "host_param_bytes": 0, "host_grad_bytes": 0, "pinned_bytes": 0}


def memory_report(optimizer) -> dict:
    """Bytes of an optimizer's state (and, for :class:`CPUOffload`, host
    copies and pinned buffers) by the device they occupy:
    ``{device: {"state_bytes", "host_param_bytes", "host_grad_bytes",
    "pinned_bytes"}}``. A plain lowbit.torch optimizer keeps its state on
    its params' devices and nothing else."""
    if isinstance(optimizer, CPUOffload):
        return optimizer.memory_report()
    if not isinstance(optimizer, LowbitOptimizer):
        raise TypeError(f"memory_report needs a lowbit.torch optimizer or CPUOffload, got {type(optimizer).__name__}")
    report = {}
    for key, handle in optimizer.lowbit_handles().items():
        report.setdefault(key, _empty_entry())["state_bytes"] += handle.state_bytes()
    return report

"""The optimizer step inside backward (:func:`step_in_backward`): each param
is stepped as soon as its gradient is complete and the gradient is freed at
once, so a model never holds all its gradients (PyTorch's recipe with
``register_post_accumulate_grad_hook``; LOMO and AdaLomo build on it).

Sparse gradients (``nn.Embedding(sparse=True)``: ``torch.sparse_coo``) wait
in their bucket as they are and are densified when the bucket is stepped,
the dense form freed right after that step: the usual step on the dense
gradient (zeros in the absent rows), bits equal to the dense embedding's,
not torch.optim.SparseAdam."""

from __future__ import annotations

import threading

import torch

from .._ffi import Device
from .._errors import InvalidStateError
from ._tensors import _dense_grad, _local, _tensor_ref

_WHY = ("the step runs inside backward, as each gradient is ready, and frees the gradient: nothing can see all "
        "the gradients before a step, so gradient clipping by global norm and GradScaler (which unscales and "
        "checks every gradient first) cannot work")


class _Bucket:
    """Params of one device waiting to be stepped together."""

    __slots__ = ("ids", "params", "grads", "numel")

    def __init__(self):
        self.ids, self.params, self.grads, self.numel = [], [], [], 0


class StepInBackward:
    """What :func:`step_in_backward` returns: the hooks of one optimizer.
    ``remove()`` takes them off (``opt.step()`` works again)."""

    def __init__(self, optimizer, *, bucket_numel: int = 1 << 20, ddp_model=None, free_grads: bool = True):
        from ._base import LowbitOptimizer

        if not isinstance(optimizer, LowbitOptimizer):
            raise TypeError(f"step_in_backward needs a lowbit.torch optimizer, got {type(optimizer).__name__}")
        from ._onebit import _OneBitBase

        if isinstance(optimizer, _OneBitBase):
            raise TypeError("step_in_backward: the 1-bit optimizers exchange every param in one collective per "
                            "step; they cannot step params one by one")
        if getattr(optimizer, "_in_backward", None) is not None:
            raise RuntimeError("step_in_backward: this optimizer already steps inside backward")
        if bucket_numel < 0:
            raise ValueError(f"bucket_numel = {bucket_numel} must be >= 0")
        self._opt = optimizer
        self._bucket_numel = int(bucket_numel)
        self._free = bool(free_grads)
        self._lock = threading.Lock()
        self._buckets: dict = {}
        self._armed = False
        self._skipped = False
        self._group_of = {}
        for gi, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                self._group_of[p] = gi
        self._handles = []
        self._ddp = ddp_model
        if ddp_model is not None:
            # DDP reduces gradients in buckets after the params' hooks ran:
            # the step goes after each bucket's all-reduce instead.
            ddp_model.register_comm_hook(None, self._ddp_hook)
        else:
            for p in self._group_of:
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._hook))
        optimizer._in_backward = self

    # -- hooks

    def _hook(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        self._add(p, p.grad)

    def _ddp_hook(self, state, bucket):
        from ._dist import average_bucket_then

        def step(params, grads):
            for p, g in zip(params, grads):
                self._add(p, g, flush_now=False)
            self._flush_all(end=False)

        return average_bucket_then(bucket, step)

    def _add(self, p: torch.Tensor, grad: torch.Tensor, flush_now: bool = True) -> None:
        opt = self._opt
        with self._lock, opt._step_lock:
            if self._ddp is not None:
                # DDP's buckets arrive after their all-reduce, each stepped at
                # once (possibly on a communication thread): nothing is left
                # for the end of backward
                opt._check_unmoved()
                self._register_all()
                for dev in opt._devices.values():
                    opt._push_hparams(dev)
            elif not self._armed:
                # the first gradient of this backward: a param whose storage
                # was replaced or resized since it was registered stops the
                # backward here, before any param is stepped
                opt._check_unmoved()
                self._armed = True
                self._skipped = False
                # the end of this backward: step what is left
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
                self._register_all()
                for dev in opt._devices.values():
                    opt._push_hparams(dev)
            if p not in opt._where:
                if p.numel() == 0 or _local(p).numel() == 0:
                    return
                raise RuntimeError("step_in_backward: a param that is not in the optimizer's groups got a hook "
                                   "(add params with add_param_group before step_in_backward)")
            key, pid = opt._where[p]
            b = self._buckets.setdefault(key, _Bucket())
            b.ids.append(pid)
            b.params.append(p)
            b.grads.append(_local(grad))
            b.numel += p.numel()
            if flush_now and b.numel >= self._bucket_numel:
                self._flush(key)

    def _register_all(self) -> None:
        """Registers the params not registered yet in the groups' order, as
        opt.step() does, so that each gets the id (and so the
        stochastic-rounding bits) it would get there; a param gets state
        when its group's first gradient arrives, not its own."""
        opt = self._opt
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if p.requires_grad and p not in opt._where and p.numel() > 0 and _local(p).numel() > 0:
                    opt._register(p, gi, group)

    def _end_of_backward(self) -> None:
        self._flush_all(end=True)

    def _flush_all(self, end: bool) -> None:
        with self._lock, self._opt._step_lock:
            for key in list(self._buckets):
                self._flush(key)
            if end:
                self._armed = False

    def _flush(self, key: str) -> None:
        b = self._buckets.pop(key, None)
        if b is None or not b.ids:
            return
        dev = self._opt._devices[key]
        try:
            # the memory handed to the library is the params' now (a storage
            # replaced inside this backward, by a hook, stops it here too)
            dev.check_unmoved(b.ids)
        except RuntimeError:
            self._buckets.clear()
            self._armed = False
            raise
        # a sparse grad (nn.Embedding(sparse=True)) is densified here, at its
        # bucket's step, and its dense form dropped with refs right after it
        refs = [_tensor_ref(_dense_grad(g, _local(p)), "grad") for p, g in zip(b.params, b.grads)]
        stream = torch.cuda.current_stream(dev.device) if dev.device.type == "cuda" else None
        applied = dev.handle.step_params(b.ids, refs, stream=stream.cuda_stream if stream is not None else None)
        del refs
        if dev.handle.device == Device.CPU and not applied:
            self._skipped = True
        self._opt._opt_called = True  # what torch's lr schedulers look for (opt.step() is never called)
        if self._free and self._ddp is None:
            for p in b.params:
                p.grad = None

    # -- control

    @property
    def last_step_skipped(self) -> bool:
        """True if a call of the last backward found NaN/Inf in its gradients
        and left its params alone (CPU; on CUDA read the optimizer's
        ``last_step_skipped`` after synchronising)."""
        return self._skipped

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._ddp is not None:
            raise InvalidStateError("a DDP comm hook cannot be removed; build a new DDP model instead")
        self._opt._in_backward = None


def step_in_backward(optimizer, *, bucket_numel: int = 1 << 20, ddp_model=None, free_grads: bool = True):
    """Step ``optimizer`` (a lowbit.torch AdamW, Adam, Lion or SGD) inside
    backward: each param as soon as its gradient is accumulated, then its
    gradient is freed (``free_grads``). Params are stepped in buckets of at
    least ``bucket_numel`` elements (0: each param at once); what is left
    when backward ends is stepped then. Each param gets the bits
    ``optimizer.step()`` would give it. lr schedulers and param groups work
    as usual (hyper-parameters are read at the first gradient of each
    backward). With DDP pass ``ddp_model``: each DDP bucket is stepped after
    its all-reduce (a comm hook; gradients stay in DDP's buckets). FSDP2
    params (DTensors) are stepped when their reduced shard is accumulated.
    ``optimizer.step()`` then raises, as gradient clipping by global norm and
    GradScaler cannot work in this mode: no step can wait for all the
    gradients. A NaN/Inf gradient skips its bucket only. A sparse gradient
    (``nn.Embedding(sparse=True)``) is densified for its bucket's step and
    the dense form freed after it (the optimizer's step on the dense
    gradient, not SparseAdam): an untied embedding then holds only the
    batch's rows until its step."""
    return StepInBackward(optimizer, bucket_numel=bucket_numel, ddp_model=ddp_model, free_grads=free_grads)


def refuse_step() -> None:
    raise RuntimeError(f"this optimizer steps inside backward (lowbit.torch.step_in_backward): {_WHY}. "
                       "Call remove() on what step_in_backward returned to step after backward again")

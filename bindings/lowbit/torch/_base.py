"""The base of the lowbit.torch optimizers: registration of the params at
their first step (one lowbit.Optimizer per device), hyper-parameters read
from the param groups at each step, the step itself; the state dicts are
StateDicts' (_state_dict.py)."""

from __future__ import annotations

import ctypes
import operator
import threading

import torch

from .._ffi import Algorithm
from .._names import STATE_FORMAT_NAMES, parse_state_format, parse_state_option, resolve_num_threads
from .._optimizer import Optimizer
from ._compile import eager_in_compile, is_compiling, register_optimizer
from ._in_backward import refuse_step
from ._state_dict import LowbitState, StateDicts, _StateView
from ._tensors import _device_key, _DeviceState, _is_dtensor, _local, _nonfinite_values, _tensor_ref

_REFUSED = {"amsgrad": "amsgrad=True is not supported by lowbit",
            "maximize": "maximize=True is not supported by lowbit (negate the loss)"}


def refuse(**switches) -> None:
    """ValueError for a torch switch set that lowbit has no counterpart for."""
    for name, value in switches.items():
        if value:
            raise ValueError(_REFUSED[name])


class LowbitOptimizer(StateDicts, torch.optim.Optimizer):
    """Base class; use AdamW, Adam, Lion or SGD (state dicts: StateDicts).

    Threads: steps of one optimizer are serialised (one thread's step
    waits for another's to end).

    torch.compile: inside a compiled region step() (without a closure) is
    the custom op ``lowbit::step`` (_compile.py), which the compiler does not
    trace into: no graph break, and the lr reaches the op as a tensor when
    the group's lr is one. A subclass that overrides step() takes the eager
    path there (a graph break) unless it sets ``_compilable_step = True``."""

    _algorithm: Algorithm = None
    _moment_names: tuple = ()
    _refused: tuple = ()  # torch's switches this class has no counterpart for (refuse), checked per group too
    _compilable_step = True  # under torch.compile, step() is the lowbit::step op (see __init_subclass__)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A class with its own step() (the 1-bit optimizers: errors agreed
        # over the ranks around the step) keeps it whole, compiled or not.
        if "_compilable_step" not in cls.__dict__:
            cls._compilable_step = cls._compilable_step and "step" not in cls.__dict__

    def __init__(self, params, defaults: dict, *, state="fp32", second_state=None, stochastic_rounding=False,
                 error_correction=False, min_quantized_numel=None, seed=0, skip_nonfinite=True, num_threads=None,
                 first_normalization=None, second_normalization=None,
                 foreach=None, fused=None, capturable=False, differentiable=False):
        # torch's implementation switches: lowbit always runs its own fused
        # kernel, so foreach/fused are accepted and have no effect.
        del foreach, fused
        if capturable:
            raise ValueError("capturable=True is not supported by lowbit (the step reads hyper-parameters on the host)")
        if differentiable:
            raise ValueError("differentiable=True is not supported by lowbit")
        if num_threads is not None:
            resolve_num_threads(num_threads)  # validate now; None is resolved when the CPU handle is created
        # state: a format, or "4bit-rank1" / "4bit-factor" (lpmm's 4-bit AdamW
        # and 4-bit Factor: rank-1 or factored second moments of params with
        # 2+ dims, whose shapes the library takes from the tensors), or
        # "4bit-sr" (AdamW / Adam: m with stochastic 4-bit codes, v 4bit)
        self._state_format, self._second_state, n1, n2 = parse_state_option(
            state, second_state, first_normalization, second_normalization, algorithm=self._algorithm)
        self._config = dict(
            state=self._state_format,
            second_state=self._second_state,
            first_normalization=n1,
            second_normalization=n2,
            min_quantized_numel=min_quantized_numel,
            seed=seed,
            stochastic_rounding=bool(stochastic_rounding),
            error_correction=bool(error_correction),
            skip_nonfinite=bool(skip_nonfinite),
            num_threads=num_threads,
        )
        self._devices: dict = {}
        self._where: dict = {}  # param -> (device key, param id)
        self._registered_params = None  # the groups' param lists (copies) when all were registered
        self._empty_shards: dict = {}  # DTensor param with an empty shard here -> its step count
        self._meshes: list = []  # device meshes of the DTensor params
        self._skipped = False  # the last step was skipped by agreement over the meshes
        self._step_lock = threading.RLock()  # threads stepping one optimizer step one after the other
        self._in_backward = None  # the hooks of step_in_backward, when it steps this optimizer
        self._compile_key = register_optimizer(self)  # how the lowbit::step op finds this optimizer
        defaults = dict(defaults)
        defaults.update(state=STATE_FORMAT_NAMES[self._state_format], stochastic_rounding=bool(stochastic_rounding),
                        error_correction=bool(error_correction))
        super().__init__(params, defaults)
        self.state = LowbitState(self.state)

    # -- torch.optim.Optimizer interface

    def add_param_group(self, param_group: dict) -> None:
        if "state" in param_group:
            parse_state_format(param_group["state"], "state")  # validate early
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._check_group(group)
        for dev in getattr(self, "_devices", {}).values():
            dev.handle.add_group(**self._hparams(group))
            dev.pushed.append(None)

    def __setstate__(self, state):
        super().__setstate__(state)
        self.state = LowbitState(self.state)
        self._devices, self._where, self._registered_params = {}, {}, None
        self._empty_shards, self._meshes, self._skipped = {}, [], False
        self._step_lock = threading.RLock()
        self._in_backward = None
        self._compile_key = register_optimizer(self)

    def _patch_step_function(self) -> None:
        super()._patch_step_function()
        # torch's lr schedulers replace opt.step by a wrapper that notes the
        # call (opt._opt_called), unless the step is marked as wrapped; the
        # wrapper lives in a file torch.compile never traces (a graph break
        # in a compiled opt.step()), so step() notes the call itself.
        type(self).step._wrapped_by_lr_sched = True

    def __getstate__(self):
        raise TypeError("lowbit.torch optimizers cannot be pickled; use state_dict() / load_state_dict()")

    @torch.no_grad()
    def step(self, closure=None):
        if closure is None and self._compilable_step and is_compiling():
            self._traced_step()
            return None
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if getattr(self, "_in_backward", None) is not None:
            refuse_step()
        self._run_step()
        return loss

    def _run_step(self, grads=None, lrs=None, push_hparams=True) -> None:
        """The step, eager: grads None (each param's .grad) or {param: grad};
        lrs None (the groups' "lr") or one float per group; push_hparams
        False: the library keeps the hyper-parameters it has (_step_captured)."""
        with self._step_lock:
            # for torch's lr schedulers (_patch_step_function); here, where
            # torch.compile never traces: it drops attribute writes to
            # optimizers in the code it traces
            self._opt_called = True
            self._skipped = False
            try:
                try:
                    ready = self._prepare_step(grads, lrs, push_hparams)
                except Exception as e:
                    self._failed_before_step(e)
                    raise
                if ready is None:
                    # Sharded params: a rank sees only its shards of the grads, so the
                    # skip is agreed over the device meshes; the step is skipped on all.
                    self._skipped = True
                    return
                for dev, n in ready:
                    self._step_device(dev, n)
                    # sparse grads' dense forms: dropped as soon as the call
                    # that reads them returns (on CUDA the caching allocator
                    # reuses the memory after the step's kernels, same stream)
                    dev.dense_grads = None
            finally:
                for dev in self._devices.values():
                    dev.dense_grads = None
            for p in self._empty_shards:
                if (p.grad if grads is None else grads.get(p)) is not None:
                    self._empty_shards[p] += 1

    # -- torch.compile (the lowbit::step op, _compile.py)

    def _traced_step(self) -> None:
        """What torch.compile traces for step(): the groups' params, their
        grads and lrs handed to the lowbit::step op (lr tensors as they are,
        a float lr as a float64 tensor; the op reads them when it runs)."""
        params = [p for group in self.param_groups for p in group["params"]]
        if any(map(_is_dtensor, params)):
            # no sharding rule for the op: DTensor params take the eager path
            return self._eager_step_in_compile()
        grads = [p.grad for p in params]
        lrs = [_lr_tensor(group["lr"]) for group in self.param_groups]
        torch.ops.lowbit.step(self._compile_key, params, grads, lrs)
        return None

    @eager_in_compile
    def _eager_step_in_compile(self) -> None:
        if getattr(self, "_in_backward", None) is not None:
            refuse_step()
        self._run_step()

    def _step_from_op(self, params: list, grads: list, lrs: list) -> None:
        """The lowbit::step op's implementation (run eagerly, when the
        compiled code runs): the eager step over the groups' params with
        these grads and lrs."""
        if getattr(self, "_in_backward", None) is not None:
            refuse_step()
        mine = [p for group in self.param_groups for p in group["params"]]
        if len(mine) != len(params) or len(lrs) != len(self.param_groups):
            raise RuntimeError("lowbit::step: the optimizer's param groups changed since this step was traced")
        if len(grads) != len(params):
            raise RuntimeError(f"lowbit::step: {len(grads)} grads for {len(params)} params")
        # Every argument is checked before anything is written.
        capturing = _capturing(mine)
        copies = _op_copies(mine, params, compare=not capturing)
        for i, (p, g) in enumerate(zip(mine, grads)):
            _check_op_grad(i, p, g)
        values = [_op_lr(gi, t, read=not capturing) for gi, t in enumerate(lrs)]
        if capturing:
            # a capture cannot compare the copies' values on the host: they go in
            for p, q in copies:
                p.copy_(q)
            self._step_captured(dict(zip(mine, grads)), lrs)
        else:
            self._run_step(dict(zip(mine, grads)), values)
        # a copy (aot_eager) holds the param's values: it gets the result
        for p, q in copies:
            q.copy_(p)

    def _step_captured(self, grads: dict, lrs: list) -> None:
        """The op while a CUDA graph is being captured: each group's lr goes
        from its tensor into the engine's copy of the group's hyper-parameters
        by a copy on the stream (captured: every replay copies the tensor's
        value of that moment), and the host-side hyper-parameters are not
        pushed (that would read the lr on the host: a sync, and a value frozen
        into the graph). The step counts live on the device already. Params
        must have stepped once before (registration allocates)."""
        for dev in self._devices.values():
            views = dev.lr_views
            if views is None or len(views) != len(lrs):
                views = dev.lr_views = [_engine_lr(dev, gi) for gi in range(len(lrs))]
            for gi, (view, t) in enumerate(zip(views, lrs)):
                if t.device != view.device:
                    raise RuntimeError(
                        f"lowbit::step in a captured CUDA graph: param group {gi}'s lr is a tensor on {t.device}, "
                        f"the group's params on {view.device}: a replay can only read an lr on their device "
                        f"(e.g. lr=torch.tensor(3e-4, device='{view.device}'))")
                view.copy_(t.reshape(1))
            dev.pushed = [None] * len(dev.pushed)  # an eager step after replays pushes its hparams again
        self._run_step(grads, lrs=None, push_hparams=False)

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """GradScaler calls step() directly when this is True: inside
        backward (step_in_backward) that step() raises with the reason."""
        return getattr(self, "_in_backward", None) is not None

    def _failed_before_step(self, error: Exception) -> None:
        """Called with an error raised before the library's step (which is
        re-raised after): the 1-bit optimizers tell the other ranks."""

    def _prepare_step(self, grads=None, lrs=None, push_hparams=True):
        """Everything before the library's steps: registration (params at
        their first step with a grad), hyper-parameters, the grad
        descriptors. Returns the (device state, number of params) to step,
        or None when the step is skipped by agreement over the meshes.
        grads, lrs: as _run_step's."""
        # Once every param of the groups is registered, a copy of the groups'
        # param lists (the same tensors, compared by identity) says whether
        # they changed since.
        if not self._groups_unchanged():
            self._register_new_params(grads)
        work = []
        for dev in self._devices.values():
            if push_hparams:
                self._push_hparams(dev, lrs)
            n = len(dev.params)
            if dev.grads is None or len(dev.grads) != n:
                dev.resize(n)
            local = dev.local_grads() if grads is None else _given_grads(dev, grads)
            work.append((dev, local, dev.local_params()))
        if self._meshes and self._config["skip_nonfinite"] and self._nonfinite_on_any_rank(work):
            return None
        ready = []
        for dev, grads, params in work:
            n = len(dev.params)
            if (n and dev.fill_grads_fast(grads)) or dev.fill_grads_checked(params, grads):
                ready.append((dev, n))
        return ready

    def _register_new_params(self, grads=None) -> None:
        complete = True
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p in self._where or p in self._empty_shards or p.numel() == 0:  # empty params: no state
                    continue
                if (p.grad if grads is None else grads.get(p)) is None:
                    complete = False
                    continue
                if _local(p).numel() == 0:
                    # A DTensor whose shard on this rank is empty: no lowbit
                    # state here, but its step count is kept so that every
                    # rank's state dict has the same entries.
                    self._empty_shards[p] = 0
                    self.state[p] = _StateView(self, p)
                    continue
                self._register(p, gi, group)
        self._meshes = self._device_meshes()
        self._registered_params = [list(group["params"]) for group in self.param_groups] if complete else None

    def _device_meshes(self) -> list:
        """The device meshes of the DTensor params, in the groups' order (the
        same on every rank)."""
        meshes = []
        for group in self.param_groups:
            for p in group["params"]:
                if _is_dtensor(p) and not any(p.device_mesh is m for m in meshes):
                    meshes.append(p.device_mesh)
        return meshes

    def _nonfinite_on_any_rank(self, work) -> bool:
        """Whether a grad holds NaN/Inf on this rank or on any rank of the
        params' device meshes (one max-norm pass over the local grads and one
        all_reduce per mesh dimension)."""
        import torch.distributed as dist

        bad = False
        for _, grads, params in work:
            gs = [_nonfinite_values(g) for g in grads if g is not None]
            gs = [v for v in gs if v.numel()]  # a sparse grad with no entries is all zeros
            if gs:
                top = torch.stack([torch.linalg.vector_norm(g, float("inf")).float() for g in gs]).sum()
                bad = bad or not bool(torch.isfinite(top))
        for mesh in self._meshes:
            flag = torch.tensor([1.0 if bad else 0.0], device=mesh.device_type)
            for dim in range(mesh.ndim):
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
            bad = bool(flag.item() > 0)
        return bad

    def _groups_unchanged(self) -> bool:
        """Whether the groups hold the params they held when all were
        registered: the same tensors (identity, at C speed) in the same order."""
        known = self._registered_params
        groups = self.param_groups
        if known is None or len(known) != len(groups):
            return False
        for group, params in zip(groups, known):
            now = group["params"]
            if len(now) != len(params) or not all(map(operator.is_, now, params)):
                return False
        return True

    @staticmethod
    def _step_device(dev, n: int) -> None:
        stream = None
        if dev.device.type == "cuda":
            stream = torch.cuda.current_stream(dev.device).cuda_stream
        dev.handle._step_tensors(dev.grads.cdata, n, stream)

    # -- lowbit specifics

    @property
    def last_step_skipped(self) -> bool:
        """True if the last step found a NaN/Inf gradient and changed nothing
        (with DTensor params: in the grads of any rank of their meshes). On
        CUDA the flag is written by the device: synchronise the stream before
        reading it."""
        return self._skipped or any(dev.handle.last_step_skipped for dev in self._devices.values())

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by lowbit, over all devices."""
        return sum(dev.handle.state_bytes() for dev in self._devices.values())

    def param_info(self, p: torch.Tensor):
        """What the library keeps for a param (for a DTensor: its local shard)."""
        key, pid = self._lookup(p)
        return self._devices[key].handle.param_info(pid)

    def read_moment(self, p: torch.Tensor, moment: int = 0) -> torch.Tensor:
        """A dequantized float32 CPU copy of a param's moment (0 first, 1
        second), shaped like the param (for a DTensor: like its local shard)."""
        key, pid = self._lookup(p)
        return torch.from_numpy(self._devices[key].handle.read_moment(pid, moment))

    def lowbit_handles(self) -> dict:
        """{device: lowbit.Optimizer} for the devices in use."""
        return {key: dev.handle for key, dev in self._devices.items()}

    def _lookup(self, p):
        if p not in self._where:
            if p in self._empty_shards:
                raise KeyError("this DTensor param's shard on this rank is empty: it has no lowbit state here")
            raise KeyError("this param has no lowbit state yet (it gets one at its first step with a grad)")
        return self._where[p]

    # -- registration and hyper-parameters

    def _check_group(self, group):
        refuse(**{name: group.get(name) for name in self._refused})

    def _hparams(self, group) -> dict:
        raise NotImplementedError

    @staticmethod
    def _f(v) -> float:
        return float(v.item()) if isinstance(v, torch.Tensor) else float(v)

    def _device_state(self, device: torch.device) -> _DeviceState:
        key = _device_key(device)
        dev = self._devices.get(key)
        if dev is None:
            dev = _DeviceState(self._new_handle(key), device)
            dev.pushed = [None] * len(self.param_groups)
            self._devices[key] = dev
        return dev

    def _new_handle(self, key: str) -> Optimizer:
        """A lowbit handle on device `key` with this optimizer's settings and
        param groups (no params)."""
        config = dict(self._config)
        config["num_threads"] = resolve_num_threads(config["num_threads"], default=torch.get_num_threads)
        handle = Optimizer(self._algorithm, device=key, **config)
        try:
            handle.set_hparams(0, **self._hparams(self.param_groups[0]))
            for group in self.param_groups[1:]:
                handle.add_group(**self._hparams(group))
        except BaseException:
            handle.close()
            raise
        return handle

    def _num_moments(self, group) -> int:
        """How many moments a param of this group keeps."""
        return len(self._moment_names)

    def _param_options(self, p: torch.Tensor, group: dict) -> dict:
        """Further add_param options of a param of `group` (a subclass's
        per-param choices; Muon: rank-1 normalised momentum of its matrices)."""
        return {}

    def _register(self, p: torch.Tensor, gi: int, group: dict) -> None:
        local = _local(p)  # a DTensor: the library keeps the state of this rank's shard
        dev = self._device_state(local.device)
        ref = _tensor_ref(local, "param", registered=True)
        fmt = parse_state_format(group.get("state"), "state")
        pid = dev.handle._add_param_ref(
            ref, None, group=gi,
            state=None if fmt == self._state_format else fmt,
            stochastic_rounding=group.get("stochastic_rounding"),
            error_correction=group.get("error_correction"),
            **self._param_options(p, group))  # the shape: the tensor's (Optimizer.add_param)
        dev.params.append(p)
        dev.ptrs.append(local.data_ptr())
        dev.numels.append(local.numel())
        dev.dtensor = dev.dtensor or local is not p
        self._where[p] = (_device_key(local.device), pid)
        self.state[p] = _StateView(self, p)

    def _check_unmoved(self) -> None:
        """Raises before any step if a registered param no longer holds the
        memory registered with the library (its .data replaced or resized)."""
        for dev in self._devices.values():
            dev.check_unmoved()

    def _push_hparams(self, dev: _DeviceState, lrs=None) -> None:
        """Gives the library the groups' hyper-parameters that changed since
        the last push (lrs: None, or one float per group that replaces the
        groups' "lr")."""
        for gi, group in enumerate(self.param_groups):
            hp = self._hparams(group)
            if lrs is not None:
                hp["lr"] = lrs[gi]
            key = tuple(sorted((k, tuple(v) if isinstance(v, (tuple, list)) else v) for k, v in hp.items()))
            if dev.pushed[gi] != key:
                dev.handle.set_hparams(gi, **hp)
                dev.pushed[gi] = key


_OP_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLOAT32_MAX = torch.finfo(torch.float32).max


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's elements as integers of its width (NaNs compare by their bits)."""
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _op_copies(mine: list, given: list, compare: bool = True) -> list:
    """The (param, copy) pairs among the lowbit::step op's params, each
    checked before anything is written: params[i] is the optimizer's param i
    itself (eager, inductor), the same memory seen the same way, or a copy
    of it (a backend that functionalizes the op without putting it back in
    place, aot_eager: a clone made just before the op) -- same shape, dtype,
    device and bits (compare; not inside a CUDA graph capture, which cannot
    read them) -- which gets the result after the step. Anything else
    (another shape, another tensor's values) raises, naming it: the library
    steps the params it registered, and a foreign tensor copied in would
    overwrite them."""
    copies = []
    for i, (p, q) in enumerate(zip(mine, given)):
        if q is p:
            continue
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"lowbit::step: params[{i}] is a {type(q).__name__}, not a tensor")
        if (q.shape, q.dtype, q.device, q.layout) != (p.shape, p.dtype, p.device, p.layout):
            raise RuntimeError(
                f"lowbit::step: params[{i}] is a {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}, but the "
                f"optimizer's param {i} is {p.dtype} of shape {tuple(p.shape)} on {p.device}; nothing was changed")
        if q.data_ptr() == p.data_ptr() and q.stride() == p.stride():
            continue  # the param's own memory (p.detach(), p.data)
        shares = q.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
        if shares or (compare and not torch.equal(_bits(q), _bits(p))):
            raise RuntimeError(
                f"lowbit::step: params[{i}] is neither the optimizer's param {i} nor a copy of it ("
                + ("a view of its memory laid out differently" if shares else "its values differ")
                + "); the op steps the params the optimizer registered: pass them (a backend that functionalizes "
                "the op hands it copies made just before it; a param written earlier in the same compiled region "
                "then differs: step outside that region, or with inductor); nothing was changed")
        copies.append((p, q))
    return copies


def _check_op_grad(i: int, p: torch.Tensor, g) -> None:
    """The op's grads[i] for param i: None, or a float tensor of the param's
    shape on its device (dense, or torch.sparse_coo)."""
    if g is None:
        return
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"lowbit::step: grads[{i}] is a {type(g).__name__}, not a tensor or None")
    if (g.layout not in (torch.strided, torch.sparse_coo) or g.shape != p.shape or g.device != p.device
            or g.dtype not in _OP_GRAD_DTYPES):
        raise RuntimeError(
            f"lowbit::step: grads[{i}] is a {g.layout} {g.dtype} tensor of shape {tuple(g.shape)} on {g.device}; "
            f"param {i} needs a float32, bfloat16 or float16 gradient of shape {tuple(p.shape)} on {p.device}; "
            "nothing was changed")


def _op_lr(gi: int, t, read: bool):
    """The op's lr of group gi: a one-element real tensor; its value (read:
    outside a CUDA graph capture) finite and >= 0 as a float32 (lowbit.h)."""
    if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.is_complex() or t.dtype == torch.bool:
        what = (f"a {t.dtype} tensor of {t.numel()} elements" if isinstance(t, torch.Tensor)
                else f"a {type(t).__name__}")
        raise RuntimeError(f"lowbit::step: lrs[{gi}] is {what}; each group's lr is a one-element real tensor")
    if not read:
        return None
    value = float(t.item())
    if not 0.0 <= value <= _FLOAT32_MAX:  # NaN fails too
        raise RuntimeError(f"lowbit::step: lrs[{gi}] = {value} (param group {gi}'s lr) must be finite and >= 0; "
                           "nothing was changed")
    return value


def _capturing(params: list) -> bool:
    """Whether this op runs inside a CUDA graph capture (of its params' stream)."""
    return (torch.cuda.is_available() and any(p.is_cuda for p in params)
            and torch.cuda.is_current_stream_capturing())


class _CudaWord:
    """One float32 at a device address, for torch.as_tensor (__cuda_array_interface__)."""

    def __init__(self, address: int):
        self.__cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (address, False),
                                         "version": 2, "strides": None}


def _engine_lr(dev, group: int) -> torch.Tensor:
    """A one-element float32 tensor over the engine's lr of a group (lr_address):
    device memory on CUDA, host memory on the CPU. Valid for the handle's life."""
    address = dev.handle.lr_address(group)
    if dev.device.type == "cuda":
        with torch.cuda.device(dev.device):
            return torch.as_tensor(_CudaWord(address), device=dev.device)
    return torch.frombuffer((ctypes.c_float * 1).from_address(address), dtype=torch.float32)


def _lr_tensor(lr):
    """A group's lr as the lowbit::step op takes it: a tensor as it is (no
    recompilation when a scheduler writes it in place), else a float64 tensor
    of the number (its exact value)."""
    return lr if isinstance(lr, torch.Tensor) else torch.tensor(lr, dtype=torch.float64)


def _given_grads(dev: _DeviceState, grads: dict) -> list:
    """The grads of a device's params, in its order, from {param: grad}
    (their local shards for DTensor params)."""
    local = [grads.get(p) for p in dev.params]
    if dev.dtensor:
        local = [None if g is None else _local(g) for g in local]
    return local

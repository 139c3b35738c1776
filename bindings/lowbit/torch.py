"""Drop-in ``torch.optim.Optimizer`` classes backed by lowbit.

    from lowbit.torch import AdamW
    opt = AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, state="8bit")
    for x, y in data:
        loss = loss_fn(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()

Classes: :class:`AdamW`, :class:`Adam`, :class:`Lion`, :class:`SGD`. Besides the
usual hyper-parameters each takes

* ``state``: how the moments are kept: ``"fp32"``, ``"bf16"``, ``"8bit"``,
  ``"4bit"`` or ``"fp8"`` (``second_state`` sets the second moment apart);
  tensors under ``min_quantized_numel`` elements (default 4096) keep fp32
  state with the quantized formats;
* ``stochastic_rounding`` / ``error_correction``: for bf16 / fp16 params,
  how the fp32 result is written back (error correction keeps one extra byte
  per element and wins if both are set);
* ``seed``, ``skip_nonfinite`` (skip the whole step if any grad holds NaN/Inf,
  default True), ``num_threads``: threads of the CPU engine (0: all OpenMP
  threads); by default the environment variable ``LOWBIT_NUM_THREADS`` when
  set, else ``torch.get_num_threads()`` read when the CPU handle is created
  (at the first step), so ``torch.set_num_threads`` before training governs
  lowbit too.

``state``, ``stochastic_rounding`` and ``error_correction`` may also be set per
param group. Param groups, ``add_param_group``, lr schedulers (``group["lr"]``
and every other hyper-parameter are read at each step), ``zero_grad``, hooks
and closures work as with torch's optimizers. ``state_dict()`` holds the
compressed lowbit state (one checkpoint blob per device, as a uint8 tensor)
and round-trips through ``torch.save``; ``load_state_dict()`` also imports a
plain ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` state dict (its fp32 moments
are converted to this optimizer's formats).

Params may live on the CPU and on CUDA devices (one lowbit handle per
device); each step runs on the current CUDA stream of its device. Params and
grads are used in place, never copied: params must be contiguous float32,
bfloat16 or float16 tensors; grads contiguous, of the same size (any of those
dtypes, e.g. bf16 grads for fp32 params).
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from ._arrays import ArrayRef
from ._ffi import Algorithm, Device, Dtype, StateFormat, Tensor
from ._lib import ArrayError, InvalidArgumentError, StateMismatchError
from ._optimizer import STATE_FORMAT_NAMES, Optimizer, parse_state_format, resolve_num_threads

__all__ = ["AdamW", "Adam", "Lion", "SGD", "LowbitOptimizer"]

_TORCH_DTYPES = {torch.float32: Dtype.FLOAT32, torch.bfloat16: Dtype.BFLOAT16, torch.float16: Dtype.FLOAT16}
_DTYPE_CODES = {k: int(v) for k, v in _TORCH_DTYPES.items()}


def _tensor_record_dtype():
    """A numpy view of lowbit_tensor_t (the ctypes struct), to fill the
    per-step grad descriptors with one vectorised assignment per field."""
    kinds = {1: "u1", 2: "i2", 4: "i4", 8: "i8"}
    names, formats, offsets = [], [], []
    for name, ctype in Tensor._fields_:
        field = getattr(Tensor, name)
        names.append(name)
        formats.append(np.uintp if name == "data" else kinds[ctypes.sizeof(ctype)])
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": ctypes.sizeof(Tensor)})


_TENSOR_RECORD = _tensor_record_dtype()
_STATE_DICT_VERSION = 1


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def _tensor_ref(t: torch.Tensor, role: str) -> ArrayRef:
    """Describe a torch tensor for the library (no copy, no DLPack round trip)."""
    if t.layout != torch.strided:
        raise ArrayError(f"{role}: {t.layout} tensors are not supported (dense tensors only)")
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        raise ArrayError(f"{role}: dtype {t.dtype} is not float32, float16 or bfloat16")
    if not t.is_contiguous():
        raise ArrayError(f"{role}: the tensor is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                         "lowbit updates tensors in place and never copies them")
    if t.device.type == "cpu":
        device, index = Device.CPU, 0
    elif t.device.type == "cuda":
        device, index = Device.CUDA, t.device.index
    else:
        raise ArrayError(f"{role}: tensors on {t.device} are not supported (cpu or cuda)")
    return ArrayRef(t.data_ptr(), tuple(t.shape), dtype, device, index, t)


class _DeviceState:
    """One lowbit handle and the torch params registered in it, in id order."""

    def __init__(self, handle: Optimizer, device: torch.device):
        self.handle = handle
        self.device = device
        self.params: list = []
        self.ptrs: list = []
        self.pushed: list = []  # per group: the hparams tuple last given to the library
        self.grads = None  # ctypes array of lowbit_tensor_t, reused every step
        self.view = None  # numpy record view of `grads`
        self.numels: list = []  # per param
        self.grad_dtypes = None  # torch dtypes of the grads in `grads` (None: unknown)
        self.cuda_index = device.index if device.type == "cuda" else None

    def resize(self, n: int) -> None:
        """(Re)allocate the grad descriptors for n params; the numel and
        device fields never change for a param."""
        self.grads = (Tensor * n)()
        self.view = np.frombuffer(self.grads, dtype=_TENSOR_RECORD, count=n) if n else None
        if n:
            self.view["numel"] = self.numels
            self.view["device"] = int(Device.CUDA if self.device.type == "cuda" else Device.CPU)
            self.view["device_index"] = self.cuda_index or 0
        self.grad_dtypes = None

    def fill_grads_fast(self, grads: list) -> bool:
        """The usual step: every param has a grad, contiguous, of a known
        dtype and the param's size, on the param's device, and no param
        moved. Fills the descriptors with a few vectorised assignments and
        returns True; returns False (having written nothing) otherwise, and
        the per-param path then checks each grad and names the culprit."""
        try:
            ptrs = [g.data_ptr() for g in grads]
            if not all([g.layout is torch.strided for g in grads]):
                return False
            if not all([g.is_contiguous() for g in grads]):
                return False
            if [g.numel() for g in grads] != self.numels:
                return False
            if self.cuda_index is None:
                if not all([g.is_cpu for g in grads]):
                    return False
            elif not all([g.is_cuda for g in grads]) or any([g.get_device() != self.cuda_index for g in grads]):
                return False
            dtypes = [g.dtype for g in grads]
        except (AttributeError, RuntimeError, TypeError):  # a None grad, a sparse or opaque tensor
            return False
        if [p.data_ptr() for p in self.params] != self.ptrs:
            return False
        if dtypes != self.grad_dtypes:
            codes = [_DTYPE_CODES.get(dt) for dt in dtypes]
            if None in codes:
                return False
            self.view["dtype"] = codes
            self.grad_dtypes = dtypes
        self.view["data"] = ptrs
        return True


class LowbitOptimizer(torch.optim.Optimizer):
    """Base class; use AdamW, Adam, Lion or SGD."""

    _algorithm: Algorithm = None
    _moment_names: tuple = ()

    def __init__(self, params, defaults: dict, *, state="fp32", second_state=None, stochastic_rounding=False,
                 error_correction=False, min_quantized_numel=4096, seed=0, skip_nonfinite=True, num_threads=None,
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
        self._state_format = parse_state_format(state, "state")
        self._second_state = parse_state_format(second_state, "second_state")
        self._config = dict(
            state=self._state_format,
            second_state=self._second_state,
            min_quantized_numel=min_quantized_numel,
            seed=seed,
            stochastic_rounding=bool(stochastic_rounding),
            error_correction=bool(error_correction),
            skip_nonfinite=bool(skip_nonfinite),
            num_threads=num_threads,
        )
        self._devices: dict = {}
        self._where: dict = {}  # param -> (device key, param id)
        self._registered_ids = None  # ids of the groups' params when all were registered
        defaults = dict(defaults)
        defaults.update(state=STATE_FORMAT_NAMES[self._state_format], stochastic_rounding=bool(stochastic_rounding),
                        error_correction=bool(error_correction))
        super().__init__(params, defaults)

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
        self._devices, self._where, self._registered_ids = {}, {}, None

    def __getstate__(self):
        raise TypeError("lowbit.torch optimizers cannot be pickled; use state_dict() / load_state_dict()")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Register params at their first step with a grad. Once every param
        # of the groups is registered, a list of ids (registered params are
        # kept alive by self._where, so their ids stay theirs) says whether the
        # groups changed since.
        ids = [id(p) for group in self.param_groups for p in group["params"]]
        if ids != self._registered_ids:
            complete = True
            for gi, group in enumerate(self.param_groups):
                for p in group["params"]:
                    if p in self._where or p.numel() == 0:  # empty params are never registered
                        continue
                    if p.grad is None:
                        complete = False
                        continue
                    self._register(p, gi, group)
            self._registered_ids = ids if complete else None
        for dev in self._devices.values():
            self._push_hparams(dev)
            n = len(dev.params)
            if dev.grads is None or len(dev.grads) != n:
                dev.resize(n)
            grads = [p.grad for p in dev.params]
            if n and dev.fill_grads_fast(grads):
                self._step_device(dev, n)
                continue
            dev.grad_dtypes = None  # the per-param path below writes the dtypes itself
            any_grad = False
            keep = []
            for i, p in enumerate(dev.params):
                if p.data_ptr() != dev.ptrs[i]:
                    raise RuntimeError(
                        f"param {tuple(p.shape)} of this optimizer moved in memory (was its .data replaced, or the "
                        "model moved to another device after the optimizer was built?); build the optimizer after "
                        "moving the model")
                g = p.grad
                if g is None:
                    dev.grads[i].data = None
                    continue
                if g.device != p.device:
                    raise ArrayError(f"grad of param {tuple(p.shape)} is on {g.device} but the param is on {p.device}")
                if g.numel() != p.numel():
                    raise ArrayError(f"grad of param {tuple(p.shape)} has {g.numel()} elements, the param "
                                     f"{p.numel()}")
                ref = _tensor_ref(g, "grad")
                dev.grads[i] = ref.tensor
                keep.append(g)
                any_grad = True
            if not any_grad:
                continue
            self._step_device(dev, n)
            del keep
        return loss

    @staticmethod
    def _step_device(dev, n: int) -> None:
        stream = None
        if dev.device.type == "cuda":
            stream = torch.cuda.current_stream(dev.device).cuda_stream
        dev.handle._step_tensors(dev.grads, n, stream)

    # -- lowbit specifics

    @property
    def last_step_skipped(self) -> bool:
        """True if the last step found a NaN/Inf gradient and changed nothing.
        On CUDA the flag is written by the device: synchronise the stream
        before reading it."""
        return any(dev.handle.last_step_skipped for dev in self._devices.values())

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by lowbit, over all devices."""
        return sum(dev.handle.state_bytes() for dev in self._devices.values())

    def param_info(self, p: torch.Tensor):
        key, pid = self._lookup(p)
        return self._devices[key].handle.param_info(pid)

    def read_moment(self, p: torch.Tensor, moment: int = 0) -> torch.Tensor:
        """A dequantized float32 CPU copy of a param's moment (0 first, 1 second)."""
        key, pid = self._lookup(p)
        return torch.from_numpy(self._devices[key].handle.read_moment(pid, moment))

    def lowbit_handles(self) -> dict:
        """{device: lowbit.Optimizer} for the devices in use."""
        return {key: dev.handle for key, dev in self._devices.items()}

    def _lookup(self, p):
        if p not in self._where:
            raise KeyError("this param has no lowbit state yet (it gets one at its first step with a grad)")
        return self._where[p]

    # -- registration and hyper-parameters

    def _check_group(self, group):
        pass

    def _hparams(self, group) -> dict:
        raise NotImplementedError

    @staticmethod
    def _f(v) -> float:
        return float(v.item()) if isinstance(v, torch.Tensor) else float(v)

    def _device_state(self, device: torch.device) -> _DeviceState:
        key = _device_key(device)
        dev = self._devices.get(key)
        if dev is None:
            config = dict(self._config)
            config["num_threads"] = resolve_num_threads(config["num_threads"], default=torch.get_num_threads)
            handle = Optimizer(self._algorithm, device=key, **config)
            handle.set_hparams(0, **self._hparams(self.param_groups[0]))
            for group in self.param_groups[1:]:
                handle.add_group(**self._hparams(group))
            dev = _DeviceState(handle, device)
            dev.pushed = [None] * len(self.param_groups)
            self._devices[key] = dev
        return dev

    def _register(self, p: torch.Tensor, gi: int, group: dict) -> None:
        dev = self._device_state(p.device)
        ref = _tensor_ref(p, "param")
        fmt = parse_state_format(group.get("state"), "state")
        pid = dev.handle._add_param_ref(
            ref, None, group=gi,
            state=None if fmt == self._state_format else fmt,
            stochastic_rounding=group.get("stochastic_rounding"),
            error_correction=group.get("error_correction"))
        dev.params.append(p)
        dev.ptrs.append(p.data_ptr())
        dev.numels.append(p.numel())
        self._where[p] = (_device_key(p.device), pid)

    def _push_hparams(self, dev: _DeviceState) -> None:
        for gi, group in enumerate(self.param_groups):
            hp = self._hparams(group)
            key = tuple(sorted((k, tuple(v) if isinstance(v, (tuple, list)) else v) for k, v in hp.items()))
            if dev.pushed[gi] != key:
                dev.handle.set_hparams(gi, **hp)
                dev.pushed[gi] = key

    # -- state dict

    def _param_index(self) -> dict:
        index, i = {}, 0
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(p, i)
                i += 1
        return index

    def state_dict(self) -> dict:
        """Param groups as torch writes them, plus the lowbit state: one
        compressed checkpoint per device (a uint8 tensor) with the indices
        of its params. ``state`` holds each registered param's step count."""
        index = self._param_index()
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index[p] for p in group["params"]]
            groups.append(packed)
        state, handles = {}, []
        for key, dev in self._devices.items():
            blob = dev.handle.save("compressed")
            handles.append({
                "device": key,
                "params": [index[p] for p in dev.params],
                "checkpoint": torch.frombuffer(bytearray(blob), dtype=torch.uint8),
            })
            for pid, p in enumerate(dev.params):
                state[index[p]] = {"step": dev.handle.param_info(pid).step}
        return {
            "state": state,
            "param_groups": groups,
            "lowbit": {"version": _STATE_DICT_VERSION, "algorithm": self._algorithm.name.lower(), "handles": handles},
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict from :meth:`state_dict` (any device, any state
        format: moments are converted to this optimizer's formats), or a plain
        ``torch.optim`` state dict of the same algorithm (fp32 moments)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for i, (g, sg) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError(f"param group {i}: the loaded state dict has {len(sg['params'])} params, "
                                 f"this optimizer {len(g['params'])}")
        by_index = {}
        for g, sg in zip(self.param_groups, saved_groups):
            for p, idx in zip(g["params"], sg["params"]):
                by_index[idx] = p
        new_groups = []
        for g, sg in zip(self.param_groups, saved_groups):
            ng = dict(g)
            ng.update({k: v for k, v in sg.items() if k != "params"})
            ng["params"] = g["params"]
            self._check_group(ng)
            self._hparams(ng)  # validates
            new_groups.append(ng)

        lowbit = state_dict.get("lowbit")
        if lowbit is not None:
            if lowbit.get("version") != _STATE_DICT_VERSION:
                raise ValueError(f"lowbit state dict version {lowbit.get('version')} is not supported")
            if lowbit.get("algorithm") != self._algorithm.name.lower():
                raise StateMismatchError(f"the state dict is for {lowbit.get('algorithm')}, this optimizer is "
                                         f"{self._algorithm.name.lower()}")
            plan = [([by_index[i] for i in h["params"]], _loader(bytes(h["checkpoint"].cpu().numpy().tobytes())))
                    for h in lowbit["handles"]]
        else:
            plan = self._plan_torch_import(state_dict.get("state", {}), by_index, saved_groups)

        # Build the new handles aside; swap them in only when all loaded.
        old = (self._devices, self._where, self.param_groups)
        self._devices, self._where, self._registered_ids = {}, {}, None
        self.param_groups = new_groups
        try:
            for params, blob in plan:
                devices = {_device_key(p.device) for p in params}
                if len(devices) > 1:
                    raise ValueError(f"params saved together on one device are now on {sorted(devices)}")
                if params and _device_key(params[0].device) in self._devices:
                    raise ValueError(f"two saved devices map onto {_device_key(params[0].device)}")
                group_of = {p: gi for gi, g in enumerate(new_groups) for p in g["params"]}
                for p in params:
                    self._register(p, group_of[p], new_groups[group_of[p]])
                if params:
                    blob(self._devices[_device_key(params[0].device)])
        except BaseException:
            for dev in self._devices.values():
                dev.handle.close()
            self._devices, self._where, self.param_groups = old
            self._registered_ids = None
            raise
        for dev in old[0].values():
            dev.handle.close()
        # a loaded checkpoint replaced the handles' hyper-parameters: push ours at the next step
        for dev in self._devices.values():
            dev.pushed = [None] * len(self.param_groups)

    def _plan_torch_import(self, state: dict, by_index: dict, saved_groups) -> list:
        """Plan for a plain torch.optim state dict: register the params that
        have state, then hand each moment (fp32) and step count to the library,
        which encodes them into this optimizer's formats and checks them."""
        names = self._moment_names
        per_device: dict = {}
        for idx, s in sorted(state.items(), key=lambda kv: kv[0]):
            if idx not in by_index:
                raise ValueError(f"the state dict has state for param index {idx}, which no group holds")
            if not s:
                continue
            if "max_exp_avg_sq" in s:
                raise ValueError("amsgrad state (max_exp_avg_sq) cannot be imported: lowbit has no amsgrad")
            moments = [s.get(n) for n in names]
            if self._algorithm == Algorithm.SGD and moments[0] is None:
                continue  # SGD without momentum keeps no state
            missing = [n for n, m in zip(names, moments) if m is None]
            if missing:
                raise ValueError(f"state of param {idx} lacks {missing} (has {sorted(s)})")
            p = by_index[idx]
            for n, m in zip(names, moments):
                if m.numel() != p.numel():
                    raise ValueError(f"state {n} of param {idx} has {m.numel()} elements, the param {p.numel()}")
            step = s.get("step", 1)
            step = int(step.item()) if isinstance(step, torch.Tensor) else int(step)
            per_device.setdefault(_device_key(p.device), []).append((p, step, moments))

        plan = []
        for entries in per_device.values():
            params = [e[0] for e in entries]

            def import_moments(dev, entries=entries):
                # The library checks each moment (its parameter, size, finite
                # values, a non-negative variance) and encodes it.
                for pid, (p, step, moments) in enumerate(entries):
                    for k, m in enumerate(moments):
                        dev.handle.write_moment(pid, k, m.detach().float().cpu().numpy())
                    dev.handle.set_step(step, pid)

            plan.append((params, import_moments))
        return plan


def _loader(blob: bytes):
    """Loads a lowbit checkpoint into a device's handle."""
    return lambda dev: dev.handle.load(blob)


def _betas(group):
    b1, b2 = group["betas"]
    return LowbitOptimizer._f(b1), LowbitOptimizer._f(b2)


class _AdamBase(LowbitOptimizer):
    _moment_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, amsgrad=False,
                 maximize=False, bias_correction=True, **lowbit_options):
        if amsgrad:
            raise ValueError("amsgrad=True is not supported by lowbit")
        if maximize:
            raise ValueError("maximize=True is not supported by lowbit (negate the loss)")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults, **lowbit_options)

    def _check_group(self, group):
        if group.get("amsgrad"):
            raise ValueError("amsgrad=True is not supported by lowbit")
        if group.get("maximize"):
            raise ValueError("maximize=True is not supported by lowbit")

    def _hparams(self, group):
        b1, b2 = _betas(group)
        return dict(lr=self._f(group["lr"]), beta1=b1, beta2=b2, eps=self._f(group["eps"]),
                    weight_decay=self._f(group["weight_decay"]),
                    bias_correction=bool(group.get("bias_correction", True)))


class AdamW(_AdamBase):
    """AdamW (decoupled weight decay), like torch.optim.AdamW, with lowbit state."""

    _algorithm = Algorithm.ADAMW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


class Adam(_AdamBase):
    """Adam (L2 weight decay added to the gradient), like torch.optim.Adam."""

    _algorithm = Algorithm.ADAM

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


class Lion(LowbitOptimizer):
    """Lion (Chen et al. 2023) with decoupled weight decay: update
    sign(beta1*m + (1-beta1)*g), then m = beta2*m + (1-beta2)*g."""

    _algorithm = Algorithm.LION
    _moment_names = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **lowbit_options):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay), **lowbit_options)

    def _hparams(self, group):
        b1, b2 = _betas(group)
        return dict(lr=self._f(group["lr"]), beta1=b1, beta2=b2, weight_decay=self._f(group["weight_decay"]))


class SGD(LowbitOptimizer):
    """SGD with momentum / dampening / Nesterov and L2 weight decay, like
    torch.optim.SGD. Without momentum it keeps no state."""

    _algorithm = Algorithm.SGD
    _moment_names = ("momentum_buffer",)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, **lowbit_options):
        if maximize:
            raise ValueError("maximize=True is not supported by lowbit (negate the loss)")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults, **lowbit_options)

    def _check_group(self, group):
        if group.get("maximize"):
            raise ValueError("maximize=True is not supported by lowbit")

    def _hparams(self, group):
        return dict(lr=self._f(group["lr"]), momentum=self._f(group["momentum"]),
                    dampening=self._f(group["dampening"]), weight_decay=self._f(group["weight_decay"]),
                    nesterov=bool(group["nesterov"]))


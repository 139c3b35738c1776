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

DTensor params (FSDP2's ``fully_shard``, tensor parallelism): each rank's
lowbit state is that of its local shards (``param.to_local()``, the grads'
likewise), quantized per block of the flattened local shard; a rank whose
shard of a param is empty keeps no state for it. With ``skip_nonfinite`` the
NaN/Inf check is agreed over the params' device meshes (one all_reduce per
mesh dimension and step), so every rank skips the same steps. ``state_dict()``
then holds materialised fp32 moments as DTensors with the param's mesh and
placements (torch's layout: ``step``, ``exp_avg``, ...), which
``torch.distributed.checkpoint`` saves and loads on another number of ranks;
``load_state_dict()`` re-quantizes each rank's shard into this optimizer's
formats. ``optimizer.state[p]`` reads a param's step and moments (dequantized,
on demand) in the same layout.

Params may live on the CPU and on CUDA devices (one lowbit handle per
device); each step runs on the current CUDA stream of its device. Params and
grads are used in place, never copied: params must be contiguous float32,
bfloat16 or float16 tensors; grads contiguous, of the same size (any of those
dtypes, e.g. bf16 grads for fp32 params).
"""

from __future__ import annotations

import ctypes
import operator
import sys
import weakref
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import torch

from ._arrays import ArrayRef
from ._ffi import Algorithm, Device, Dtype, StateFormat, Tensor
from ._lib import ArrayError, CommunicationError, InvalidArgumentError, StateMismatchError
from ._optimizer import (STATE_FORMAT_NAMES, Optimizer, check_onebit_options, parse_state_format, parse_state_option,
                         resolve_num_threads)
from ._torch_dist import ProcessGroupTransport, onebit_ddp_comm_hook, process_group_communicator

__all__ = ["AdamW", "Adam", "Lion", "SGD", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "LowbitOptimizer",
           "process_group_communicator", "onebit_ddp_comm_hook", "ProcessGroupTransport"]

_TORCH_DTYPES = {torch.float32: Dtype.FLOAT32, torch.bfloat16: Dtype.BFLOAT16, torch.float16: Dtype.FLOAT16}
_DTYPE_CODES = {k: int(v) for k, v in _TORCH_DTYPES.items()}
_GRAD_META = operator.attrgetter("layout", "dtype", "device")


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
# Per-group options that say how this optimizer keeps its state: load_state_dict
# keeps the optimizer's own and converts the saved moments to them.
_OWN_GROUP_OPTIONS = ("state", "stochastic_rounding", "error_correction")


def _dtensor_type():
    """torch's DTensor class, or None while torch.distributed.tensor is not
    imported (then no tensor can be a DTensor, and nothing is imported here)."""
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None)


def _is_dtensor(t) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def _local(t):
    """The local shard of a DTensor (the tensor itself, not a copy), else t."""
    return t.to_local() if _is_dtensor(t) else t


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
        self.grad_meta = None  # (layout, dtype, device) of each grad in `grads` (None: unknown)
        self.cuda_index = device.index if device.type == "cuda" else None
        self.grad_device = torch.device(_device_key(device))  # with its index on CUDA
        self.dtensor = False  # some params are DTensors: the library steps their local shards

    def local_params(self) -> list:
        return [_local(p) for p in self.params] if self.dtensor else self.params

    def local_grads(self) -> list:
        if self.dtensor:
            return [None if p.grad is None else _local(p.grad) for p in self.params]
        return [p.grad for p in self.params]

    def resize(self, n: int) -> None:
        """(Re)allocate the grad descriptors for n params; the numel and
        device fields never change for a param."""
        self.grads = (Tensor * n)()
        self.view = np.frombuffer(self.grads, dtype=_TENSOR_RECORD, count=n) if n else None
        if n:
            self.view["numel"] = self.numels
            self.view["device"] = int(Device.CUDA if self.device.type == "cuda" else Device.CPU)
            self.view["device_index"] = self.cuda_index or 0
        self.grad_meta = None

    def fill_grads_fast(self, grads: list) -> bool:
        """The usual step: every param has a grad, contiguous, of a known
        dtype and the param's size, on the param's device, and no param
        moved. Fills the descriptors with a few vectorised assignments and
        returns True; returns False (having written nothing) otherwise, and
        the per-param path then checks each grad and names the culprit."""
        # One C-level call per grad and property (map over the unbound
        # methods): after a step has streamed the state through the caches,
        # each tensor's metadata costs a miss, and Python work per grad is
        # the cost of this path for many small params.
        try:
            ptrs = list(map(torch.Tensor.data_ptr, grads))
            if not all(map(torch.Tensor.is_contiguous, grads)):
                return False
            if list(map(torch.Tensor.numel, grads)) != self.numels:
                return False
            meta = list(map(_GRAD_META, grads))
        except (AttributeError, RuntimeError, TypeError):  # a None grad, a sparse or opaque tensor
            return False
        if list(map(torch.Tensor.data_ptr, self.local_params())) != self.ptrs:
            return False
        if meta != self.grad_meta:
            if any(layout is not torch.strided or device != self.grad_device for layout, _, device in meta):
                return False
            codes = [_DTYPE_CODES.get(dtype) for _, dtype, _ in meta]
            if None in codes:
                return False
            self.view["dtype"] = codes
            self.grad_meta = meta
        self.view["data"] = ptrs
        return True


class LowbitOptimizer(torch.optim.Optimizer):
    """Base class; use AdamW, Adam, Lion or SGD."""

    _algorithm: Algorithm = None
    _moment_names: tuple = ()

    def __init__(self, params, defaults: dict, *, state="fp32", second_state=None, stochastic_rounding=False,
                 error_correction=False, min_quantized_numel=4096, seed=0, skip_nonfinite=True, num_threads=None,
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
        # 2+ dims, whose shapes the library takes from the tensors)
        self._state_format, n1, n2 = parse_state_option(state, first_normalization, second_normalization)
        self._second_state = parse_state_format(second_state, "second_state")
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
        self._devices, self._where, self._registered_params = {}, {}, None
        self._empty_shards, self._meshes, self._skipped = {}, [], False

    def __getstate__(self):
        raise TypeError("lowbit.torch optimizers cannot be pickled; use state_dict() / load_state_dict()")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._skipped = False
        # Register params at their first step with a grad. Once every param
        # of the groups is registered, a copy of the groups' param lists (the
        # same tensors, compared by identity) says whether they changed since.
        if not self._groups_unchanged():
            complete = True
            for gi, group in enumerate(self.param_groups):
                for p in group["params"]:
                    if p in self._where or p in self._empty_shards or p.numel() == 0:  # empty params: no state
                        continue
                    if p.grad is None:
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
        work = []
        for dev in self._devices.values():
            self._push_hparams(dev)
            n = len(dev.params)
            if dev.grads is None or len(dev.grads) != n:
                dev.resize(n)
            work.append((dev, dev.local_grads(), dev.local_params()))
        if self._meshes and self._config["skip_nonfinite"] and self._nonfinite_on_any_rank(work):
            # Sharded params: a rank sees only its shards of the grads, so the
            # skip is agreed over the device meshes; the step is skipped on all.
            self._skipped = True
            return loss
        for dev, grads, params in work:
            n = len(dev.params)
            if n and dev.fill_grads_fast(grads):
                self._step_device(dev, n)
                continue
            dev.grad_meta = None  # the per-param path below writes the dtypes itself
            any_grad = False
            keep = []
            for i, (p, g) in enumerate(zip(params, grads)):
                if p.data_ptr() != dev.ptrs[i]:
                    raise RuntimeError(
                        f"param {tuple(p.shape)} of this optimizer moved in memory (was its .data replaced, or the "
                        "model moved to another device after the optimizer was built?); build the optimizer after "
                        "moving the model")
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
        for p in self._empty_shards:
            if p.grad is not None:
                self._empty_shards[p] += 1
        return loss

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
            gs = [g for g in grads if g is not None]
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
        dev.handle._step_tensors(dev.grads, n, stream)

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

    def _num_moments(self, group) -> int:
        """How many moments a param of this group keeps."""
        return len(self._moment_names)

    def _register(self, p: torch.Tensor, gi: int, group: dict) -> None:
        local = _local(p)  # a DTensor: the library keeps the state of this rank's shard
        dev = self._device_state(local.device)
        ref = _tensor_ref(local, "param")
        fmt = parse_state_format(group.get("state"), "state")
        pid = dev.handle._add_param_ref(
            ref, None, group=gi,
            state=None if fmt == self._state_format else fmt,
            stochastic_rounding=group.get("stochastic_rounding"),
            error_correction=group.get("error_correction"),
            shape=tuple(local.shape) if 2 <= local.dim() <= 8 else ())
        dev.params.append(p)
        dev.ptrs.append(local.data_ptr())
        dev.numels.append(local.numel())
        dev.dtensor = dev.dtensor or local is not p
        self._where[p] = (_device_key(local.device), pid)
        self.state[p] = _StateView(self, p)

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
        """Param groups as torch writes them, plus the lowbit state.

        Without DTensor params: one compressed checkpoint per device (a uint8
        tensor) with the indices of its params, under ``"lowbit"``; ``state``
        holds each registered param's step count.

        With DTensor params (FSDP2's ``fully_shard``, tensor parallelism) the
        state is materialised in torch's layout, so that
        ``torch.distributed.checkpoint`` can save it and load it on another
        number of ranks: ``state[i]`` holds ``"step"`` (a float32 scalar
        tensor, as torch's optimizers keep it) and the moments under torch's
        names (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) as float32
        tensors shaped like the param; for a DTensor param, a DTensor with
        the param's device mesh and placements whose local shard is this
        rank's dequantized moment. Every rank has the same entries (a rank
        whose shard of a param is empty has an empty local shard).
        :meth:`load_state_dict` re-quantizes each rank's shard into this
        optimizer's formats, whatever the sharding it was saved with."""
        index = self._param_index()
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index[p] for p in group["params"]]
            groups.append(packed)
        if self._meshes or any(_is_dtensor(p) for g in self.param_groups for p in g["params"]):
            state = {}
            for group in self.param_groups:
                for p in group["params"]:
                    if (p in self._where or p in self._empty_shards) and index[p] not in state:
                        state[index[p]] = self._materialized_state(p, group)
            return {
                "state": state,
                "param_groups": groups,
                "lowbit": {"version": _STATE_DICT_VERSION, "algorithm": self._algorithm.name.lower(),
                           "materialized": True},
            }
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

    def _step_count(self, p) -> int:
        if p in self._empty_shards:
            return self._empty_shards[p]
        key, pid = self._lookup(p)
        return self._devices[key].handle.param_info(pid).step

    def _moment(self, p, k: int) -> torch.Tensor:
        """Moment k of a param, dequantized to float32, shaped like the param,
        on its device; a DTensor like the param for a DTensor param."""
        local = _local(p)
        if p in self._empty_shards:
            m = torch.zeros(local.shape, dtype=torch.float32, device=local.device)
        else:
            m = self.read_moment(p, k).reshape(local.shape).to(local.device)
        if local is p:
            return m
        return type(p).from_local(m, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())

    def _materialized_state(self, p, group) -> dict:
        out = {"step": torch.tensor(float(self._step_count(p)), dtype=torch.float32)}
        for k in range(self._num_moments(group)):
            out[self._moment_names[k]] = self._moment(p, k)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict from :meth:`state_dict` (any device, any state
        format, any sharding of DTensor params: moments are converted to this
        optimizer's formats, which stay its own), or a plain ``torch.optim``
        state dict of the same algorithm (fp32 moments; plain tensors or
        DTensors)."""
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
            # Hyper-parameters come from the state dict, as with torch's
            # optimizers; how the state is kept stays this optimizer's own
            # (the library converts the saved moments into these formats).
            ng.update({k: v for k, v in sg.items() if k != "params" and k not in _OWN_GROUP_OPTIONS})
            ng["params"] = g["params"]
            self._check_group(ng)
            self._hparams(ng)  # validates
            new_groups.append(ng)

        lowbit = state_dict.get("lowbit")
        empty = {}
        if lowbit is not None:
            if lowbit.get("version") != _STATE_DICT_VERSION:
                raise ValueError(f"lowbit state dict version {lowbit.get('version')} is not supported")
            if lowbit.get("algorithm") != self._algorithm.name.lower():
                raise StateMismatchError(f"the state dict is for {lowbit.get('algorithm')}, this optimizer is "
                                         f"{self._algorithm.name.lower()}")
        if lowbit is not None and not lowbit.get("materialized"):
            if any(_is_dtensor(p) for p in by_index.values()):
                raise ValueError("this state dict holds compressed per-device lowbit checkpoints, saved without "
                                 "DTensor params; it cannot be loaded into DTensor (sharded) params")
            plan = [([by_index[i] for i in h["params"]], _loader(bytes(h["checkpoint"].cpu().numpy().tobytes())))
                    for h in lowbit["handles"]]
        else:
            plan, empty = self._plan_torch_import(state_dict.get("state", {}), by_index, saved_groups)

        # Build the new handles aside; swap them in only when all loaded.
        old = (self._devices, self._where, self.param_groups, self.state, self._empty_shards)
        self._devices, self._where, self._registered_params = {}, {}, None
        self.param_groups = new_groups
        self.state = defaultdict(dict)
        self._empty_shards = {}
        try:
            for params, blob in plan:
                devices = {_device_key(_local(p).device) for p in params}
                if len(devices) > 1:
                    raise ValueError(f"params saved together on one device are now on {sorted(devices)}")
                if params and _device_key(_local(params[0]).device) in self._devices:
                    raise ValueError(f"two saved devices map onto {_device_key(_local(params[0]).device)}")
                group_of = {p: gi for gi, g in enumerate(new_groups) for p in g["params"]}
                for p in params:
                    self._register(p, group_of[p], new_groups[group_of[p]])
                if params:
                    blob(self._devices[_device_key(_local(params[0]).device)])
            for p, step in empty.items():
                self._empty_shards[p] = step
                self.state[p] = _StateView(self, p)
        except BaseException:
            for dev in self._devices.values():
                dev.handle.close()
            self._devices, self._where, self.param_groups, self.state, self._empty_shards = old
            self._registered_params = None
            raise
        for dev in old[0].values():
            dev.handle.close()
        self._meshes = self._device_meshes()
        # a loaded checkpoint replaced the handles' hyper-parameters: push ours at the next step
        for dev in self._devices.values():
            dev.pushed = [None] * len(self.param_groups)

    def _plan_torch_import(self, state: dict, by_index: dict, saved_groups) -> tuple:
        """Plan for a torch-layout state dict (a plain torch.optim one, or
        lowbit's materialised one): register the params that have state, then
        hand each moment (fp32; for a DTensor param, this rank's shard) and
        step count to the library, which encodes them into this optimizer's
        formats and checks them. Returns the plan and the step counts of the
        DTensor params whose shard on this rank is empty."""
        names = self._moment_names
        per_device: dict = {}
        empty: dict = {}
        group_of = {}
        for g in self.param_groups:
            for p in g["params"]:
                group_of.setdefault(p, g)
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
            local = _local(p)
            moments = [_local_moment(m, p, local) for m in moments]
            step = s.get("step", 1)
            step = int(step.item()) if isinstance(step, torch.Tensor) else int(step)
            if local is not p and local.numel() == 0:
                empty[p] = step
                continue
            per_device.setdefault(_device_key(local.device), []).append((p, step, moments))

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
        return plan, empty


def _local_moment(m: torch.Tensor, p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """The part of a saved moment that this rank keeps for param p: for a
    DTensor param, the moment laid out like the param (a DTensor with other
    placements or mesh is redistributed; a plain tensor is the full moment),
    then its local shard; for a plain param, the full moment."""
    if _is_dtensor(m):
        if local is p:
            return m.full_tensor()
        if m.device_mesh != p.device_mesh or tuple(m.placements) != tuple(p.placements):
            m = m.redistribute(p.device_mesh, p.placements)
        m = m.to_local()
    elif local is not p:
        from torch.distributed.tensor import Replicate

        full = m.detach().reshape(p.shape).to(device=local.device, dtype=torch.float32)
        m = type(p).from_local(full, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
        m = m.redistribute(p.device_mesh, p.placements).to_local()
    if m.numel() != local.numel():
        raise ValueError(f"a saved moment's shard has {m.numel()} elements, this rank's shard of the param "
                         f"{local.numel()}")
    return m


class _StateView(Mapping):
    """``optimizer.state[p]``: the param's step count and dequantized
    moments under torch's names, read from the library when asked (nothing
    is cached). Present for every param with lowbit state, so that code that
    tests ``optimizer.state`` (torch.distributed.checkpoint) sees it."""

    def __init__(self, opt, p):
        self._opt = weakref.ref(opt)
        self._p = p

    def _keys(self):
        opt = self._opt()
        if opt is None:
            return ()
        group = next((g for g in opt.param_groups if any(q is self._p for q in g["params"])), None)
        n = opt._num_moments(group) if group is not None else 0
        return ("step",) + tuple(opt._moment_names[:n])

    def __getitem__(self, key):
        keys = self._keys()
        if key not in keys:
            raise KeyError(key)
        opt = self._opt()
        if key == "step":
            return torch.tensor(float(opt._step_count(self._p)), dtype=torch.float32)
        return opt._moment(self._p, keys.index(key) - 1)

    def __iter__(self):
        return iter(self._keys())

    def __len__(self):
        return len(self._keys())

    def __repr__(self):
        return f"<lowbit state of a param: {', '.join(self._keys())}>"


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


class _OneBitBase(_AdamBase):
    """What OneBitAdam, ZeroOneAdam and OneBitLamb share: one device, a
    communicator over a torch.distributed ProcessGroup (or a given
    :class:`lowbit.Communicator`), the DDP comm hook's switch, the status of
    the schedules, and per-rank state dicts that carry the communicator's
    error buffers."""

    def __init__(self, params, lr, betas, eps, weight_decay, *, freeze_step, process_group=None,
                 communicator=None, onebit_options=None, **kwargs):
        if communicator is not None and process_group is not None:
            raise ValueError("give process_group or communicator, not both")
        options = check_onebit_options(dict(onebit_options or {}))
        super().__init__(params, lr, betas, eps, weight_decay, **kwargs)
        self.freeze_step = int(freeze_step)
        self._config["freeze_step"] = self.freeze_step
        self._onebit_options = options
        self._comm = communicator if communicator is not None else process_group_communicator(process_group)
        self._process_group = process_group
        self._warmup_averaged_by_caller = False  # onebit_ddp_comm_hook: DDP averages the gradients
        self._generation = 0  # steps and loads so far: the cached status below is of one generation
        self._status_cache = None  # (generation, next_full_average)

    @property
    def communicator(self):
        return self._comm

    @property
    def onebit_options(self) -> dict:
        """The lowbit_onebit_options_t values this optimizer gives the
        library (0/1 Adam's schedules, 1-bit LAMB's coefficients; empty for
        1-bit Adam), by DeepSpeed's names."""
        return dict(self._onebit_options)

    def step(self, closure=None):
        errors = getattr(self._comm, "_transport_errors", None)
        if errors:
            errors.clear()
        try:
            return super().step(closure)
        except CommunicationError as e:
            if errors:  # the torch.distributed transport raised: chain its exception
                raise e from errors[0]
            raise
        finally:
            self._generation += 1

    def _device_state(self, device):
        fresh = _device_key(device) not in self._devices
        if fresh and self._devices:
            raise ValueError(f"{type(self).__name__} keeps all params on one device; a param is on {device}, "
                             f"others on {next(iter(self._devices))}")
        dev = super()._device_state(device)
        if fresh:
            dev.handle.set_comm(self._comm)
            dev.handle.set_onebit_warmup_average(not self._warmup_averaged_by_caller)
            if self._onebit_options:
                dev.handle.set_onebit_options(**self._onebit_options)
        return dev

    def _warmup_averaged_by(self, caller: bool) -> None:
        self._warmup_averaged_by_caller = bool(caller)
        for dev in self._devices.values():
            dev.handle.set_onebit_warmup_average(not caller)

    def _handle(self):
        """The lowbit handle (None before the first step registers the params)."""
        for dev in self._devices.values():
            if dev.params:
                return dev.handle
        return None

    def steps_taken(self) -> int:
        """Steps the library applied (skipped steps do not count)."""
        handle = self._handle()
        return handle.param_info(0).step if handle is not None else 0

    def onebit_status(self):
        """Where the optimizer stands (a :class:`lowbit.OneBitStatus`: step
        count, phase, whether the next step runs on averaged gradients, the
        next step's exchange, 0/1 Adam's schedules); None before the first
        step."""
        handle = self._handle()
        return handle.onebit_status() if handle is not None else None

    def _first_step_averaged(self) -> bool:
        """Whether step 1 runs on averaged gradients (asked before the params
        are registered, i.e. during the first backward)."""
        return True

    def _next_full_average(self) -> bool:
        """Whether the next step runs on gradients averaged uncompressed
        (onebit_ddp_comm_hook asks it for every bucket: the library is asked
        once per step)."""
        cached = self._status_cache
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        status = self.onebit_status()
        value = status.next_full_average if status is not None else self._first_step_averaged()
        self._status_cache = (self._generation, value)
        return value

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["lowbit"]["comm_errors"] = torch.frombuffer(bytearray(self._comm.save_errors()), dtype=torch.uint8)
        sd["lowbit"]["rank"] = self._comm.rank
        sd["lowbit"]["world_size"] = self._comm.world_size
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        lowbit = state_dict.get("lowbit") or {}
        blob = lowbit.get("comm_errors")
        for key, mine in (("rank", self._comm.rank), ("world_size", self._comm.world_size)):
            if key in lowbit and lowbit[key] != mine:
                raise StateMismatchError(f"this state dict was saved by {key} {lowbit[key]}, this optimizer's "
                                         f"{key} is {mine}: {type(self).__name__}'s error buffers are per rank")
        old = self._comm.save_errors()
        if blob is not None:
            self._comm.load_errors(bytes(blob.cpu().numpy().tobytes()))
        try:
            super().load_state_dict(state_dict)
        except BaseException:
            self._comm.load_errors(old)
            raise
        finally:
            self._generation += 1


class OneBitAdam(_OneBitBase):
    """1-bit Adam (Tang et al. 2021) for data-parallel training under
    ``torchrun``: every rank steps the same model; the optimizer does the
    communication over a torch.distributed ProcessGroup (gloo on CPU, NCCL on
    GPU; default: the world group), or over a given :class:`lowbit.Communicator`.

    - Warm-up (steps 1 .. freeze_step - 1 of the library's count, i.e. while
      the step count is below ``freeze_step``): the gradients of all params,
      fused into one buffer, are averaged uncompressed over the ranks and an
      AdamW step runs on the average (as DDP + AdamW would).
    - Compressed stage: the variance is frozen; each rank's local momentum is
      averaged with the 1-bit compressed all-reduce (error feedback) and the
      update uses it: about 1/32 of the bytes of an fp32 all-reduce.

    Bias correction is AdamW's (both terms), also after the freeze (the
    frozen variance keeps the correction of its last warm-up step count).
    Use it with DDP through :func:`onebit_ddp_comm_hook`, which stops DDP's
    own gradient all-reduce (the optimizer does it). The communicator's error
    buffers are this rank's: ``state_dict()`` carries them (``"lowbit"``
    ``"comm_errors"``), so save one state dict per rank; loading it on the
    same rank of the same world size resumes bit for bit.
    All params must be on one device."""

    _algorithm = Algorithm.ONEBIT_ADAM

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, freeze_step=100,
                 process_group=None, communicator=None, **kwargs):
        if int(freeze_step) < 1:
            raise ValueError(f"freeze_step={freeze_step} must be >= 1")
        super().__init__(params, lr, betas, eps, weight_decay, freeze_step=freeze_step, process_group=process_group,
                         communicator=communicator, **kwargs)


def _refuse_bias_correction(value, where="bias_correction"):
    """0/1 Adam and 1-bit LAMB have no bias correction (DeepSpeed's take the
    flag and ignore it); lowbit refuses bias_correction=True."""
    if value:
        raise ValueError(f"{where}=True is not supported: 0/1 Adam and 1-bit LAMB have no bias correction "
                         "(DeepSpeed's ZeroOneAdam and OnebitLamb ignore the flag)")


class ZeroOneAdam(_OneBitBase):
    """0/1 Adam (Lu et al. 2022; DeepSpeed's ``ZeroOneAdam`` and its
    hyper-parameter names) for data-parallel training under ``torchrun``,
    over a torch.distributed ProcessGroup like :class:`OneBitAdam`.

    - Phase 1 (step t <= ``var_freeze_step``): on variance steps (t a
      multiple of the variance interval, which starts at 1 and doubles after
      every ``var_update_scaler`` variance steps) the gradients are averaged
      uncompressed and m and v take an Adam step; on the other steps the
      gradient goes through the 1-bit compressed all-reduce and only m moves.
    - Phase 2 (t > ``var_freeze_step``, v frozen): local steps on this rank's
      own gradient, no communication; every ``local_step_interval`` steps
      (1 at first, doubling every ``local_step_scaler`` phase-2 steps, at most
      ``local_step_clipper``) the ranks average their updates since the last
      synchronisation with the 1-bit all-reduce, and every rank ends with the
      same params. Between synchronisations the ranks' params differ.

    No bias correction; the weight decay is AdamW's (decoupled) form.
    With DDP use :func:`onebit_ddp_comm_hook`: it lets DDP average the
    gradients of the variance steps (fp32, overlapped with backward) and
    leaves them local otherwise. State dicts are per rank (they carry the
    communicator's error buffers). All params must be on one device."""

    _algorithm = Algorithm.ZEROONE_ADAM

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, var_freeze_step=100000,
                 var_update_scaler=16, local_step_scaler=32678, local_step_clipper=16, bias_correction=False,
                 process_group=None, communicator=None, **kwargs):
        _refuse_bias_correction(bias_correction)
        if int(var_freeze_step) < 0:
            raise ValueError(f"var_freeze_step={var_freeze_step} must be >= 0")
        options = dict(var_update_scaler=var_update_scaler, local_step_scaler=local_step_scaler,
                       local_step_clipper=local_step_clipper)
        for name, value in options.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        super().__init__(params, lr, betas, eps, weight_decay, freeze_step=var_freeze_step,
                         process_group=process_group, communicator=communicator, onebit_options=options,
                         bias_correction=False, **kwargs)

    @property
    def var_freeze_step(self) -> int:
        return self.freeze_step

    def _check_group(self, group):
        super()._check_group(group)
        _refuse_bias_correction(group.get("bias_correction"), "param group bias_correction")

    def _first_step_averaged(self) -> bool:
        return self.freeze_step >= 1  # step 1 is a variance step of phase 1

    def _plan_torch_import(self, state, by_index, saved_groups):
        raise ValueError("ZeroOneAdam loads only its own state_dict() (per rank): its state (schedules, the "
                         "params at the last synchronisation) has no torch.optim counterpart")


class OneBitLamb(_OneBitBase):
    """1-bit LAMB (Li et al. 2021; DeepSpeed's ``OnebitLamb`` and its
    hyper-parameter names) for data-parallel training under ``torchrun``,
    over a torch.distributed ProcessGroup like :class:`OneBitAdam`.

    - Warm-up (steps t <= ``freeze_step``): LAMB on the gradients averaged
      uncompressed: Adam's moments without bias correction, update u = m / D
      + weight_decay p, per-tensor trust ratio ||p|| / ||u|| clipped to
      [``min_coeff``, ``max_coeff``], whose EMA (``coeff_beta``) is recorded.
    - Compression (t > ``freeze_step``): v and the trust ratio's EMA are
      frozen; each rank's momentum, rescaled per tensor to a common RMS, is
      averaged by one 1-bit compressed all-reduce over all params; the
      coefficient is the frozen ratio times a factor (from a fresh variance
      of the reconstructed gradients) clipped to [``factor_min``,
      ``factor_max``] and to a relative change of ``factor_threshold`` per
      step.

    With DDP use :func:`onebit_ddp_comm_hook` (DDP averages the warm-up
    gradients; afterwards they stay local). State dicts are per rank (they
    carry the communicator's error buffers). All params must be on one device."""

    _algorithm = Algorithm.ONEBIT_LAMB

    def __init__(self, params, lr=1e-3, freeze_step=100000, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9, factor_max=4.0, factor_min=0.5,
                 factor_threshold=0.1, bias_correction=False, process_group=None, communicator=None, **kwargs):
        _refuse_bias_correction(bias_correction)
        if int(freeze_step) < 1:
            raise ValueError(f"freeze_step={freeze_step} must be >= 1 (the warm-up is steps 1..freeze_step)")
        options = dict(max_coeff=max_coeff, min_coeff=min_coeff, coeff_beta=coeff_beta, factor_max=factor_max,
                       factor_min=factor_min, factor_threshold=factor_threshold)
        try:
            options = {k: float(v) for k, v in options.items()}
        except (TypeError, ValueError):
            raise ValueError(f"1-bit LAMB options must be real numbers: {options}") from None
        if not 0 < options["min_coeff"] < options["max_coeff"]:
            raise ValueError(f"need 0 < min_coeff < max_coeff (min_coeff={min_coeff}, max_coeff={max_coeff})")
        if not 0 <= options["coeff_beta"] < 1:
            raise ValueError(f"coeff_beta={coeff_beta} must be in [0, 1)")
        if not 0 < options["factor_min"] <= options["factor_max"]:
            raise ValueError(f"need 0 < factor_min <= factor_max (factor_min={factor_min}, "
                             f"factor_max={factor_max})")
        if not 0 <= options["factor_threshold"] < 1:
            raise ValueError(f"factor_threshold={factor_threshold} must be in [0, 1)")
        super().__init__(params, lr, betas, eps, weight_decay, freeze_step=freeze_step,
                         process_group=process_group, communicator=communicator, onebit_options=options,
                         bias_correction=False, **kwargs)

    def _check_group(self, group):
        super()._check_group(group)
        _refuse_bias_correction(group.get("bias_correction"), "param group bias_correction")

    def _plan_torch_import(self, state, by_index, saved_groups):
        raise ValueError("OneBitLamb loads only its own state_dict() (per rank): its state (the frozen trust "
                         "ratios, the fresh variance) has no torch.optim counterpart")


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

    def _num_moments(self, group) -> int:
        return 1 if self._f(group["momentum"]) != 0 else 0

    def _hparams(self, group):
        return dict(lr=self._f(group["lr"]), momentum=self._f(group["momentum"]),
                    dampening=self._f(group["dampening"]), weight_decay=self._f(group["weight_decay"]),
                    nesterov=bool(group["nesterov"]))


"""Torch tensors as the library sees them: descriptors without copies or
DLPack round trips, DTensor shards, device keys, and the per-device state of
a lowbit.torch optimizer (:class:`_DeviceState`)."""

from __future__ import annotations

import operator
import sys

import torch

from .._arrays import ArrayRef, TensorArray
from .._ffi import Device, Dtype
from .._errors import ArrayError

_TORCH_DTYPES = {torch.float32: Dtype.FLOAT32, torch.bfloat16: Dtype.BFLOAT16, torch.float16: Dtype.FLOAT16}
_DTYPE_CODES = {k: int(v) for k, v in _TORCH_DTYPES.items()}
_GRAD_META = operator.attrgetter("layout", "dtype", "device")


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


def _tensor_ref(t: torch.Tensor, role: str, registered: bool = False) -> ArrayRef:
    """Describe a torch tensor for the library (no copy, no DLPack round trip).
    `registered`: the library keeps the address (a param): the ref carries a
    probe of where `t`'s memory is now, so that lowbit.Optimizer's steps
    refuse it once its storage was replaced or resized (ArrayRef.moved)."""
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
    probe = (lambda: (t.data_ptr(), t.numel())) if registered else None
    return ArrayRef(t.data_ptr(), tuple(t.shape), dtype, device, index, t, probe)


def moved_error(p: torch.Tensor, registered_numel: int) -> RuntimeError:
    """The error of a step that finds a registered param's memory moved."""
    size = "" if p.numel() == registered_numel else f", {p.numel()} elements where {registered_numel} were registered"
    return RuntimeError(
        f"param {tuple(p.shape)} of this optimizer moved in memory{size} (was its .data replaced or resized, or the "
        "model moved to another device after the optimizer was built?); nothing was stepped; build the optimizer "
        "after moving the model")


def _dense_grad(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The gradient a step reads: ``g`` itself when dense, else for a
    ``torch.sparse_coo`` gradient (``nn.Embedding(sparse=True)``) a new dense
    tensor holding it (zeros in the rows it has no entries for, duplicate
    entries summed, as ``g.to_dense()``), which the caller drops as soon as
    the step that reads it is done. The step is then the optimizer's usual
    step on the dense gradient, bit for bit: every element is updated
    (weight decay and the moments' decay included), not only the rows
    present; this is not torch.optim.SparseAdam. Other layouts (CSR, ...)
    raise, naming the param."""
    layout = g.layout
    if layout is torch.strided:
        return g
    if layout is torch.sparse_coo:
        if tuple(g.shape) != tuple(p.shape):
            raise ArrayError(f"grad of param {tuple(p.shape)}: the sparse gradient has shape {tuple(g.shape)}")
        return g.to_dense()
    raise ArrayError(f"grad of param {tuple(p.shape)}: {layout} gradients are not supported (dense or "
                     "torch.sparse_coo gradients, which are densified for the step)")


def _nonfinite_values(g: torch.Tensor) -> torch.Tensor:
    """The values whose finiteness is the gradient's: g itself, or the
    summed entries of a sparse COO gradient (the other elements are 0)."""
    return g.coalesce().values() if g.layout is torch.sparse_coo else g


class _DeviceState:
    """One lowbit handle and the torch params registered in it, in id order,
    and the grad descriptors its steps take (a TensorArray reused from step
    to step, filled through its record view)."""

    def __init__(self, handle, device: torch.device):
        self.handle = handle
        self.device = device
        self.params: list = []
        self.ptrs: list = []
        self.pushed: list = []  # per group: the hparams tuple last given to the library
        self.lr_views = None  # per group: a tensor over the engine's lr (_step_captured)
        self.grads = None  # TensorArray of the grads, reused every step
        self.view = None  # its records
        self.numels: list = []  # per param
        self.grad_meta = None  # (layout, dtype, device) of each grad in `grads` (None: unknown)
        self.cuda_index = device.index if device.type == "cuda" else None
        self.grad_device = torch.device(_device_key(device))  # with its index on CUDA
        self.dtensor = False  # some params are DTensors: the library steps their local shards
        self.dense_grads = None  # the dense forms of this step's sparse grads (fill_grads_checked), until stepped

    def check_unmoved(self, indices=None) -> None:
        """Raises (moved_error) unless every registered param (those at
        `indices`, the library's ids) still holds the memory registered
        with the library: the address and the element count."""
        params, ptrs, numels = self.params, self.ptrs, self.numels
        for i in range(len(params)) if indices is None else indices:
            p = _local(params[i]) if self.dtensor else params[i]
            if p.data_ptr() != ptrs[i] or p.numel() != numels[i]:
                raise moved_error(p, numels[i])

    def local_params(self) -> list:
        return [_local(p) for p in self.params] if self.dtensor else self.params

    def local_grads(self) -> list:
        if self.dtensor:
            return [None if p.grad is None else _local(p.grad) for p in self.params]
        return [p.grad for p in self.params]

    def resize(self, n: int) -> None:
        """(Re)allocate the grad descriptors for n params; the numel and
        device fields never change for a param."""
        self.grads = TensorArray(n)
        self.view = self.grads.records
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

    def fill_grads_checked(self, params: list, grads: list) -> bool:
        """The per-param path: checks that no param moved and each grad (the
        culprit named), fills its descriptor (None: the param sits this step
        out). A torch.sparse_coo grad is densified (_dense_grad) and its
        dense form kept in ``dense_grads`` until the caller has stepped and
        drops it. Returns whether any param has a grad."""
        self.grad_meta = None  # the dtypes are written here, one by one
        self.dense_grads = None
        any_grad = False
        for i, (p, g) in enumerate(zip(params, grads)):
            if p.data_ptr() != self.ptrs[i] or p.numel() != self.numels[i]:
                raise moved_error(p, self.numels[i])
            if g is None:
                self.grads.clear(i)
                continue
            if g.device != p.device:
                raise ArrayError(f"grad of param {tuple(p.shape)} is on {g.device} but the param is on {p.device}")
            if g.layout is not torch.strided:
                # a sparse gradient: densified here, kept (dense_grads) until
                # the step that reads it is done, then dropped by the caller
                g = _dense_grad(g, p)
                if self.dense_grads is None:
                    self.dense_grads = []
                self.dense_grads.append(g)
            if g.numel() != p.numel():
                raise ArrayError(f"grad of param {tuple(p.shape)} has {g.numel()} elements, the param "
                                 f"{p.numel()}")
            self.grads.set(i, _tensor_ref(g, "grad"))
            any_grad = True
        return any_grad

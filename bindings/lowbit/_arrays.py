"""Turning caller arrays into lowbit_tensor_t descriptors, without copies.

Accepted:
  * numpy arrays (host memory): float32, float16, bfloat16 (the ``bfloat16``
    dtype of ml_dtypes, or of any package registering a numpy dtype of that
    name), and uint16 arrays holding bfloat16/float16 bits when the caller says
    so with ``dtype="bfloat16"`` / ``dtype="float16"``;
  * any object with ``__dlpack__`` (torch, cupy, jax, numpy, ...) on the CPU
    or on a CUDA device;
  * any object with ``__cuda_array_interface__`` (numba, cupy, torch) on a
    CUDA device.

Rejected, with an ArrayError naming the argument: other dtypes, an array on
another device than the optimizer's, non-contiguous arrays, read-only arrays
where the library writes (params), arrays the producer could only export as a
copy, and unknown objects. Nothing is ever copied or converted.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p

from . import _cuda
from ._errors import ArrayError
from ._ffi import Device, Dtype, Tensor, ffi

try:  # numpy is a hard dependency of the package, but keep import errors readable
    import numpy as np
except ImportError as _e:  # pragma: no cover
    raise ImportError("lowbit needs numpy (pip install numpy)") from _e

DTYPE_NAMES = {Dtype.FLOAT32: "float32", Dtype.BFLOAT16: "bfloat16", Dtype.FLOAT16: "float16"}
_DTYPE_BY_NAME = {
    "float32": Dtype.FLOAT32,
    "fp32": Dtype.FLOAT32,
    "bfloat16": Dtype.BFLOAT16,
    "bf16": Dtype.BFLOAT16,
    "float16": Dtype.FLOAT16,
    "fp16": Dtype.FLOAT16,
    "half": Dtype.FLOAT16,
}
_ACCEPTED = "float32, float16 or bfloat16"


def parse_dtype(dtype) -> Dtype | None:
    """A lowbit Dtype from a name, a Dtype, a numpy dtype or a torch dtype."""
    if dtype is None:
        return None
    if isinstance(dtype, Dtype):
        return dtype
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if name is None:  # torch.dtype has no .name
        name = str(dtype).replace("torch.", "")
    name = str(name).lower()
    if name in _DTYPE_BY_NAME:
        return _DTYPE_BY_NAME[name]
    raise ArrayError(f"dtype={dtype!r} is not one of {_ACCEPTED}")


def device_string(device: Device, index: int) -> str:
    return "cpu" if device == Device.CPU else f"cuda:{index}"


_new = ffi.new
_cast = ffi.cast


class ArrayRef:
    """A validated array: its lowbit_tensor_t descriptor (``desc``, a cffi
    ``lowbit_tensor_t *``) plus what keeps the memory alive (``owner``).

    ``probe``: for arrays whose owner can swap its memory after registration
    (a torch tensor: ``t.data = ...``, ``t.resize_()``), a function giving
    the owner's (address, numel) now; None for arrays that cannot move."""

    __slots__ = ("desc", "numel", "shape", "owner", "dtype", "device", "device_index", "probe", "_registered")

    def __init__(self, data, shape, dtype, device, device_index, owner, probe=None):
        numel = 1
        for d in shape:
            numel *= int(d)
        self.desc = describe(_new("lowbit_tensor_t *"), data, numel, dtype, device, device_index)
        self.numel = numel
        self.shape = tuple(int(d) for d in shape)
        self.dtype = Dtype(dtype)
        self.device = Device(device)
        self.device_index = int(device_index)
        self.owner = owner
        self.probe = probe
        self._registered = (int(_cast("uintptr_t", self.desc.data)), numel)  # what moved() compares probe() with

    @property
    def tensor(self):
        """The descriptor as a ctypes lowbit_tensor_t (a copy), for code that
        keeps descriptor arrays in ctypes memory."""
        return Tensor.from_buffer_copy(ffi.buffer(self.desc))

    def moved(self) -> str | None:
        """Why the owner no longer holds the registered memory (its storage
        was replaced or resized since), or None while it does."""
        if self.probe is None:
            return None
        now = self.probe()
        if now == self._registered:
            return None
        data, numel = now
        registered = self._registered[0]
        return (f"it held {self.numel} elements at {registered:#x} when registered and now holds {numel} at "
                f"{data:#x} (its storage was replaced or resized, e.g. `t.data = ...` or `t.resize_()`)")


def describe(desc, data, numel, dtype, device, device_index):
    """Fill the lowbit_tensor_t `desc` (a cffi pointer or array element):
    the one place the package writes a tensor descriptor field by field
    (TensorArray's records view the same layout)."""
    desc.data = _cast("void *", data or 0)
    desc.numel = int(numel)
    desc.dtype = int(dtype)
    desc.device = int(device)
    desc.device_index = int(device_index)
    return desc


def _tensor_record_dtype():
    """A numpy record dtype laid out as lowbit_tensor_t (from the declarations),
    to fill many descriptors with one vectorised assignment per field."""
    tp = ffi.typeof("lowbit_tensor_t")
    names, formats, offsets = [], [], []
    for name, f in tp.fields:
        size = ffi.sizeof(f.type)
        names.append(name)
        formats.append(np.uintp if f.type.kind == "pointer" else {1: "i1", 2: "i2", 4: "i4", 8: "i8"}[size])
        offsets.append(f.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": ffi.sizeof(tp)})


TENSOR_RECORD = _tensor_record_dtype()


class TensorArray:
    """``n`` lowbit_tensor_t descriptors in one cffi allocation, made once
    and reused from step to step: ``cdata`` (a ``lowbit_tensor_t[n]``, what
    lowbit_optimizer_step_with_grads takes) and ``records``, a numpy record
    view of the same memory (fields data, numel, dtype, device,
    device_index) for vectorised fills."""

    __slots__ = ("cdata", "records", "n")

    def __init__(self, n: int):
        self.n = int(n)
        self.cdata = _new("lowbit_tensor_t[]", max(self.n, 1))
        self.records = np.frombuffer(ffi.buffer(self.cdata), dtype=TENSOR_RECORD, count=max(self.n, 1))[: self.n]

    def __len__(self):
        return self.n

    def clear(self, i: int) -> None:
        """Descriptor i: no tensor (data NULL)."""
        self.cdata[i].data = ffi.NULL

    def set(self, i: int, ref: ArrayRef) -> None:
        """Descriptor i: the array `ref` describes."""
        self.cdata[i] = ref.desc[0]


# ----------------------------------------------------------------- reuse


def fingerprint(obj):
    """Where and how an array's memory is now, read cheaply (about a
    microsecond): its type, address, dtype, shape and strides (and device),
    for a numpy array or a torch tensor; None for any other array, which has
    no cheap one. Equal fingerprints mean the same lowbit_tensor_t
    descriptor, so that a descriptor made once can be reused while the
    arrays passed keep their memory and layout (lowbit.Optimizer.step(grads)),
    and is made again as soon as one is replaced, reshaped or reallocated."""
    if type(obj) is np.ndarray:
        try:
            address = _from_buffer(obj)  # compares by address with the pointer kept below
        except (TypeError, ValueError, BufferError):
            return None
        return address, obj.dtype, obj.shape, obj.strides
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr) and hasattr(obj, "untyped_storage"):  # a torch tensor
        return data_ptr(), obj.dtype, tuple(obj.shape), obj.stride(), obj.device
    return None


def kept_fingerprint(obj):
    """fingerprint(obj) as a cache keeps it, holding no reference to the
    array or its memory: the numpy address as a plain pointer
    (ffi.from_buffer's cdata keeps the array alive)."""
    fp = fingerprint(obj)
    if fp is not None and type(obj) is np.ndarray:
        fp = (_cast("char *", fp[0]),) + fp[1:]
    return fp


_from_buffer = ffi.from_buffer


def _kind(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _is_c_contiguous(shape, strides_elems) -> bool:
    """strides in elements; dims of extent 1 may carry any stride."""
    if strides_elems is None:
        return True
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides_elems)):
        if extent == 0:
            return True
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _check_device(role, device, index, want_device, want_index, what):
    if want_device is None:
        return
    if device != want_device or (device == Device.CUDA and want_index is not None and index != want_index):
        raise ArrayError(
            f"{role}: {what} is on {device_string(device, index)} but the optimizer is on "
            f"{device_string(want_device, want_index or 0)}; lowbit never moves or copies arrays"
        )


# ----------------------------------------------------------------- numpy


def _numpy_dtype(role, arr, dtype: Dtype | None) -> Dtype:
    dt = arr.dtype
    if dt.name == "bfloat16" and dt.itemsize == 2:
        native = Dtype.BFLOAT16
    elif dt == np.float32:
        native = Dtype.FLOAT32
    elif dt == np.float16:
        native = Dtype.FLOAT16
    elif dt == np.uint16:
        if dtype in (Dtype.BFLOAT16, Dtype.FLOAT16):
            return dtype
        raise ArrayError(
            f"{role}: a uint16 array is only accepted as raw 16-bit float bits with an explicit "
            "dtype='bfloat16' or dtype='float16'"
        )
    else:
        hint = ""
        if dt == np.float64:
            hint = " (float64 is not supported; keep the array in float32 - lowbit never converts it for you)"
        raise ArrayError(f"{role}: numpy dtype {dt} is not {_ACCEPTED}{hint}")
    if dtype is not None and dtype != native:
        raise ArrayError(f"{role}: dtype={DTYPE_NAMES[dtype]} was requested but the array is {dt}")
    return native


def _from_numpy(role, arr, writable, dtype, want_device, want_index):
    _check_device(role, Device.CPU, 0, want_device, want_index, "the numpy array")
    ldt = _numpy_dtype(role, arr, dtype)
    if not arr.flags.c_contiguous:
        raise ArrayError(f"{role}: the array is not C-contiguous (strides {arr.strides}); pass a contiguous array")
    if not arr.flags.aligned:
        raise ArrayError(f"{role}: the array's data is not aligned to its element size")
    if writable and not arr.flags.writeable:
        raise ArrayError(f"{role}: the array is read-only, but lowbit updates it in place")
    data = arr.__array_interface__["data"][0]
    return ArrayRef(data, arr.shape, ldt, Device.CPU, 0, arr)


# ----------------------------------------------------------------- DLPack

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm", 13: "cuda_managed"}
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4
DLPACK_FLAG_READ_ONLY = 1 << 0
DLPACK_FLAG_IS_COPIED = 1 << 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
        ("flags", c_uint64),
        ("dl_tensor", DLTensor),
    ]


_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]


def _dl_dtype(role, dt: DLDataType) -> Dtype:
    key = (dt.code, dt.bits, dt.lanes)
    if key == (kDLFloat, 32, 1):
        return Dtype.FLOAT32
    if key == (kDLFloat, 16, 1):
        return Dtype.FLOAT16
    if key == (kDLBfloat, 16, 1):
        return Dtype.BFLOAT16
    code = {kDLInt: "int", kDLUInt: "uint", kDLFloat: "float", kDLBfloat: "bfloat"}.get(dt.code, f"code{dt.code}")
    lanes = f"x{dt.lanes}" if dt.lanes != 1 else ""
    raise ArrayError(f"{role}: dtype {code}{dt.bits}{lanes} is not {_ACCEPTED}")


def _export_dlpack(role, obj, stream):
    """Call obj.__dlpack__ asking for no copy (DLPack >= 1.0), falling back to
    the legacy signature for older producers."""
    kwargs = {"stream": stream} if stream is not None else {}
    try:
        return obj.__dlpack__(max_version=(1, 0), copy=False, **kwargs)
    except TypeError:
        pass  # producer predates DLPack 1.0 keywords
    except (BufferError, ValueError, RuntimeError) as e:
        raise ArrayError(f"{role}: {_kind(obj)} could not be exported without a copy through DLPack: {e}") from e
    try:
        return obj.__dlpack__(**kwargs)
    except (BufferError, ValueError, RuntimeError, TypeError) as e:
        raise ArrayError(f"{role}: {_kind(obj)} could not be exported through DLPack: {e}") from e


def _from_dlpack(role, obj, writable, dtype, want_device, want_index, stream):
    dev_type, dev_id = None, None
    if hasattr(obj, "__dlpack_device__"):
        dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
        dev = _dl_device(role, obj, dev_type, dev_id)
        _check_device(role, dev[0], dev[1], want_device, want_index, f"the {_kind(obj)}")
    if _is_immutable_array(obj) and writable:
        raise ArrayError(
            f"{role}: {_kind(obj)} is immutable and cannot be updated in place (use lowbit.jax for JAX arrays)"
        )
    cuda = dev_type in (kDLCUDA, kDLCUDAManaged)
    export_stream = None
    if cuda:
        # DLPack: 1 is the legacy default stream; None means the same thing.
        export_stream = stream if stream not in (None, 0) else 1
    capsule = _export_dlpack(role, obj, export_stream)
    flags = 0
    if _PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = DLManagedTensorVersioned.from_address(_PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
        if managed.version.major != 1:
            raise ArrayError(f"{role}: DLPack version {managed.version.major}.{managed.version.minor} is not supported")
        flags = managed.flags
        t = managed.dl_tensor
    elif _PyCapsule_IsValid(capsule, b"dltensor"):
        t = DLManagedTensor.from_address(_PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        raise ArrayError(f"{role}: {_kind(obj)}.__dlpack__() did not return an unconsumed DLPack capsule")
    device, index = _dl_device(role, obj, t.device.device_type, t.device.device_id)
    _check_device(role, device, index, want_device, want_index, f"the {_kind(obj)}")
    if flags & DLPACK_FLAG_IS_COPIED:
        raise ArrayError(f"{role}: {_kind(obj)} was exported as a copy; lowbit needs the array's own memory")
    if writable and flags & DLPACK_FLAG_READ_ONLY:
        raise ArrayError(f"{role}: the {_kind(obj)} is read-only, but lowbit updates it in place")
    ldt = _dl_dtype(role, t.dtype)
    if dtype is not None and dtype != ldt:
        raise ArrayError(f"{role}: dtype={DTYPE_NAMES[dtype]} was requested but the array is {DTYPE_NAMES[ldt]}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    if not _is_c_contiguous(shape, strides):
        raise ArrayError(f"{role}: the {_kind(obj)} is not contiguous (shape {shape}, strides {strides})")
    data = (t.data or 0) + t.byte_offset
    # The capsule (still named "dltensor"/"dltensor_versioned", i.e. not
    # consumed) owns a reference to the memory; its destructor calls the
    # producer's deleter. Keeping it alive keeps the memory alive, unless the
    # producer can swap an array's memory under it (torch), see _pin.
    pinned, probe = _pin(obj)
    return ArrayRef(data, shape, ldt, device, index, (obj, capsule) + pinned, probe)


def _pin(obj):
    """(what keeps the memory alive besides the capsule, a probe of where the
    array's memory is now) for producers whose arrays can change their
    memory after export: a torch tensor's capsule holds the tensor, not its
    storage, so ``t.data = ...`` or ``t.resize_()`` would free the exported
    memory. Its storage is held too (the memory stays valid) and the probe
    lets the optimizer see the move (ArrayRef.moved)."""
    storage = getattr(obj, "untyped_storage", None)
    data_ptr, numel = getattr(obj, "data_ptr", None), getattr(obj, "numel", None)
    if not (callable(storage) and callable(data_ptr) and callable(numel)):
        return (), None
    return (storage(),), lambda: (data_ptr(), numel())


def _dl_device(role, obj, dev_type, dev_id):
    if dev_type in (kDLCPU, kDLCUDAHost):
        return Device.CPU, 0
    if dev_type in (kDLCUDA, kDLCUDAManaged):
        return Device.CUDA, int(dev_id)
    name = _DL_DEVICE_NAMES.get(dev_type, f"device type {dev_type}")
    raise ArrayError(f"{role}: the {_kind(obj)} is on {name}:{dev_id}; lowbit supports cpu and cuda")


def _is_immutable_array(obj) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("jax") or mod.startswith("jaxlib")


# ----------------------------------------------------------------- __cuda_array_interface__

_CAI_TYPESTR = {"<f4": Dtype.FLOAT32, "<f2": Dtype.FLOAT16, "=f4": Dtype.FLOAT32, "=f2": Dtype.FLOAT16}


def _from_cai(role, obj, writable, dtype, want_device, want_index, stream):
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    index = _cuda.pointer_device(ptr)
    if index is None:
        index = want_index if want_index is not None else 0
    _check_device(role, Device.CUDA, index, want_device, want_index, f"the {_kind(obj)}")
    typestr = cai["typestr"]
    if typestr in _CAI_TYPESTR:
        ldt = _CAI_TYPESTR[typestr]
    elif typestr in ("<u2", "=u2") and dtype in (Dtype.BFLOAT16, Dtype.FLOAT16):
        ldt = dtype
    else:
        raise ArrayError(f"{role}: __cuda_array_interface__ typestr {typestr!r} is not {_ACCEPTED}")
    if dtype is not None and dtype != ldt:
        raise ArrayError(f"{role}: dtype={DTYPE_NAMES[dtype]} was requested but the array is {DTYPE_NAMES[ldt]}")
    if writable and readonly:
        raise ArrayError(f"{role}: the {_kind(obj)} is read-only, but lowbit updates it in place")
    shape = tuple(int(d) for d in cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        item = 4 if ldt == Dtype.FLOAT32 else 2
        if any(s % item for s in strides):
            raise ArrayError(f"{role}: the {_kind(obj)} has strides {tuple(strides)} that are not whole elements")
        strides = tuple(int(s) // item for s in strides)
    if not _is_c_contiguous(shape, strides):
        raise ArrayError(f"{role}: the {_kind(obj)} is not contiguous (shape {shape}, strides {cai.get('strides')})")
    # CAI v3: work producing the data may still be pending on cai["stream"];
    # make the consumer's stream wait for it (enqueued, no host sync).
    producer = cai.get("stream")
    if producer is not None and ptr:
        _cuda.stream_wait(consumer=stream, producer=int(producer), device_index=index)
    return ArrayRef(ptr or 0, shape, ldt, Device.CUDA, index, obj)


# ----------------------------------------------------------------- entry point


def as_array_ref(
    obj,
    *,
    role: str,
    writable: bool,
    dtype=None,
    device: Device | None = None,
    device_index: int | None = None,
    stream: int | None = None,
) -> ArrayRef:
    """Validate `obj` and describe it for the library, or raise ArrayError.

    role: how the argument is named in messages ("param", "grad", "grads[3]").
    writable: the library writes it (params); read-only arrays are rejected.
    dtype: optional expected dtype (required to pass uint16 bit patterns).
    device/device_index: where the optimizer lives; other devices are rejected.
    stream: the CUDA stream (int) the library will use, for producer sync.
    """
    want = parse_dtype(dtype)
    if isinstance(obj, np.ndarray):
        return _from_numpy(role, obj, writable, want, device, device_index)
    if isinstance(obj, np.generic):
        raise ArrayError(f"{role}: a numpy scalar has no memory to update; pass an array")
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(role, obj, writable, want, device, device_index, stream)
    if hasattr(type(obj), "__cuda_array_interface__") or hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(role, obj, writable, want, device, device_index, stream)
    raise ArrayError(
        f"{role}: {_kind(obj)} is not an array lowbit can use; pass a numpy array (host) or an object with "
        "__dlpack__ or __cuda_array_interface__ (torch, cupy, jax, numba)"
    )

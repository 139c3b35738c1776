"""The compressed communicator (lowbit_comm.h): 1-bit allreduce with error
feedback over MPI (mpi4py communicators) or NCCL."""

from __future__ import annotations

import ctypes
import weakref
from ctypes import byref, c_float, c_int32, c_int64, c_void_p

import numpy as np

from . import _capi
from ._arrays import ArrayRef, as_array_ref
from ._capi import CommBackend, CommCudaAware, Device, Dtype
from ._lib import LIB, ArrayError, InvalidArgumentError, InvalidStateError, call
from ._optimizer import stream_pointer

_CUDA_AWARE = {"auto": CommCudaAware.AUTO, "never": CommCudaAware.NEVER, "always": CommCudaAware.ALWAYS,
               None: CommCudaAware.AUTO, True: CommCudaAware.ALWAYS, False: CommCudaAware.NEVER}
_ERR = "lowbit_comm_last_error"


def _destroy(handle_value):
    if handle_value:
        try:
            LIB.fn("lowbit_comm_destroy")(c_void_p(handle_value))
        except Exception:
            pass


def _config(cuda_aware):
    cfg = _capi.CommConfig()
    call("lowbit_comm_config_init", byref(cfg))
    if cuda_aware not in _CUDA_AWARE:
        raise InvalidArgumentError(f"cuda_aware={cuda_aware!r} is not 'auto', 'never' or 'always'")
    cfg.cuda_aware_mpi = int(_CUDA_AWARE[cuda_aware])
    return cfg


class Communicator:
    """A lowbit communicator. Create it with :meth:`from_mpi` (an mpi4py
    communicator; collective) or :meth:`from_nccl`. Free it with
    :meth:`close` (collective over MPI: every rank, before MPI_Finalize) or
    a ``with`` block; garbage collection frees it too.

    Tensors are float32 and contiguous: numpy arrays on the host, DLPack or
    ``__cuda_array_interface__`` objects on CUDA; they are reduced in place.
    """

    def __init__(self, handle: c_void_p, keepalive=None):
        self._handle = handle
        self._keep = keepalive
        self._finalizer = weakref.finalize(self, _destroy, handle.value)

    # -- creation

    @classmethod
    def from_mpi(cls, comm=None, *, cuda_aware="auto") -> "Communicator":
        """Over an MPI communicator: an mpi4py ``MPI.Comm`` (default
        ``MPI.COMM_WORLD``) or a Fortran handle (int). Collective."""
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        cfg = _config(cuda_aware)
        h = c_void_p()
        if isinstance(comm, int):
            fhandle = comm
        elif hasattr(comm, "py2f"):
            fhandle = comm.py2f()
        else:
            raise InvalidArgumentError(f"comm={comm!r} is not an mpi4py communicator or a Fortran handle")
        call("lowbit_comm_create_mpi_fortran", byref(h), c_int64(fhandle), byref(cfg))
        return cls(h, comm)

    @staticmethod
    def nccl_unique_id() -> bytes:
        """A fresh ncclUniqueId for rank 0 to send to the others."""
        buf = ctypes.create_string_buffer(_capi.NCCL_UNIQUE_ID_BYTES)
        call("lowbit_comm_nccl_unique_id", buf, c_int64(len(buf)))
        return buf.raw

    @classmethod
    def from_nccl(cls, unique_id: bytes, rank: int, world_size: int, device_index: int = 0) -> "Communicator":
        """Over a new NCCL communicator (collective over the ranks holding
        `unique_id`); this rank uses CUDA device `device_index`."""
        uid = bytes(unique_id)
        if len(uid) != _capi.NCCL_UNIQUE_ID_BYTES:
            raise InvalidArgumentError(f"unique_id has {len(uid)} bytes, expected {_capi.NCCL_UNIQUE_ID_BYTES}")
        h = c_void_p()
        call("lowbit_comm_create_nccl", byref(h), uid, c_int32(rank), c_int32(world_size), c_int32(device_index),
             None)
        return cls(h)

    @classmethod
    def from_nccl_comm(cls, nccl_comm: int) -> "Communicator":
        """Over an existing ncclComm_t (as an int); the caller keeps it and
        destroys it after this communicator."""
        h = c_void_p()
        call("lowbit_comm_create_nccl_comm", byref(h), c_void_p(nccl_comm), None)
        return cls(h)

    # -- lifetime

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._handle = c_void_p()

    @property
    def closed(self) -> bool:
        return not self._handle.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _h(self):
        if not self._handle.value:
            raise InvalidStateError("the communicator is closed", _capi.Status.ERROR_INVALID_STATE)
        return self._handle

    def _call(self, name, *args):
        call(name, self._h(), *args, handle=self._handle, error_fn=_ERR)

    @property
    def handle(self) -> int:
        """The raw lowbit_comm_t (for Optimizer.set_comm and other C code)."""
        return self._h().value

    # -- queries

    @property
    def rank(self) -> int:
        out = c_int32()
        self._call("lowbit_comm_rank", byref(out))
        return out.value

    @property
    def world_size(self) -> int:
        out = c_int32()
        self._call("lowbit_comm_world_size", byref(out))
        return out.value

    def info(self) -> dict:
        info = _capi.CommInfo()
        info.struct_size = ctypes.sizeof(info)
        self._call("lowbit_comm_get_info", byref(info))
        out = {name: getattr(info, name) for _t, name in _capi.STRUCT_DECLS["lowbit_comm_info_t"][1:]}
        out["backend"] = CommBackend(info.backend).name.lower()
        out["bound_device"] = "cuda" if info.bound_device == Device.CUDA else "cpu"
        return out

    def stats(self) -> dict:
        st = _capi.CommStats()
        st.struct_size = ctypes.sizeof(st)
        self._call("lowbit_comm_get_stats", byref(st))
        return {name: getattr(st, name) for _t, name in _capi.STRUCT_DECLS["lowbit_comm_stats_t"][1:]}

    def reset_stats(self) -> None:
        self._call("lowbit_comm_reset_stats")

    # -- collectives

    def _tensor(self, array, stream) -> ArrayRef:
        ref = as_array_ref(array, role="tensor", writable=True, stream=stream)
        if ref.dtype != Dtype.FLOAT32:
            raise ArrayError(f"tensor: the communicator reduces float32 tensors, got {ref.dtype.name.lower()}")
        return ref

    def compressed_allreduce(self, array, *, stream=None) -> None:
        """In place: array <- the 1-bit compressed average over ranks, with
        error feedback. Collective. A NaN/Inf on any rank changes nothing:
        host tensors raise NonFiniteError on every rank; for CUDA tensors
        see :attr:`last_nonfinite`."""
        s = stream_pointer(stream)
        ref = self._tensor(array, s)
        self._call("lowbit_comm_compressed_allreduce", byref(ref.tensor), c_void_p(s))

    def allreduce_mean(self, array, *, stream=None) -> None:
        """In place: array <- (sum over ranks) / world_size, uncompressed."""
        s = stream_pointer(stream)
        ref = self._tensor(array, s)
        self._call("lowbit_comm_allreduce_mean", byref(ref.tensor), c_void_p(s))

    @property
    def last_nonfinite(self) -> bool:
        out = c_int32()
        self._call("lowbit_comm_last_nonfinite", byref(out))
        return bool(out.value)

    # -- error-feedback buffers

    def error_numel(self) -> tuple:
        w, s = c_int64(), c_int64()
        self._call("lowbit_comm_error_numel", byref(w), byref(s))
        return w.value, s.value

    def read_errors(self, *, stream=None):
        """(worker error, server error) of this rank as float32 numpy arrays."""
        nw, ns = self.error_numel()
        worker = np.zeros(nw, np.float32)
        server = np.zeros(ns, np.float32)
        fp = ctypes.POINTER(c_float)
        self._call("lowbit_comm_read_errors", worker.ctypes.data_as(fp), c_int64(nw), server.ctypes.data_as(fp),
                   c_int64(ns), c_void_p(stream_pointer(stream)))
        return worker, server

    def save_errors(self, *, stream=None) -> bytes:
        s = c_void_p(stream_pointer(stream))
        size = c_int64()
        self._call("lowbit_comm_save_errors", None, c_int64(0), byref(size), s)
        buf = ctypes.create_string_buffer(max(size.value, 1))
        self._call("lowbit_comm_save_errors", buf, c_int64(size.value), byref(size), s)
        return buf.raw[: size.value]

    def load_errors(self, data, *, stream=None) -> None:
        blob = bytes(data)
        self._call("lowbit_comm_load_errors", blob, c_int64(len(blob)), c_void_p(stream_pointer(stream)))

    def reset_errors(self, *, stream=None) -> None:
        self._call("lowbit_comm_reset_errors", c_void_p(stream_pointer(stream)))

    def __repr__(self):
        if self.closed:
            return "<lowbit.Communicator closed>"
        return f"<lowbit.Communicator rank {self.rank} of {self.world_size}>"

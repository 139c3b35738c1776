"""The compressed communicator (lowbit_comm.h): 1-bit allreduce with error
feedback over MPI (mpi4py communicators), NCCL, or a transport of Python
functions (:meth:`Communicator.from_transport`, e.g. torch.distributed)."""

from __future__ import annotations

import contextlib
import weakref

import numpy as np

from ._arrays import ArrayRef, as_array_ref
from ._ffi import NCCL_UNIQUE_ID_BYTES, NULL, CommBackend, CommCudaAware, Device, Dtype, Status, ffi, struct_fields
from ._ffi import void_p
from ._handle import Handle, locked
from ._errors import ArrayError, InvalidArgumentError, InvalidStateError
from ._lib import LIB, call
from ._names import c_int, stream_pointer

_CUDA_AWARE = {"auto": CommCudaAware.AUTO, "never": CommCudaAware.NEVER, "always": CommCudaAware.ALWAYS,
               None: CommCudaAware.AUTO, True: CommCudaAware.ALWAYS, False: CommCudaAware.NEVER}
_ERR = "lowbit_comm_last_error"


def _destroy(handle_value, user_finalizers):
    # Optimizers still using the communicator are destroyed first (at
    # interpreter exit, or when a reference cycle holds both, finalizers run
    # in any order, and weak references to the optimizers are already gone):
    # the library never holds a freed communicator.
    for fin in list(user_finalizers.values()):
        fin()
    if handle_value:
        try:
            LIB.fn("lowbit_comm_destroy")(ffi.cast("lowbit_comm_t", handle_value))
        except Exception:
            pass


# How a communicator keeps its worker and server errors (lowbit_comm_config_t.error_format).
ERROR_FORMATS = {"fp32": 0, "bf16": 1, "int8": 2}


def _error_format(error_format) -> int:
    if error_format is None:
        return 0
    if not isinstance(error_format, str) or error_format not in ERROR_FORMATS:
        raise InvalidArgumentError(f"error_format={error_format!r} is not one of {sorted(ERROR_FORMATS)}")
    return ERROR_FORMATS[error_format]


def _config(cuda_aware, error_format=None):
    fmt = _error_format(error_format)
    cfg = ffi.new("lowbit_comm_config_t *")
    call("lowbit_comm_config_init_sized", cfg, ffi.sizeof("lowbit_comm_config_t"))
    if cuda_aware not in _CUDA_AWARE:
        raise InvalidArgumentError(f"cuda_aware={cuda_aware!r} is not 'auto', 'never' or 'always'")
    cfg.cuda_aware_mpi = int(_CUDA_AWARE[cuda_aware])
    cfg.error_format = fmt
    return cfg


class PeerFailure(Exception):
    """Raised by a Python transport's agreement on every rank when a rank
    failed before its call (:meth:`Communicator._failing`): the lowest such
    rank and its reason. The call then fails on every rank, nothing done."""

    def __init__(self, rank: int, reason: str):
        self.rank, self.reason = rank, reason
        super().__init__(f"rank {rank} failed before its step: {reason}; nothing was done on any rank")


class _Agreement:
    """The argument agreement of a transport of Python functions
    (allreduce_max_i64), with one word more: whether this rank's caller
    failed before its call. The library's 1-bit steps begin every exchange
    with this agreement, and a rank whose caller failed (Python's own checks:
    a hyper-parameter the library refused, a param whose memory moved) still
    joins it (Optimizer._join_failed_step) with the reason set (`pending`).
    Every rank then sees the same word, gets the reason of the lowest such
    rank (one more reduction, only then) and fails with PeerFailure, so no
    rank waits for one that gave up."""

    REASON_BYTES = 1024

    def __init__(self, rank: int, world_size: int, allreduce_max):
        self.rank, self.world_size = rank, world_size
        self.allreduce_max = allreduce_max
        self.errors: list = []  # exceptions of the transport functions during the current call
        self.running = 0  # transport functions running now: close() is refused inside them
        self.pending = None  # this rank's reason, while its caller joins a call it failed before

    def __call__(self, values: int, k: int) -> None:
        W, R = self.world_size, self.rank
        view = np.frombuffer(ffi.buffer(ffi.cast("int64_t *", values), 8 * k), np.int64)
        words = np.empty(k + 1, np.int64)
        words[:k] = view
        words[k] = W - R if self.pending is not None else 0
        self.allreduce_max(words.ctypes.data, k + 1)
        view[:] = words[:k]
        if words[k]:
            root = int(W - words[k])
            raise PeerFailure(root, self._reason_of(root))

    def _reason_of(self, root: int) -> str:
        """The root's reason on every rank: a maximum of non-negative words,
        the root's bytes against everyone else's zeros."""
        raw = bytearray(self.REASON_BYTES)
        if root == self.rank:
            text = self.pending.encode("utf-8", "replace")[: self.REASON_BYTES]
            raw[: len(text)] = text
        words = np.frombuffer(bytes(raw), "<u4").astype(np.int64)
        self.allreduce_max(words.ctypes.data, words.size)
        return words.astype("<u4").tobytes().rstrip(b"\0").decode("utf-8", "replace")


class Communicator(Handle):
    """A lowbit communicator. Create it with :meth:`from_mpi` (an mpi4py
    communicator; collective) or :meth:`from_nccl`. Free it with
    :meth:`close` (collective over MPI: every rank, before MPI_Finalize) or
    a ``with`` block; garbage collection frees it too.

    Tensors are float32 and contiguous: numpy arrays on the host, DLPack or
    ``__cuda_array_interface__`` objects on CUDA; they are reduced in place.

    An optimizer given this communicator (:meth:`lowbit.Optimizer.set_comm`)
    holds it: :meth:`close` raises InvalidStateError, naming the optimizers,
    while any of them is open (destroying a communicator is collective over
    MPI, so it is never deferred to whenever the last user goes). A
    communicator cannot be copied or pickled (TypeError).

    Threads: calls on one communicator are serialised, as for
    :class:`lowbit.Optimizer` (a step of an optimizer using it holds it too).
    """

    _kind = "communicator"
    _error_fn = "lowbit_comm_last_error"

    def __init__(self, handle, keepalive=None, agreement=None):
        super().__init__()
        self._keep = keepalive
        self._agreement = agreement  # a Python transport's argument agreement (_Agreement), or None
        self._transport_errors = agreement.errors if agreement is not None else None
        self._users = weakref.WeakSet()  # open optimizers that use this communicator
        self._user_finalizers = {}  # id(optimizer) -> its handle's finalizer (alive while the handle is)
        self._open(handle, _destroy, int(ffi.cast("uintptr_t", handle)), self._user_finalizers)
        self._i32 = ffi.new("int32_t *")
        self._i64 = ffi.new("int64_t[2]")
        self._error_format = "fp32"

    @property
    def error_format(self) -> str:
        """How this rank keeps its worker and server errors: ``"fp32"``
        (default), ``"bf16"`` or ``"int8"`` (blocks of 256, one fp32 absmax,
        linear codes k/127): the ``error_format`` given at creation."""
        return self._error_format

    # -- creation

    @classmethod
    def from_mpi(cls, comm=None, *, cuda_aware="auto", error_format=None) -> "Communicator":
        """Over an MPI communicator: an mpi4py ``MPI.Comm`` (default
        ``MPI.COMM_WORLD``) or a Fortran handle (int). Collective.
        ``error_format``: ``"fp32"`` (default), ``"bf16"`` or ``"int8"``, the
        same on every rank (host tensors only for the last two)."""
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        cfg = _config(cuda_aware, error_format)
        h = ffi.new("lowbit_comm_t *")
        if isinstance(comm, int):
            fhandle = comm
        elif hasattr(comm, "py2f"):
            fhandle = comm.py2f()
        else:
            raise InvalidArgumentError(f"comm={comm!r} is not an mpi4py communicator or a Fortran handle")
        call("lowbit_comm_create_mpi_fortran", h, c_int(fhandle, "comm", "int64_t"), cfg)
        out = cls(h[0], comm)
        out._error_format = error_format or "fp32"
        return out

    @staticmethod
    def nccl_unique_id() -> bytes:
        """A fresh ncclUniqueId for rank 0 to send to the others."""
        buf = ffi.new("char[]", NCCL_UNIQUE_ID_BYTES)
        call("lowbit_comm_nccl_unique_id", buf, NCCL_UNIQUE_ID_BYTES)
        return ffi.buffer(buf)[:]

    @classmethod
    def from_nccl(cls, unique_id: bytes, rank: int, world_size: int, device_index: int = 0) -> "Communicator":
        """Over a new NCCL communicator (collective over the ranks holding
        `unique_id`); this rank uses CUDA device `device_index`."""
        uid = bytes(unique_id)
        if len(uid) != NCCL_UNIQUE_ID_BYTES:
            raise InvalidArgumentError(f"unique_id has {len(uid)} bytes, expected {NCCL_UNIQUE_ID_BYTES}")
        h = ffi.new("lowbit_comm_t *")
        call("lowbit_comm_create_nccl", h, ffi.from_buffer(uid), c_int(rank, "rank", "int32_t"),
             c_int(world_size, "world_size", "int32_t"), c_int(device_index, "device_index", "int32_t"), NULL)
        return cls(h[0])

    @classmethod
    def from_nccl_comm(cls, nccl_comm: int) -> "Communicator":
        """Over an existing ncclComm_t (as an int); the caller keeps it and
        destroys it after this communicator."""
        h = ffi.new("lowbit_comm_t *")
        call("lowbit_comm_create_nccl_comm", h, void_p(nccl_comm), NULL)
        return cls(h[0])

    @classmethod
    def from_transport(cls, *, rank: int, world_size: int, alltoall, allgather, allreduce_sum,
                       allreduce_max=None, host_buffers: bool = True, device_buffers: bool = False,
                       stream_ordered: bool = False, device_index: int = -1,
                       error_format=None) -> "Communicator":
        """Over a transport of Python functions (lowbit_comm_create_transport):
        every collective of this communicator, and 1-bit Adam's, runs through
        them, with the bits of the MPI transport. Not collective.

        The functions get raw addresses (ints) and sizes, and return nothing
        (an exception fails the lowbit call with CommunicationError, the
        exception chained):

        - ``alltoall(send, recv, m, stream)``: message r (bytes [r*m,
          (r+1)*m) of ``send``) to rank r; rank r's message into ``recv +
          r*m``;
        - ``allgather(send, recv, m, stream)``: every rank's ``m`` bytes, in
          rank order, into ``recv``;
        - ``allreduce_sum(data, n, stream)``: in place, the sum over ranks of
          ``n`` float32;
        - ``allreduce_max(values, k)`` (optional: without it there is no
          argument agreement): in place, the maximum over ranks of ``k``
          int64 in host memory. The package adds a word to the library's
          agreement (whether this rank's caller failed before its call, see
          lowbit.torch's 1-bit optimizers), and calls it once more when one did.

        ``host_buffers``: they take host memory; ``device_buffers``: CUDA
        device memory (``stream_ordered``: enqueued on ``stream``, else done
        when they return).

        ``error_format``: how the worker and server errors are kept,
        ``"fp32"`` (default), ``"bf16"`` or ``"int8"`` (host tensors only),
        the same on every rank (with ``allreduce_max`` every collective checks
        it)."""
        cfg = _config("auto", error_format)
        rank, world_size = c_int(rank, "rank", "int32_t"), c_int(world_size, "world_size", "int32_t")
        agreement = _Agreement(rank, world_size, allreduce_max)

        def on_error(exc_type, exc, tb):  # the C call then fails; _call chains exc
            agreement.errors.append(exc)

        def wrap(fn):
            def entry(user_data, *args):  # user_data is unused: the closure holds fn
                agreement.running += 1
                try:
                    fn(*(int(ffi.cast("uintptr_t", a)) if isinstance(a, ffi.CData) else a for a in args))
                finally:
                    agreement.running -= 1
                return 0
            return entry

        sig = {
            "alltoall": "int32_t(void*, const void*, void*, int64_t, void*)",
            "allgather": "int32_t(void*, const void*, void*, int64_t, void*)",
            "allreduce_sum_f32": "int32_t(void*, float*, int64_t, void*)",
            "allreduce_max_i64": "int32_t(void*, int64_t*, int32_t)",
        }
        fns = {"alltoall": alltoall, "allgather": allgather, "allreduce_sum_f32": allreduce_sum,
               "allreduce_max_i64": allreduce_max}
        for field, fn in fns.items():
            if fn is not None and not callable(fn):
                raise InvalidArgumentError(f"{field}={fn!r} is not callable")
        if allreduce_max is not None:
            fns["allreduce_max_i64"] = agreement
        t = ffi.new("lowbit_comm_transport_t *")
        t.struct_size = ffi.sizeof("lowbit_comm_transport_t")
        t.rank, t.world_size = rank, world_size
        t.host_buffers, t.device_buffers = int(bool(host_buffers)), int(bool(device_buffers))
        t.stream_ordered, t.device_index = int(bool(stream_ordered)), c_int(device_index, "device_index", "int32_t")
        callbacks = []
        for field, fn in fns.items():
            if fn is None:
                continue
            cb = ffi.callback(sig[field], wrap(fn), error=-1, onerror=on_error)
            callbacks.append(cb)
            setattr(t, field, cb)
        h = ffi.new("lowbit_comm_t *")
        call("lowbit_comm_create_transport", h, t, cfg)
        out = cls(h[0], keepalive=(callbacks, fns), agreement=agreement)
        out._error_format = error_format or "fp32"
        return out

    # -- lifetime

    def close(self) -> None:
        """Free the communicator (collective over MPI: every rank, before
        MPI_Finalize). Idempotent. Raises InvalidStateError while an open
        optimizer uses it: close the optimizer first, and from inside one of
        its own transport functions (a call on it is still running)."""
        super().close()

    def _before_close(self) -> None:
        if self._agreement is not None and self._agreement.running and not self.closed:
            raise InvalidStateError(
                "close() was called from inside one of this communicator's own transport functions, while a call "
                "on it is still running; close it after that call has returned", Status.ERROR_INVALID_STATE)
        users = [opt for opt in self._users if not opt.closed]
        if users and not self.closed:
            names = ", ".join(repr(opt) for opt in users)
            raise InvalidStateError(
                f"the communicator is in use by {len(users)} open optimizer(s): {names}; close them first "
                "(an optimizer holds its communicator until it is closed)", Status.ERROR_INVALID_STATE)

    def _attach(self, opt) -> None:
        for key in [k for k, fin in self._user_finalizers.items() if not fin.alive]:
            del self._user_finalizers[key]
        self._users.add(opt)
        self._user_finalizers[id(opt)] = opt._finalizer

    def _detach(self, opt) -> None:
        self._users.discard(opt)
        self._user_finalizers.pop(id(opt), None)

    def __copy__(self):
        raise TypeError("a lowbit.Communicator cannot be copied: it is one member of a collective group (a copy "
                        "would share, and could free, the library handle)")

    def __deepcopy__(self, memo):
        raise TypeError("a lowbit.Communicator cannot be copied: it is one member of a collective group; create "
                        "another one collectively with Communicator.from_mpi / from_nccl")

    def __reduce_ex__(self, protocol):
        raise TypeError("a lowbit.Communicator cannot be pickled; save its errors with save_errors()")

    def _call(self, name, *args):
        self._clear_transport_errors()
        try:
            super()._call(name, *args)
        except Exception as e:
            raise self._transport_failure(e)

    @contextlib.contextmanager
    def _failing(self, reason: str):
        """While the caller joins a collective call it failed before
        (Optimizer._join_failed_step): a Python transport's agreement tells
        every rank `reason` (_Agreement). Other transports have only the
        library's agreement, whose message then names this rank and the
        refused call."""
        agreement = self._agreement
        if agreement is None:
            yield
            return
        agreement.pending = reason
        try:
            yield
        finally:
            agreement.pending = None

    def _clear_transport_errors(self) -> None:
        if self._transport_errors:
            self._transport_errors.clear()

    def _transport_failure(self, error: Exception) -> Exception:
        """What a failed call on this communicator raises: `error`, chained
        to the Python transport's exception when one failed it; when the
        transport's agreement found that another rank failed before its call
        (_Agreement, PeerFailure), that rank's reason."""
        errors = self._transport_errors
        if not errors:
            return error
        cause = errors[0]
        if isinstance(cause, PeerFailure):
            out = InvalidArgumentError(str(cause), Status.ERROR_INVALID_ARGUMENT)
        else:
            out = error
        out.__cause__ = cause
        return out

    # -- queries

    @property
    @locked
    def rank(self) -> int:
        self._call("lowbit_comm_rank", self._i32)
        return self._i32[0]

    @property
    @locked
    def world_size(self) -> int:
        self._call("lowbit_comm_world_size", self._i32)
        return self._i32[0]

    @locked
    def info(self) -> dict:
        info = ffi.new("lowbit_comm_info_t *")
        info.struct_size = ffi.sizeof("lowbit_comm_info_t")
        self._call("lowbit_comm_get_info", info)
        out = {name: getattr(info, name) for name in struct_fields("lowbit_comm_info_t")[1:]}
        out["backend"] = CommBackend(info.backend).name.lower()
        out["bound_device"] = "cuda" if info.bound_device == Device.CUDA else "cpu"
        return out

    @locked
    def stats(self) -> dict:
        st = ffi.new("lowbit_comm_stats_t *")
        st.struct_size = ffi.sizeof("lowbit_comm_stats_t")
        self._call("lowbit_comm_get_stats", st)
        return {name: getattr(st, name) for name in struct_fields("lowbit_comm_stats_t")[1:]}

    @locked
    def reset_stats(self) -> None:
        self._call("lowbit_comm_reset_stats")

    # -- collectives

    def _tensor(self, array, stream) -> ArrayRef:
        ref = as_array_ref(array, role="tensor", writable=True, stream=stream)
        if ref.dtype != Dtype.FLOAT32:
            raise ArrayError(f"tensor: the communicator reduces float32 tensors, got {ref.dtype.name.lower()}")
        return ref

    @locked
    def compressed_allreduce(self, array, *, stream=None) -> None:
        """In place: array <- the 1-bit compressed average over ranks, with
        error feedback. Collective. A NaN/Inf on any rank changes nothing:
        host tensors raise NonFiniteError on every rank; for CUDA tensors
        see :attr:`last_nonfinite`."""
        s = stream_pointer(stream)
        ref = self._tensor(array, s)
        self._call("lowbit_comm_compressed_allreduce", ref.desc, void_p(s))

    @locked
    def allreduce_mean(self, array, *, stream=None) -> None:
        """In place: array <- (sum over ranks) / world_size, uncompressed."""
        s = stream_pointer(stream)
        ref = self._tensor(array, s)
        self._call("lowbit_comm_allreduce_mean", ref.desc, void_p(s))

    @locked
    def reduce_scatter_chunk(self, numel: int) -> tuple:
        """(offset, count): this rank's chunk of a compressed reduce-scatter
        of `numel` elements, elements [offset, offset + count) (count may be
        0). Local; with numel a multiple of 8 * world_size the chunks are
        numel / world_size each, torch's reduce_scatter_tensor layout."""
        self._call("lowbit_comm_reduce_scatter_chunk", c_int(numel, "numel"), self._i64, self._i64 + 1)
        return int(self._i64[0]), int(self._i64[1])

    @locked
    def compressed_reduce_scatter(self, array, out, *, stream=None) -> None:
        """out (float32, reduce_scatter_chunk(array.size)[1] elements) <- the
        average over ranks of the 1-bit compressed arrays over this rank's
        chunk, with worker error feedback (the first half of
        compressed_allreduce; docs/COMMUNICATOR.md, section 2b). array
        (float32, the same size on every rank) is read, not written; out
        may be a view of it. Collective; host arrays only. A NaN/Inf on
        any rank changes nothing and raises NonFiniteError on every rank."""
        s = stream_pointer(stream)
        ref = self._tensor(array, s)
        dst = as_array_ref(out, role="out", writable=True, stream=s)
        if dst.dtype != Dtype.FLOAT32:
            raise ArrayError(f"out: the communicator reduces float32 tensors, got {dst.dtype.name.lower()}")
        self._call("lowbit_comm_compressed_reduce_scatter", ref.desc, dst.desc, void_p(s))

    # -- codec stages (the caller moves the messages; lowbit_comm.h, "any transport")

    @locked
    def stage_message_bytes(self, numel: int) -> int:
        """Bytes of one message of a compressed allreduce of `numel`
        elements: compress writes and reduce reads world_size messages,
        reduce writes one, decode reads world_size."""
        self._call("lowbit_comm_stage_message_bytes", c_int(numel, "numel"), self._i64)
        return self._i64[0]

    @staticmethod
    def _bytes(buf, role, writable):
        """A host byte buffer (a contiguous numpy array or anything with the
        buffer protocol) as (cdata, size)."""
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise ArrayError(f"{role}: the message buffer must be contiguous")
        if writable and not arr.flags.writeable:
            raise ArrayError(f"{role}: the message buffer is read-only")
        return ffi.from_buffer("char[]", arr, require_writable=writable), arr.nbytes

    @locked
    def stage_compress(self, array, send, *, stream=None) -> None:
        """Worker stage: array (float32, unchanged) + worker error -> send
        (host bytes, world_size messages). Host tensors only from Python."""
        s = stream_pointer(stream)
        ref = self._tensor(array, s)
        out, n = self._bytes(send, "send", True)
        self._call("lowbit_comm_stage_compress", ref.desc, out, n, void_p(s))

    @locked
    def stage_reduce(self, recv, gsend, *, stream=None) -> None:
        """Server stage: recv (world_size messages) + server error -> gsend."""
        r, rn = self._bytes(recv, "recv", False)
        g, gn = self._bytes(gsend, "gsend", True)
        self._call("lowbit_comm_stage_reduce", r, rn, g, gn, void_p(stream_pointer(stream)))

    @locked
    def stage_decode(self, grecv, out, *, stream=None) -> None:
        """Decode stage: grecv (world_size messages, rank order) -> out
        (float32, the compress tensor's size); the sequence's error updates
        take effect."""
        s = stream_pointer(stream)
        g, gn = self._bytes(grecv, "grecv", False)
        ref = self._tensor(out, s)
        self._call("lowbit_comm_stage_decode", g, gn, ref.desc, void_p(s))

    @property
    @locked
    def last_nonfinite(self) -> bool:
        self._call("lowbit_comm_last_nonfinite", self._i32)
        return bool(self._i32[0])

    # -- error-feedback buffers

    @locked
    def error_numel(self) -> tuple:
        self._call("lowbit_comm_error_numel", self._i64, self._i64 + 1)
        return self._i64[0], self._i64[1]

    @locked
    def read_errors(self, *, stream=None):
        """(worker error, server error) of this rank as float32 numpy arrays."""
        nw, ns = self.error_numel()
        worker = np.zeros(nw, np.float32)
        server = np.zeros(ns, np.float32)
        self._call("lowbit_comm_read_errors", ffi.from_buffer("float[]", worker), nw,
                   ffi.from_buffer("float[]", server), ns, void_p(stream_pointer(stream)))
        return worker, server

    @locked
    def save_errors(self, *, stream=None) -> bytes:
        s = void_p(stream_pointer(stream))
        self._call("lowbit_comm_save_errors", NULL, 0, self._i64, s)
        size = self._i64[0]
        buf = ffi.new("char[]", max(size, 1))
        self._call("lowbit_comm_save_errors", buf, size, self._i64, s)
        return ffi.buffer(buf, self._i64[0])[:]

    @locked
    def load_errors(self, data, *, stream=None) -> None:
        blob = bytes(data)
        self._call("lowbit_comm_load_errors", ffi.from_buffer(blob) if blob else ffi.new("char[]", 1), len(blob),
                   void_p(stream_pointer(stream)))

    @locked
    def reset_errors(self, *, stream=None) -> None:
        self._call("lowbit_comm_reset_errors", void_p(stream_pointer(stream)))

    def __repr__(self):
        if self.closed:
            return "<lowbit.Communicator closed>"
        return f"<lowbit.Communicator rank {self.rank} of {self.world_size}>"

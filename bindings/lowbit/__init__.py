"""lowbit: memory-efficient optimizers (8-bit / 4-bit / FP8 / bf16 state,
stochastic rounding and error-correction bytes for 16-bit weights) from Python.

The package talks to the liblowbit shared library through ctypes (ABI mode, no
compiler needed at import). It uses the copy installed inside the package, or
the library named by the environment variable ``LOWBIT_LIBRARY`` (for build
trees).

* :class:`lowbit.Optimizer`: AdamW / Adam / Lion / SGD / 1-bit Adam over
  caller-owned arrays (numpy on the CPU; DLPack or ``__cuda_array_interface__``
  objects such as torch, cupy or jax arrays on CUDA), updated in place.
* :class:`lowbit.Communicator`: the 1-bit compressed allreduce over an mpi4py
  communicator or NCCL.
* ``lowbit.torch``: drop-in ``torch.optim.Optimizer`` classes.

Every failure raises a :class:`lowbit.LowbitError` subclass (chosen by the
library's status, e.g. :class:`InvalidArgumentError` is also a ValueError)
carrying the library's message.
"""

from ._capi import Algorithm, CheckpointMode, CommBackend, CommCudaAware, Device, Dtype, Rounding, StateFormat, Status
from ._lib import (
    ArrayError,
    BufferTooSmallError,
    CommunicationError,
    CorruptDataError,
    CudaError,
    InternalError,
    InvalidArgumentError,
    InvalidStateError,
    LibraryNotFoundError,
    LowbitError,
    LowbitIOError,
    NonFiniteError,
    NullPointerError,
    OutOfMemoryError,
    StateMismatchError,
    UnsupportedError,
    VersionMismatchError,
    library_path,
    status_string,
)
from ._lib import LIB as _LIB
from ._comm import Communicator
from ._optimizer import Optimizer, ParamInfo



def version() -> str:
    """Version of the loaded library, "MAJOR.MINOR.PATCH" (CMake's project
    version, the one place it is written)."""
    v = _LIB.fn("lowbit_version")()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def __getattr__(name):
    # The package version is the library's; read it (loading the library)
    # only when asked.
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def has_cuda() -> bool:
    return bool(_LIB.fn("lowbit_has_cuda")())


def has_mpi() -> bool:
    return bool(_LIB.fn("lowbit_has_mpi")())


def has_nccl() -> bool:
    return bool(_LIB.fn("lowbit_has_nccl")())


__all__ = [
    "Algorithm",
    "ArrayError",
    "BufferTooSmallError",
    "CheckpointMode",
    "CommBackend",
    "CommCudaAware",
    "Communicator",
    "CommunicationError",
    "CorruptDataError",
    "CudaError",
    "Device",
    "Dtype",
    "InternalError",
    "InvalidArgumentError",
    "InvalidStateError",
    "LibraryNotFoundError",
    "LowbitError",
    "LowbitIOError",
    "NonFiniteError",
    "NullPointerError",
    "Optimizer",
    "OutOfMemoryError",
    "ParamInfo",
    "Rounding",
    "StateFormat",
    "StateMismatchError",
    "Status",
    "UnsupportedError",
    "VersionMismatchError",
    "has_cuda",
    "has_mpi",
    "has_nccl",
    "library_path",
    "status_string",
    "version",
]

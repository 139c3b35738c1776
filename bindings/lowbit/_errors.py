"""The exceptions of the package, keyed by the library's status.

Each class names its status (``_status``, the suffix of the C constant after
``LOWBIT_``); the :class:`lowbit.Status` values are attached by :mod:`._ffi`
once the declarations are read, since the status enum itself comes from the
header.
"""

from __future__ import annotations


class LowbitError(Exception):
    """A lowbit call failed. ``status`` is the library's status code (a
    :class:`lowbit.Status`), ``message`` the library's (or the binding's) message."""

    _status = "ERROR_INTERNAL"
    status = 14

    def __init__(self, message: str, status=None, function: str | None = None):
        if status is not None:
            self.status = _as_status(status)
        self.message = message
        self.function = function
        text = message
        if function:
            text = f"{function}: {text}"
        status_name = getattr(self.status, "name", None) or (
            self._status if status is None else str(self.status))  # before the Status enum is bound
        super().__init__(f"{text} [{status_name}]")


class InvalidArgumentError(LowbitError, ValueError):
    _status = "ERROR_INVALID_ARGUMENT"


class NullPointerError(LowbitError, ValueError):
    _status = "ERROR_NULL_POINTER"


class UnsupportedError(LowbitError, NotImplementedError):
    _status = "ERROR_UNSUPPORTED"


class OutOfMemoryError(LowbitError, MemoryError):
    _status = "ERROR_OUT_OF_MEMORY"


class InvalidStateError(LowbitError, RuntimeError):
    _status = "ERROR_INVALID_STATE"


class CudaError(LowbitError, RuntimeError):
    _status = "ERROR_CUDA"


class LowbitIOError(LowbitError, OSError):
    _status = "ERROR_IO"

    def __init__(self, message, status=None, function=None):
        LowbitError.__init__(self, message, status, function)

    def __str__(self):  # OSError's own __str__ would hide the message
        return LowbitError.__str__(self)


class CorruptDataError(LowbitError, ValueError):
    _status = "ERROR_CORRUPT_DATA"


class VersionMismatchError(LowbitError, ValueError):
    _status = "ERROR_VERSION_MISMATCH"


class StateMismatchError(LowbitError, ValueError):
    _status = "ERROR_STATE_MISMATCH"


class BufferTooSmallError(LowbitError, ValueError):
    _status = "ERROR_BUFFER_TOO_SMALL"


class NonFiniteError(LowbitError, FloatingPointError):
    _status = "ERROR_NONFINITE"


class CommunicationError(LowbitError, RuntimeError):
    _status = "ERROR_COMMUNICATION"


class InternalError(LowbitError, RuntimeError):
    _status = "ERROR_INTERNAL"


class ArrayError(InvalidArgumentError, TypeError):
    """An array was rejected by the binding before reaching the library (wrong
    dtype, wrong device, not contiguous, read-only, unknown array type)."""


class LibraryNotFoundError(LowbitError, ImportError):
    """liblowbit, or the declarations it was built with (lowbit_cdef.h), could
    not be found or loaded, or they do not belong together."""

    _status = "ERROR_UNSUPPORTED"
    status = 3


_BY_STATUS_CLASSES = (
    InvalidArgumentError,
    NullPointerError,
    UnsupportedError,
    OutOfMemoryError,
    InvalidStateError,
    CudaError,
    LowbitIOError,
    CorruptDataError,
    VersionMismatchError,
    StateMismatchError,
    BufferTooSmallError,
    NonFiniteError,
    CommunicationError,
    InternalError,
)
for _cls in (LowbitError, ArrayError, LibraryNotFoundError) + _BY_STATUS_CLASSES:
    _cls.__module__ = "lowbit"  # as exported: lowbit.InvalidArgumentError, ...
ERRORS_BY_STATUS: dict = {}
_Status = None


def _as_status(status):
    if _Status is not None:
        try:
            return _Status(status)
        except ValueError:
            pass
    return int(status)


def bind_statuses(status_enum) -> None:
    """Attach the lowbit.Status values (from the declarations) to the classes."""
    global _Status
    _Status = status_enum
    for cls in (LowbitError, ArrayError, LibraryNotFoundError) + _BY_STATUS_CLASSES:
        cls.status = status_enum[cls._status]
    ERRORS_BY_STATUS.clear()
    ERRORS_BY_STATUS.update({cls.status: cls for cls in _BY_STATUS_CLASSES})


def error_for(status: int, message: str, function: str | None = None) -> LowbitError:
    cls = ERRORS_BY_STATUS.get(status, LowbitError)
    return cls(message, status, function)

"""Finding and loading liblowbit, and turning statuses into exceptions."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from . import _capi
from ._capi import Status

LIBRARY_ENV = "LOWBIT_LIBRARY"

if sys.platform == "darwin":
    _LIB_NAMES = ("liblowbit.dylib",)
elif sys.platform == "win32":
    _LIB_NAMES = ("lowbit.dll", "liblowbit.dll")
else:
    _LIB_NAMES = ("liblowbit.so",)


# ----------------------------------------------------------------- exceptions


class LowbitError(Exception):
    """A lowbit call failed. ``status`` is the library's status code (a
    :class:`lowbit.Status`), ``message`` the library's (or the binding's) message."""

    status = Status.ERROR_INTERNAL

    def __init__(self, message: str, status: Status | int | None = None, function: str | None = None):
        if status is not None:
            try:
                self.status = Status(status)
            except ValueError:
                self.status = int(status)
        self.message = message
        self.function = function
        text = message
        if function:
            text = f"{function}: {text}"
        status_name = self.status.name if isinstance(self.status, Status) else str(self.status)
        super().__init__(f"{text} [{status_name}]")


class InvalidArgumentError(LowbitError, ValueError):
    status = Status.ERROR_INVALID_ARGUMENT


class NullPointerError(LowbitError, ValueError):
    status = Status.ERROR_NULL_POINTER


class UnsupportedError(LowbitError, NotImplementedError):
    status = Status.ERROR_UNSUPPORTED


class OutOfMemoryError(LowbitError, MemoryError):
    status = Status.ERROR_OUT_OF_MEMORY


class InvalidStateError(LowbitError, RuntimeError):
    status = Status.ERROR_INVALID_STATE


class CudaError(LowbitError, RuntimeError):
    status = Status.ERROR_CUDA


class LowbitIOError(LowbitError, OSError):
    status = Status.ERROR_IO

    def __init__(self, message, status=None, function=None):
        LowbitError.__init__(self, message, status, function)

    def __str__(self):  # OSError's own __str__ would hide the message
        return LowbitError.__str__(self)


class CorruptDataError(LowbitError, ValueError):
    status = Status.ERROR_CORRUPT_DATA


class VersionMismatchError(LowbitError, ValueError):
    status = Status.ERROR_VERSION_MISMATCH


class StateMismatchError(LowbitError, ValueError):
    status = Status.ERROR_STATE_MISMATCH


class BufferTooSmallError(LowbitError, ValueError):
    status = Status.ERROR_BUFFER_TOO_SMALL


class NonFiniteError(LowbitError, FloatingPointError):
    status = Status.ERROR_NONFINITE


class CommunicationError(LowbitError, RuntimeError):
    status = Status.ERROR_COMMUNICATION


class InternalError(LowbitError, RuntimeError):
    status = Status.ERROR_INTERNAL


class ArrayError(InvalidArgumentError, TypeError):
    """An array was rejected by the binding before reaching the library (wrong
    dtype, wrong device, not contiguous, read-only, unknown array type)."""


class LibraryNotFoundError(LowbitError, ImportError):
    status = Status.ERROR_UNSUPPORTED


ERRORS_BY_STATUS = {
    cls.status: cls
    for cls in (
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
}


def error_for(status: int, message: str, function: str | None = None) -> LowbitError:
    cls = ERRORS_BY_STATUS.get(status, LowbitError)
    return cls(message, status, function)


# ----------------------------------------------------------------- loading


def _candidates():
    env = os.environ.get(LIBRARY_ENV)
    if env:
        yield env, True
        return
    # Every directory of the package: the installed one, and, for an
    # editable install, the source tree and the site-packages copy.
    pkg = sys.modules.get(__package__)
    dirs = list(getattr(pkg, "__path__", []) or []) or [os.path.dirname(os.path.abspath(__file__))]
    for d in dirs:
        for name in _LIB_NAMES:
            yield os.path.join(d, name), False


class _Library:
    def __init__(self):
        self._lock = threading.Lock()
        self._lib = None
        self.path = None
        self.missing = []

    def load(self):
        if self._lib is not None:
            return self._lib
        with self._lock:
            if self._lib is not None:
                return self._lib
            tried = []
            for path, from_env in _candidates():
                if from_env and not os.path.exists(path):
                    raise LibraryNotFoundError(
                        f"{LIBRARY_ENV}={path!r} does not exist (it must name the liblowbit shared library, "
                        "e.g. build/liblowbit.so)"
                    )
                if not os.path.exists(path):
                    tried.append(path)
                    continue
                try:
                    lib = ctypes.CDLL(path)
                except OSError as e:
                    raise LibraryNotFoundError(f"could not load {path}: {e}") from e
                self.missing = _capi.bind(lib)
                self.path = path
                self._lib = lib
                return lib
            raise LibraryNotFoundError(
                "liblowbit was not found (looked for " + ", ".join(tried) + "). Install the package with "
                f"`pip install .`, or point {LIBRARY_ENV} at a built liblowbit.so "
                "(`make -f Makefile.python lib` builds one)."
            )

    def fn(self, name):
        lib = self.load()
        if name in self.missing:
            raise UnsupportedError(f"{name} is not exported by {self.path} (library older than the bindings?)",
                                   Status.ERROR_UNSUPPORTED)
        return getattr(lib, name)


LIB = _Library()


def call(name: str, *args, handle=None, error_fn: str = "lowbit_optimizer_last_error"):
    """Call `name`; on failure raise the matching LowbitError carrying the
    library's message: the handle's (read with `error_fn`) when `handle` is
    given, else the thread-local lowbit_last_error()."""
    status = LIB.fn(name)(*args)
    if status != Status.SUCCESS:
        msg = last_error(handle, error_fn)
        if not msg:
            msg = status_string(status)
        raise error_for(status, msg, name)


def last_error(handle=None, error_fn: str = "lowbit_optimizer_last_error") -> str:
    if handle:
        msg = LIB.fn(error_fn)(handle)
    else:
        msg = LIB.fn("lowbit_last_error")()
    if not msg:
        return ""
    return msg.decode("utf-8", "replace")


def status_string(status: int) -> str:
    s = LIB.fn("lowbit_status_string")(int(status))
    return s.decode("utf-8", "replace") if s else ""


def library_path() -> str:
    LIB.load()
    return LIB.path

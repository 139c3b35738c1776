"""What lowbit.Optimizer and lowbit.Communicator share: one library handle,
open until :meth:`Handle.close` (or a ``with`` block, or garbage
collection), the closed-handle error, the handle's last error message, and
the lock that serialises the Python calls on it.

Threads. The C API allows one thread per handle at a time. A Python handle
serialises its calls instead: a call made while another thread is inside a
call on the same handle waits for it (a reentrant lock per handle), so
threads sharing an optimizer step it one whole step after the other."""

from __future__ import annotations

import functools
import threading
import weakref

from ._errors import InvalidStateError
from ._ffi import Status, ffi
from ._lib import call, last_error


def locked(method):
    """Run `method` holding its handle's lock (see the module's docstring)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class Handle:
    """Base of the Python objects that own one library handle.

    Subclasses set ``_kind`` (how messages name them), ``_error_fn`` (the
    C function returning the handle's last message) and call
    :meth:`_open` with the handle and its destroy function once created."""

    _kind = "handle"
    _error_fn = "lowbit_optimizer_last_error"

    def __init__(self):
        self._handle = None
        self._finalizer = None
        self._lock = threading.RLock()

    def _open(self, handle, destroy, *destroy_args) -> None:
        """Own `handle` (a cdata): `destroy(*destroy_args)` frees it, once,
        at close() or when this object is garbage."""
        self._handle = handle
        self._finalizer = weakref.finalize(self, destroy, *destroy_args)

    # -- lifetime

    @locked
    def close(self) -> None:
        """Free the library handle now (idempotent)."""
        self._before_close()
        if self._finalizer is not None:
            self._finalizer()
        self._handle = None
        self._after_close()

    def _before_close(self) -> None:
        """May refuse the close (raise); the handle is still open."""

    def _after_close(self) -> None:
        """Drops what the open handle needed."""

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- calls

    def _h(self):
        h = self._handle
        if h is None:
            raise InvalidStateError(f"the {self._kind} is closed", Status.ERROR_INVALID_STATE)
        return h

    def _call(self, name, *args):
        """Call the C function `name` on this handle; a failure raises the
        matching LowbitError with the handle's message."""
        call(name, self._h(), *args, handle=self._handle, error_fn=self._error_fn)

    @property
    def handle(self) -> int:
        """The raw library handle as an int, for other C code (valid until close)."""
        return int(ffi.cast("uintptr_t", self._h()))

    def last_error(self) -> str:
        """The library's message of the last failed call on this handle ("" if none)."""
        h = self._handle
        return "" if h is None else last_error(h, self._error_fn)

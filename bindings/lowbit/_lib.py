"""Calling liblowbit (loaded by :mod:`._ffi`) and turning statuses into
exceptions."""

from __future__ import annotations

import os

from . import _ffi
from ._errors import LowbitError, UnsupportedError, error_for
from ._ffi import LIBRARY_ENV, NULL, Status, ffi

_lib = _ffi.lib


class _Library:
    """The loaded library: ``fn(name)`` is the declared C function, raising
    UnsupportedError when the library does not export it."""

    def __init__(self):
        self.path = _ffi.library_path
        self.cdef_path = _ffi.cdef_path
        self._fns: dict = {}

    def load(self):
        return _lib

    def fn(self, name):
        f = self._fns.get(name)
        if f is None:
            try:
                f = getattr(_lib, name)
            except AttributeError:
                raise UnsupportedError(f"{name} is not exported by {self.path} (or not declared in "
                                       f"{self.cdef_path})", Status.ERROR_UNSUPPORTED) from None
            self._fns[name] = f
        return f


LIB = _Library()


def c_string(p) -> str:
    if p == NULL:
        return ""
    return ffi.string(p).decode("utf-8", "replace")


def call(name: str, *args, handle=None, error_fn: str = "lowbit_optimizer_last_error"):
    """Call `name`; on failure raise the matching LowbitError carrying the
    library's message: the handle's (read with `error_fn`) when `handle` is
    given, else the thread-local lowbit_last_error()."""
    fn = LIB.fn(name)
    try:
        status = fn(*args)
    except TypeError:
        if None not in args:
            raise
        # None stands for NULL, as with ctypes (cffi wants ffi.NULL)
        status = fn(*(NULL if a is None else a for a in args))
    if status != 0:
        raise failure(name, status, handle, error_fn)


def failure(name: str, status: int, handle=None, error_fn: str = "lowbit_optimizer_last_error") -> LowbitError:
    msg = last_error(handle, error_fn) or status_string(status)
    return error_for(status, msg, name)


def last_error(handle=None, error_fn: str = "lowbit_optimizer_last_error") -> str:
    """The library's last message: of `handle` (a cdata handle or an int
    address) through `error_fn`, else this thread's lowbit_last_error()."""
    if handle is not None and handle != 0 and handle != NULL:
        if not isinstance(handle, ffi.CData):
            handle = ffi.cast("void *", handle)
        return c_string(LIB.fn(error_fn)(handle))
    return c_string(LIB.fn("lowbit_last_error")())


def status_string(status: int) -> str:
    return c_string(LIB.fn("lowbit_status_string")(int(status)))


def library_path() -> str:
    return LIB.path


JAX_LIBRARY_ENV = "LOWBIT_JAX_LIBRARY"
JAX_MODULE_NAME = "liblowbit_jax.so"  # CMake names MODULE libraries .so on Linux and macOS


def jax_module_candidates() -> list:
    """Where the JAX FFI handlers (liblowbit_jax) are looked for, as (path,
    source): $LOWBIT_JAX_LIBRARY alone when set, else beside $LOWBIT_LIBRARY,
    then inside the package."""
    env = os.environ.get(JAX_LIBRARY_ENV)
    if env:
        return [(env, JAX_LIBRARY_ENV)]
    out = []
    lib = os.environ.get(LIBRARY_ENV)
    if lib:
        out.append((os.path.join(os.path.dirname(os.path.abspath(lib)), JAX_MODULE_NAME), LIBRARY_ENV))
    out.append((os.path.join(os.path.dirname(os.path.abspath(__file__)), JAX_MODULE_NAME), None))
    return out

"""liblowbit_jax, the XLA FFI handlers of lowbit.jax: found, checked
(its protocol) and registered with jax once (:data:`_MODULE`), and what the
package asks it (the layout record's width, the hyper-parameter checks)."""

from __future__ import annotations

import ctypes
import os
import threading

import jax

from .._lib import JAX_LIBRARY_ENV as LIBRARY_ENV
from .._lib import jax_module_candidates

PROTOCOL_VERSION = 5  # the call protocol this package speaks (bindings/jax/step_common.hpp kProtocolVersion)

_STEP_TARGET = "lowbit_step"
_DECODE_TARGET = "lowbit_decode_moment"


class _Module:
    def __init__(self):
        self._lock = threading.Lock()
        self.lib = None
        self.path = None
        self.has_cuda = False
        self.layout_columns = None  # int32 columns of a state.layout row (lowbit_jax_layout_columns)

    def _candidates(self):
        return jax_module_candidates()  # shared with python -m lowbit

    def load(self):
        if self.lib is not None:
            return self.lib
        with self._lock:
            if self.lib is not None:
                return self.lib
            tried = []
            for path, source in self._candidates():
                if source == LIBRARY_ENV and not os.path.exists(path):
                    raise ImportError(f"{LIBRARY_ENV}={path!r} does not exist (it must name liblowbit_jax.so)")
                if not os.path.exists(path):
                    tried.append(path)
                    continue
                # liblowbit is loaded (lowbit._lib, imported above): the
                # module's DT_NEEDED liblowbit.so.0 resolves to it by its
                # soname, so one library serves the package and the handlers.
                lib = ctypes.CDLL(path)
                lib.lowbit_jax_protocol_version.restype = ctypes.c_int32
                version = lib.lowbit_jax_protocol_version()
                if version != PROTOCOL_VERSION:
                    raise ImportError(
                        f"{path} speaks FFI protocol {version}, this lowbit.jax expects {PROTOCOL_VERSION} "
                        "(rebuild liblowbit_jax)"
                    )
                lib.lowbit_jax_has_cuda.restype = ctypes.c_int32
                try:
                    lib.lowbit_jax_layout_columns.restype = ctypes.c_int32
                except AttributeError:
                    raise ImportError(f"{path} has no lowbit_jax_layout_columns: it is older than this lowbit.jax "
                                      "(rebuild liblowbit_jax)") from None
                self.layout_columns = int(lib.lowbit_jax_layout_columns())
                jax.ffi.register_ffi_target(_STEP_TARGET, jax.ffi.pycapsule(lib.LowbitStepCpu), platform="cpu")
                jax.ffi.register_ffi_target(_DECODE_TARGET, jax.ffi.pycapsule(lib.LowbitDecodeCpu), platform="cpu")
                self.has_cuda = bool(lib.lowbit_jax_has_cuda())
                if self.has_cuda:
                    jax.ffi.register_ffi_target(_STEP_TARGET, jax.ffi.pycapsule(lib.LowbitStepCuda), platform="CUDA")
                self.path = path
                self.lib = lib
                return lib
            raise ImportError(
                "liblowbit_jax was not found (looked for " + ", ".join(tried) + "). It is built with the library "
                "when jax is importable at CMake configure time (`cmake --build <build> --target lowbit_jax`); "
                f"point {LIBRARY_ENV} at it, or LOWBIT_LIBRARY at a liblowbit.so in the same directory."
            )


_MODULE = _Module()


def library_path() -> str:
    """Path of the loaded liblowbit_jax (loading it if needed)."""
    _MODULE.load()
    return _MODULE.path

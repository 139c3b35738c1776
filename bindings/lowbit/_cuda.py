"""The few CUDA driver calls the bindings need, through ctypes (libcuda.so.1).

Only used for objects exposing ``__cuda_array_interface__``: to find which
device a pointer lives on, and to make the library's stream wait for the
producer's stream (CAI v3 ``stream``) with an event, without a host sync.
Nothing here runs unless such an object is passed.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_uint, c_void_p

_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_EVENT_DISABLE_TIMING = 2
_LEGACY = (None, 0, 1)  # NULL and CU_STREAM_LEGACY both mean the legacy default stream

_driver = None
_tried = False


def _lib():
    global _driver, _tried
    if not _tried:
        _tried = True
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
            try:
                _driver = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if _driver is not None and _driver.cuInit(0) != 0:
            _driver = None
    return _driver


def pointer_device(ptr: int):
    """CUDA ordinal of the device owning `ptr`, or None when unknown."""
    lib = _lib()
    if lib is None or not ptr:
        return None
    ordinal = c_int(-1)
    if lib.cuPointerGetAttribute(byref(ordinal), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_uint64(ptr)) != 0:
        return None
    return ordinal.value


def _check(rc, what):
    if rc != 0:
        from ._errors import CudaError

        raise CudaError(f"{what} failed with CUDA driver error {rc}")


def stream_wait(consumer, producer: int, device_index: int) -> None:
    """Make `consumer` wait (on the device) for the work queued on `producer`."""
    if (consumer in _LEGACY and producer in _LEGACY) or consumer == producer:
        return
    lib = _lib()
    if lib is None:
        from ._errors import CudaError

        raise CudaError("the array names a producer stream but the CUDA driver (libcuda) could not be loaded")
    dev = c_int()
    ctx = c_void_p()
    _check(lib.cuDeviceGet(byref(dev), c_int(device_index)), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    try:
        _check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            event = c_void_p()
            _check(lib.cuEventCreate(byref(event), c_uint(_CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
            try:
                _check(lib.cuEventRecord(event, c_void_p(producer or None)), "cuEventRecord")
                _check(lib.cuStreamWaitEvent(c_void_p(consumer or None), event, c_uint(0)), "cuStreamWaitEvent")
            finally:
                lib.cuEventDestroy_v2(event)
        finally:
            lib.cuCtxPopCurrent_v2(byref(c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)

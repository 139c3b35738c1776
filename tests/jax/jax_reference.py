"""Independent references for the JAX tests besides the update rules (those
are in tests/common/float64_reference.py, shared with tests/python): decoders
of the state formats written from the header's description (with the golden
maps of tests/c/qmaps_golden.h), and a driver of the raw C API
(lowbit_optimizer_*, through the package's CFFI declarations), so that the JAX
path can be compared with both."""

import pathlib
import re

import ml_dtypes
import numpy as np

from lowbit._ffi import ffi

ROOT = pathlib.Path(__file__).resolve().parents[2]

ALGORITHMS = {"adamw": 1, "adam": 2, "lion": 3, "sgd": 4}


# ----------------------------------------------------------------- formats


def _golden_maps():
    text = (ROOT / "tests" / "c" / "qmaps_golden.h").read_text()
    maps = {}
    for name, body in re.findall(r"golden_(\w+)\[\d+\]\s*=\s*\{([^}]*)\}", text):
        bits = np.array([int(x, 16) for x in re.findall(r"0x([0-9a-fA-F]+)", body)], dtype=np.uint32)
        maps[name] = bits.view(np.float32).astype(np.float64)
    return maps


MAPS = _golden_maps()
# (format, moment) -> sorted map values; the code is the index.
QMAP = {
    ("8bit", 0): MAPS["signed_dynamic_8bit"],
    ("8bit", 1): MAPS["unsigned_dynamic_8bit"],
    ("4bit", 0): MAPS["signed_dynamic_4bit"],
    ("4bit", 1): MAPS["unsigned_linear_nozero_4bit"],
}
BLOCK = {"8bit": 256, "4bit": 128, "fp8": 256}


def unpack4(packed, n):
    packed = np.asarray(packed, np.uint8)
    codes = np.empty(2 * packed.size, np.uint8)
    codes[0::2] = packed & 0xF
    codes[1::2] = packed >> 4
    return codes[:n]


def codes_of(fmt, data, n):
    return unpack4(data, n) if fmt == "4bit" else np.asarray(data, np.uint8)[:n]


def decode(fmt, moment, data, scales, n):
    """Float64 values of a stored moment of n elements."""
    data = np.asarray(data)
    if fmt == "fp32":
        return data.astype(np.float64)
    if fmt == "bf16":
        return data.astype(np.float64)
    s = np.repeat(np.asarray(scales, np.float64), BLOCK[fmt])[:n]
    if fmt == "fp8":
        return np.asarray(data, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64) * s
    return QMAP[(fmt, moment)][codes_of(fmt, data, n)] * s


def check_quantized(fmt, moment, data, scales, exact, n):
    """The stored moment is a correct encoding of `exact` (float64): block
    scales are the absmax (fp8: absmax / 448) and every element decodes to a
    nearest representable value of its block (up to float32 rounding)."""
    exact = np.asarray(exact, np.float64)
    blk = BLOCK[fmt]
    nb = -(-n // blk)
    pad = np.zeros(nb * blk)
    pad[:n] = np.abs(exact)
    absmax = pad.reshape(nb, blk).max(axis=1)
    scales = np.asarray(scales, np.float64)
    want_scale = absmax / 448.0 if fmt == "fp8" else absmax
    np.testing.assert_allclose(scales, want_scale, rtol=2e-6, err_msg=f"{fmt} block scales")
    s = np.repeat(scales, blk)[:n]
    x = np.divide(exact, s, out=np.zeros(n), where=s > 0)
    if fmt == "fp8":
        got = np.asarray(data, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        nearest = x.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        slack = 1e-5 * np.abs(x) + 1e-12
    else:
        values = QMAP[(fmt, moment)]
        got = values[codes_of(fmt, data, n)]
        nearest = values[np.abs(x[:, None] - values[None, :]).argmin(axis=1)]
        slack = 1e-6
    bad = np.abs(x - got) > np.abs(x - nearest) + slack
    assert not bad.any(), (
        f"{fmt} moment {moment}: {bad.sum()} of {n} codes are not a nearest code, e.g. x={x[bad][:3]} "
        f"got {got[bad][:3]} nearest {nearest[bad][:3]}"
    )


def bf16_ecc_value(w_bits, e):
    """float64 value of a bfloat16 weight (uint16 bits) with its error-correction byte."""
    w_bits = np.asarray(w_bits, np.uint16)
    exp = (w_bits.astype(np.int64) >> 7) & 0xFF
    ulp_log2 = np.maximum(exp, 1) - 134
    w = w_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return w + np.asarray(e, np.uint8).view(np.int8).astype(np.float64) * np.exp2(ulp_log2 - 8.0), np.exp2(
        ulp_log2.astype(np.float64)
    )


# ----------------------------------------------------------------- C API driver

_DTYPES = {np.dtype(np.float32): 1, np.dtype(ml_dtypes.bfloat16): 2, np.dtype(np.float16): 3}
FORMATS = {"fp32": 1, "bf16": 2, "8bit": 3, "4bit": 4, "fp8": 5}


def _tensor(a):
    return {"data": ffi.cast("void *", a.ctypes.data), "numel": a.size, "dtype": _DTYPES[a.dtype], "device": 1, "device_index": 0}


class CapiOptimizer:
    """A lowbit_optimizer_t over copies of `params` (numpy arrays), driven
    through the raw C calls (CFFI, the package's declarations); raises
    AssertionError with the library's message on failure."""

    def __init__(self, lib, algo, hparams, params, **config):
        self.lib = lib
        cfg = ffi.new("lowbit_optimizer_config_t *")
        self._ok(lib.lowbit_optimizer_config_init(cfg, ALGORITHMS[algo]))
        for k, v in config.items():
            setattr(cfg, k, FORMATS[v] if k.endswith("state_format") else v)
        hp = ffi.new("lowbit_hparams_t *")
        self._ok(lib.lowbit_hparams_init(hp, ALGORITHMS[algo]))
        for k, v in hparams.items():
            setattr(hp, k, v)
        handle = ffi.new("lowbit_optimizer_t *")
        self._ok(lib.lowbit_optimizer_create(handle, cfg, hp))
        self.h = handle[0]
        self.params = [np.array(p, copy=True, order="C").reshape(-1) for p in params]
        for p in self.params:
            pc = ffi.new("lowbit_param_config_t *")
            self._ok(lib.lowbit_param_config_init(pc))
            pc.param = _tensor(p)
            pid = ffi.new("int64_t *")
            self._ok(lib.lowbit_optimizer_add_param(self.h, pc, pid))

    def _ok(self, status):
        if status != 0:
            h = getattr(self, "h", None)
            msg = self.lib.lowbit_optimizer_last_error(h) if h else self.lib.lowbit_last_error()
            raise AssertionError(f"C API call failed with status {status}: {ffi.string(msg).decode()}")

    def set_lr(self, lr):
        self._ok(self.lib.lowbit_optimizer_set_lr(self.h, 0, float(lr)))

    def step(self, grads):
        grads = [np.ascontiguousarray(g).reshape(-1) for g in grads]
        arr = ffi.new("lowbit_tensor_t[]", [_tensor(g) for g in grads])
        self._ok(self.lib.lowbit_optimizer_step_with_grads(self.h, arr, len(grads), ffi.NULL))

    def read_moment(self, i, m):
        out = np.empty(self.params[i].size, np.float32)
        self._ok(self.lib.lowbit_optimizer_read_moment(self.h, i, m, ffi.from_buffer("float[]", out), out.size,
                                                       ffi.NULL))
        return out

    def info(self, i):
        info = ffi.new("lowbit_param_info_t *")
        info.struct_size = ffi.sizeof(info[0])
        self._ok(self.lib.lowbit_optimizer_param_info(self.h, i, info))
        return info

    def close(self):
        if self.h:
            self.lib.lowbit_optimizer_destroy(self.h)
            self.h = None

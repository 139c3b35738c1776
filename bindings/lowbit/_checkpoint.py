"""Reading and writing lowbit checkpoints (format version 1) in Python.

The library writes and validates checkpoints (lowbit_optimizer_save/load);
this module only needs to build *materialized fp32* checkpoints from moments
held elsewhere (e.g. a plain ``torch.optim.AdamW`` state dict), which the
library then loads and converts to the optimizer's own state formats, with
all of its checks. The layout (all integers little-endian), as written by
core/checkpoint.cpp:

    "LOWBITCK" u32 version u32 mode u32 algorithm u32 num_groups
    u64 total_size u64 num_params u64 seed i64 freeze_step
    groups: f32 lr beta1 beta2 eps weight_decay momentum dampening, i32 nesterov bias_correction
    per param: i64 numel u32 param_dtype i32 group i64 step u32 rounding u32 num_moments
               per moment: u32 format u32 block u64 data_bytes u64 scale_bytes data scales
               u64 ecc_bytes ecc
               u32 crc32 of this param record
    u32 crc32 of everything before it
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from ._capi import CheckpointMode, StateFormat
from ._lib import CorruptDataError, VersionMismatchError

MAGIC = b"LOWBITCK"
VERSION = 1
_HEADER = struct.Struct("<8sIIIIQQQq")
_GROUP = struct.Struct("<7f2i")
_PARAM = struct.Struct("<qIiqII")
_MOMENT = struct.Struct("<IIQQ")
_TOTAL_SIZE_OFFSET = struct.calcsize("<8sIIII")


@dataclass
class Moment:
    format: int
    block: int
    data: bytes
    scales: bytes

    def values(self, numel: int) -> np.ndarray:
        """fp32 values of a materialized (fp32 or bf16) moment."""
        if self.format == StateFormat.FP32:
            return np.frombuffer(self.data, dtype="<f4", count=numel).astype(np.float32)
        if self.format == StateFormat.BF16:
            bits = np.frombuffer(self.data, dtype="<u2", count=numel).astype(np.uint32) << 16
            return bits.view(np.float32)
        raise ValueError(f"moment format {self.format} is quantized; save with mode='fp32' to read values")


@dataclass
class Param:
    numel: int
    param_dtype: int
    group: int
    step: int
    rounding: int
    moments: list = field(default_factory=list)
    ecc: bytes = b""


@dataclass
class Checkpoint:
    mode: int
    algorithm: int
    seed: int
    freeze_step: int
    groups: list  # tuples (lr, beta1, beta2, eps, weight_decay, momentum, dampening, nesterov, bias_correction)
    params: list


def parse(blob: bytes) -> Checkpoint:
    mv = memoryview(blob).cast("B")
    if len(mv) < _HEADER.size + 4:
        raise CorruptDataError("checkpoint is truncated")
    magic, version, mode, algorithm, num_groups, total, num_params, seed, freeze_step = _HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CorruptDataError("not a lowbit checkpoint (bad magic)")
    if version != VERSION:
        raise VersionMismatchError(f"checkpoint format version {version} is not supported (reads {VERSION})")
    if total != len(mv):
        raise CorruptDataError(f"checkpoint size {len(mv)} differs from its header's {total}")
    if zlib.crc32(mv[:-4]) != struct.unpack_from("<I", mv, len(mv) - 4)[0]:
        raise CorruptDataError("checkpoint checksum mismatch")
    pos = _HEADER.size
    groups = []
    for _ in range(num_groups):
        groups.append(_GROUP.unpack_from(mv, pos))
        pos += _GROUP.size
    params = []
    for _ in range(num_params):
        start = pos
        numel, dtype, group, step, rounding, num_moments = _PARAM.unpack_from(mv, pos)
        pos += _PARAM.size
        p = Param(numel, dtype, group, step, rounding)
        for _m in range(num_moments):
            fmt, block, data_bytes, scale_bytes = _MOMENT.unpack_from(mv, pos)
            pos += _MOMENT.size
            data = bytes(mv[pos:pos + data_bytes])
            pos += data_bytes
            scales = bytes(mv[pos:pos + scale_bytes])
            pos += scale_bytes
            p.moments.append(Moment(fmt, block, data, scales))
        (ecc_bytes,) = struct.unpack_from("<Q", mv, pos)
        pos += 8
        p.ecc = bytes(mv[pos:pos + ecc_bytes])
        pos += ecc_bytes
        (crc,) = struct.unpack_from("<I", mv, pos)
        if zlib.crc32(mv[start:pos]) != crc:
            raise CorruptDataError("checkpoint param record checksum mismatch")
        pos += 4
        params.append(p)
    return Checkpoint(mode, algorithm, seed, freeze_step, groups, params)


def build(ck: Checkpoint) -> bytes:
    out = bytearray(_HEADER.pack(MAGIC, VERSION, ck.mode, ck.algorithm, len(ck.groups), 0, len(ck.params),
                                 ck.seed, ck.freeze_step))
    for g in ck.groups:
        out += _GROUP.pack(*g)
    for p in ck.params:
        start = len(out)
        out += _PARAM.pack(p.numel, p.param_dtype, p.group, p.step, p.rounding, len(p.moments))
        for m in p.moments:
            out += _MOMENT.pack(m.format, m.block, len(m.data), len(m.scales))
            out += m.data
            out += m.scales
        out += struct.pack("<Q", len(p.ecc))
        out += p.ecc
        out += struct.pack("<I", zlib.crc32(out[start:]))
    struct.pack_into("<Q", out, _TOTAL_SIZE_OFFSET, len(out) + 4)
    out += struct.pack("<I", zlib.crc32(out))
    return bytes(out)


def fp32_moment(values) -> Moment:
    """A materialized fp32 moment from any array-like of numel values."""
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1)).astype("<f4", copy=False)
    return Moment(int(StateFormat.FP32), 1, arr.tobytes(), b"")


MATERIALIZED_FP32 = int(CheckpointMode.MATERIALIZED_FP32)

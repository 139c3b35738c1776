"""ctypes declarations of the lowbit C API, written once.

This module mirrors ``capi/lowbit.h`` (and ``capi/lowbit_comm.h``) exactly:
enums, struct layouts and function signatures. ``tests/python/test_header_drift.py``
parses the headers and fails if anything here is missing or differs, so edit
this file together with the headers.

Nothing here loads the library; :func:`bind` attaches the signatures to a loaded
``ctypes.CDLL``.
"""

from __future__ import annotations

import ctypes
import enum
import re
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint64,
    c_void_p,
)

# ----------------------------------------------------------------- enums
# C enums are int-sized on every ABI we target; they cross as c_int.
c_enum = c_int


class Status(enum.IntEnum):
    SUCCESS = 0
    ERROR_INVALID_ARGUMENT = 1
    ERROR_NULL_POINTER = 2
    ERROR_UNSUPPORTED = 3
    ERROR_OUT_OF_MEMORY = 4
    ERROR_INVALID_STATE = 5
    ERROR_CUDA = 6
    ERROR_IO = 7
    ERROR_CORRUPT_DATA = 8
    ERROR_VERSION_MISMATCH = 9
    ERROR_STATE_MISMATCH = 10
    ERROR_BUFFER_TOO_SMALL = 11
    ERROR_NONFINITE = 12
    ERROR_COMMUNICATION = 13
    ERROR_INTERNAL = 14
    STATUS_FORCE_INT32 = 0x7FFFFFFF  # makes the C enum 32 bits wide
    STATUS_FORCE_INT32_MIN = -0x7FFFFFFF


class Dtype(enum.IntEnum):
    FLOAT32 = 1
    BFLOAT16 = 2
    FLOAT16 = 3
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class Device(enum.IntEnum):
    CPU = 1
    CUDA = 2
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class Algorithm(enum.IntEnum):
    ADAMW = 1
    ADAM = 2
    LION = 3
    SGD = 4
    ONEBIT_ADAM = 5
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class StateFormat(enum.IntEnum):
    DEFAULT = 0
    FP32 = 1
    BF16 = 2
    BIT8 = 3  # LOWBIT_STATE_8BIT (a Python name cannot start with a digit)
    BIT4 = 4  # LOWBIT_STATE_4BIT
    FP8 = 5
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class Rounding(enum.IntEnum):
    NEAREST = 0
    STOCHASTIC = 1
    ERROR_CORRECTION = 2
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class CheckpointMode(enum.IntEnum):
    COMPRESSED = 1
    MATERIALIZED_FP32 = 2
    MATERIALIZED_BF16 = 3
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class CommBackend(enum.IntEnum):
    MPI = 1
    NCCL = 2
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


class CommCudaAware(enum.IntEnum):
    AUTO = -1
    NEVER = 0
    ALWAYS = 1
    FORCE_INT32 = 0x7FFFFFFF
    FORCE_INT32_MIN = -0x7FFFFFFF


NCCL_UNIQUE_ID_BYTES = 128

# C enum type name -> (Python enum, C constant prefix, {C suffix: Python member name}
# for the suffixes that are not valid Python identifiers).
ENUMS = {
    "lowbit_status_t": (Status, "LOWBIT_", {}),
    "lowbit_dtype_t": (Dtype, "LOWBIT_DTYPE_", {}),
    "lowbit_device_t": (Device, "LOWBIT_DEVICE_", {}),
    "lowbit_algorithm_t": (Algorithm, "LOWBIT_ALGORITHM_", {}),
    "lowbit_state_format_t": (StateFormat, "LOWBIT_STATE_", {"8BIT": "BIT8", "4BIT": "BIT4"}),
    "lowbit_rounding_t": (Rounding, "LOWBIT_ROUNDING_", {}),
    "lowbit_checkpoint_mode_t": (CheckpointMode, "LOWBIT_CHECKPOINT_", {}),
    # lowbit_comm.h
    "lowbit_comm_backend_t": (CommBackend, "LOWBIT_COMM_BACKEND_", {}),
    "lowbit_comm_cuda_aware_t": (CommCudaAware, "LOWBIT_COMM_CUDA_AWARE_", {}),
}

# Integer macros of the headers (name -> value). The version macros live in
# the generated lowbit_version.h; Python reads the version from the library
# (lowbit.version()).
MACROS = {
    "LOWBIT_NCCL_UNIQUE_ID_BYTES": NCCL_UNIQUE_ID_BYTES,
}


# ----------------------------------------------------------------- declarations
# Everything below is written with the header's own C spelling, once; the
# ctypes types are derived from it by ctype_of(). The drift test compares these
# tables with the parsed header text and checks the ctypes layouts against the
# C compiler's sizeof/offsetof.

# typedef struct name -> [(C type, field name)], in declaration order.
STRUCT_DECLS = {
    "lowbit_tensor_t": [
        ("void*", "data"),
        ("int64_t", "numel"),
        ("lowbit_dtype_t", "dtype"),
        ("lowbit_device_t", "device"),
        ("int32_t", "device_index"),
    ],
    "lowbit_hparams_t": [
        ("size_t", "struct_size"),
        ("float", "lr"),
        ("float", "beta1"),
        ("float", "beta2"),
        ("float", "eps"),
        ("float", "weight_decay"),
        ("float", "momentum"),
        ("float", "dampening"),
        ("int32_t", "nesterov"),
        ("int32_t", "bias_correction"),
    ],
    "lowbit_optimizer_config_t": [
        ("size_t", "struct_size"),
        ("lowbit_algorithm_t", "algorithm"),
        ("lowbit_device_t", "device"),
        ("int32_t", "device_index"),
        ("lowbit_state_format_t", "state_format"),
        ("lowbit_state_format_t", "second_state_format"),
        ("int64_t", "min_quantized_numel"),
        ("uint64_t", "seed"),
        ("int32_t", "stochastic_rounding"),
        ("int32_t", "error_correction"),
        ("int32_t", "skip_nonfinite"),
        ("int32_t", "num_threads"),
        ("int64_t", "freeze_step"),
    ],
    "lowbit_param_config_t": [
        ("size_t", "struct_size"),
        ("lowbit_tensor_t", "param"),
        ("lowbit_tensor_t", "grad"),
        ("int32_t", "group"),
        ("lowbit_state_format_t", "state_format"),
        ("lowbit_state_format_t", "second_state_format"),
        ("int32_t", "stochastic_rounding"),
        ("int32_t", "error_correction"),
    ],
    "lowbit_state_plan_t": [
        ("size_t", "struct_size"),
        ("int32_t", "num_moments"),
        ("lowbit_state_format_t[2]", "format"),
        ("int64_t[2]", "block_size"),
        ("int64_t[2]", "data_bytes"),
        ("int64_t[2]", "scale_count"),
        ("lowbit_rounding_t", "rounding"),
        ("int64_t", "ecc_bytes"),
        ("int64_t", "state_bytes"),
    ],
    "lowbit_param_info_t": [
        ("size_t", "struct_size"),
        ("int64_t", "numel"),
        ("int64_t", "step"),
        ("int32_t", "group"),
        ("lowbit_dtype_t", "param_dtype"),
        ("lowbit_state_format_t", "state_format"),
        ("lowbit_state_format_t", "second_state_format"),
        ("int32_t", "stochastic_rounding"),
        ("int32_t", "error_correction"),
        ("int64_t", "state_bytes"),
    ],
    # lowbit_comm.h
    "lowbit_comm_config_t": [
        ("size_t", "struct_size"),
        ("int32_t", "cuda_aware_mpi"),
    ],
    "lowbit_comm_info_t": [
        ("size_t", "struct_size"),
        ("lowbit_comm_backend_t", "backend"),
        ("int32_t", "rank"),
        ("int32_t", "world_size"),
        ("int32_t", "cuda_aware_mpi"),
        ("int32_t", "device_index"),
        ("int64_t", "bound_numel"),
        ("lowbit_device_t", "bound_device"),
        ("int64_t", "padded_numel"),
        ("int64_t", "chunk_numel"),
    ],
    "lowbit_comm_stats_t": [
        ("size_t", "struct_size"),
        ("int64_t", "compressed_calls"),
        ("int64_t", "compressed_elements"),
        ("int64_t", "compressed_bytes_sent"),
        ("int64_t", "mean_calls"),
        ("int64_t", "mean_elements"),
        ("int64_t", "mean_bytes_sent"),
    ],
}

# Opaque handle typedefs (pointers to incomplete structs).
OPAQUE_HANDLES = ["lowbit_optimizer_t", "lowbit_comm_t"]

# name -> (C return type, [C parameter types]), in header order.
FUNCTION_DECLS = {
    # lowbit.h
    "lowbit_status_string": ("const char*", ["lowbit_status_t"]),
    "lowbit_last_error": ("const char*", []),
    "lowbit_version": ("int", []),
    "lowbit_has_cuda": ("int", []),
    "lowbit_has_mpi": ("int", []),
    "lowbit_has_nccl": ("int", []),
    "lowbit_hparams_init": ("lowbit_status_t", ["lowbit_hparams_t*", "lowbit_algorithm_t"]),
    "lowbit_optimizer_config_init": ("lowbit_status_t", ["lowbit_optimizer_config_t*", "lowbit_algorithm_t"]),
    "lowbit_optimizer_create": (
        "lowbit_status_t",
        ["lowbit_optimizer_t*", "const lowbit_optimizer_config_t*", "const lowbit_hparams_t*"],
    ),
    "lowbit_optimizer_destroy": ("lowbit_status_t", ["lowbit_optimizer_t"]),
    "lowbit_optimizer_last_error": ("const char*", ["lowbit_optimizer_t"]),
    "lowbit_optimizer_add_group": ("lowbit_status_t", ["lowbit_optimizer_t", "const lowbit_hparams_t*", "int32_t*"]),
    "lowbit_optimizer_set_hparams": ("lowbit_status_t", ["lowbit_optimizer_t", "int32_t", "const lowbit_hparams_t*"]),
    "lowbit_optimizer_get_hparams": ("lowbit_status_t", ["lowbit_optimizer_t", "int32_t", "lowbit_hparams_t*"]),
    "lowbit_optimizer_set_lr": ("lowbit_status_t", ["lowbit_optimizer_t", "int32_t", "float"]),
    "lowbit_param_config_init": ("lowbit_status_t", ["lowbit_param_config_t*"]),
    "lowbit_optimizer_add_param": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "const lowbit_param_config_t*", "int64_t*"],
    ),
    "lowbit_optimizer_set_grad": ("lowbit_status_t", ["lowbit_optimizer_t", "int64_t", "const lowbit_tensor_t*"]),
    "lowbit_optimizer_step": ("lowbit_status_t", ["lowbit_optimizer_t", "void*"]),
    "lowbit_optimizer_step_with_grads": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "const lowbit_tensor_t*", "int64_t", "void*"],
    ),
    "lowbit_optimizer_set_comm": ("lowbit_status_t", ["lowbit_optimizer_t", "lowbit_comm_t"]),
    "lowbit_optimizer_set_momentum_mask": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "int64_t", "const uint8_t*", "int64_t"],
    ),
    "lowbit_optimizer_last_step_skipped": ("lowbit_status_t", ["lowbit_optimizer_t", "int32_t*"]),
    "lowbit_optimizer_num_params": ("lowbit_status_t", ["lowbit_optimizer_t", "int64_t*"]),
    "lowbit_optimizer_param_info": ("lowbit_status_t", ["lowbit_optimizer_t", "int64_t", "lowbit_param_info_t*"]),
    "lowbit_optimizer_state_bytes": ("lowbit_status_t", ["lowbit_optimizer_t", "int64_t", "int64_t*"]),
    "lowbit_optimizer_read_moment": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "int64_t", "int32_t", "float*", "int64_t", "void*"],
    ),
    "lowbit_optimizer_write_moment": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "int64_t", "int32_t", "const float*", "int64_t", "void*"],
    ),
    "lowbit_optimizer_set_step": ("lowbit_status_t", ["lowbit_optimizer_t", "int64_t", "int64_t", "void*"]),
    "lowbit_optimizer_device_hparams": ("lowbit_status_t", ["lowbit_optimizer_t", "int32_t", "lowbit_hparams_t**"]),
    "lowbit_plan_param_state": (
        "lowbit_status_t",
        ["const lowbit_optimizer_config_t*", "const lowbit_hparams_t*", "const lowbit_param_config_t*",
         "lowbit_state_plan_t*"],
    ),
    "lowbit_optimizer_save": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "lowbit_checkpoint_mode_t", "void*", "int64_t", "int64_t*", "void*"],
    ),
    "lowbit_optimizer_save_file": (
        "lowbit_status_t",
        ["lowbit_optimizer_t", "lowbit_checkpoint_mode_t", "const char*", "void*"],
    ),
    "lowbit_optimizer_load": ("lowbit_status_t", ["lowbit_optimizer_t", "const void*", "int64_t", "void*"]),
    "lowbit_optimizer_load_file": ("lowbit_status_t", ["lowbit_optimizer_t", "const char*", "void*"]),
    # lowbit_comm.h
    "lowbit_comm_config_init": ("lowbit_status_t", ["lowbit_comm_config_t*"]),
    "lowbit_comm_create_mpi": (
        "lowbit_status_t",
        ["lowbit_comm_t*", "const void*", "const lowbit_comm_config_t*"],
    ),
    "lowbit_comm_create_mpi_fortran": (
        "lowbit_status_t",
        ["lowbit_comm_t*", "int64_t", "const lowbit_comm_config_t*"],
    ),
    "lowbit_comm_nccl_unique_id": ("lowbit_status_t", ["void*", "int64_t"]),
    "lowbit_comm_create_nccl": (
        "lowbit_status_t",
        ["lowbit_comm_t*", "const void*", "int32_t", "int32_t", "int32_t", "const lowbit_comm_config_t*"],
    ),
    "lowbit_comm_create_nccl_comm": ("lowbit_status_t", ["lowbit_comm_t*", "void*", "const lowbit_comm_config_t*"]),
    "lowbit_comm_destroy": ("lowbit_status_t", ["lowbit_comm_t"]),
    "lowbit_comm_last_error": ("const char*", ["lowbit_comm_t"]),
    "lowbit_comm_rank": ("lowbit_status_t", ["lowbit_comm_t", "int32_t*"]),
    "lowbit_comm_world_size": ("lowbit_status_t", ["lowbit_comm_t", "int32_t*"]),
    "lowbit_comm_get_info": ("lowbit_status_t", ["lowbit_comm_t", "lowbit_comm_info_t*"]),
    "lowbit_comm_compressed_allreduce": ("lowbit_status_t", ["lowbit_comm_t", "const lowbit_tensor_t*", "void*"]),
    "lowbit_comm_allreduce_mean": ("lowbit_status_t", ["lowbit_comm_t", "const lowbit_tensor_t*", "void*"]),
    "lowbit_comm_last_nonfinite": ("lowbit_status_t", ["lowbit_comm_t", "int32_t*"]),
    "lowbit_comm_error_numel": ("lowbit_status_t", ["lowbit_comm_t", "int64_t*", "int64_t*"]),
    "lowbit_comm_read_errors": (
        "lowbit_status_t",
        ["lowbit_comm_t", "float*", "int64_t", "float*", "int64_t", "void*"],
    ),
    "lowbit_comm_save_errors": ("lowbit_status_t", ["lowbit_comm_t", "void*", "int64_t", "int64_t*", "void*"]),
    "lowbit_comm_load_errors": ("lowbit_status_t", ["lowbit_comm_t", "const void*", "int64_t", "void*"]),
    "lowbit_comm_reset_errors": ("lowbit_status_t", ["lowbit_comm_t", "void*"]),
    "lowbit_comm_get_stats": ("lowbit_status_t", ["lowbit_comm_t", "lowbit_comm_stats_t*"]),
    "lowbit_comm_reset_stats": ("lowbit_status_t", ["lowbit_comm_t"]),
}

# Headers that this module mirrors, and the declarations each one holds. A
# header that does not exist yet (the communicator) simply has no entries.
def _of(header, names):
    comm = [n for n in names if n.startswith(("lowbit_comm_", "LOWBIT_COMM_", "LOWBIT_NCCL_"))
            and n != "lowbit_comm_t"]
    return comm if header == "lowbit_comm.h" else [n for n in names if n not in comm]


HEADERS = {
    h: {
        "enums": _of(h, ENUMS),
        "structs": _of(h, STRUCT_DECLS),
        "handles": _of(h, OPAQUE_HANDLES),
        "functions": _of(h, FUNCTION_DECLS),
        "macros": _of(h, MACROS),
    }
    for h in ("lowbit.h", "lowbit_comm.h")
}

# ----------------------------------------------------------------- ctypes types

C_SCALARS = {
    "int": c_int,
    "float": c_float,
    "double": c_double,
    "size_t": c_size_t,
    "int32_t": c_int32,
    "int64_t": c_int64,
    "uint8_t": c_uint8,
    "uint64_t": c_uint64,
}

_STRUCT_TYPES: dict = {}


def ctype_of(ctype: str):
    """The ctypes type for a C type spelled as in the header."""
    t = ctype.strip()
    array = re.fullmatch(r"(.*)\[(\d+)\]", t)
    if array:
        return ctype_of(array.group(1)) * int(array.group(2))
    if t.startswith("const "):
        t = t[len("const "):].strip()
    if t.endswith("*"):
        base = t[:-1].strip()
        if base == "void":
            return c_void_p
        if base == "char":
            return c_char_p
        return POINTER(ctype_of(base))
    if t in C_SCALARS:
        return C_SCALARS[t]
    if t in ENUMS:
        return c_enum
    if t in OPAQUE_HANDLES:
        return c_void_p
    if t in STRUCT_DECLS:
        return _struct_type(t)
    raise TypeError(f"lowbit._capi: no ctypes mapping for C type {ctype!r}")


def _struct_type(name: str):
    if name not in _STRUCT_TYPES:
        cls_name = "".join(part.capitalize() for part in name[len("lowbit_"):-len("_t")].split("_"))
        fields = [(field, ctype_of(ctype)) for ctype, field in STRUCT_DECLS[name]]
        _STRUCT_TYPES[name] = type(cls_name, (ctypes.Structure,), {"_fields_": fields, "__doc__": name})
    return _STRUCT_TYPES[name]


Tensor = _struct_type("lowbit_tensor_t")
Hparams = _struct_type("lowbit_hparams_t")
OptimizerConfig = _struct_type("lowbit_optimizer_config_t")
ParamConfig = _struct_type("lowbit_param_config_t")
ParamInfo = _struct_type("lowbit_param_info_t")
StatePlan = _struct_type("lowbit_state_plan_t")
CommConfig = _struct_type("lowbit_comm_config_t")
CommInfo = _struct_type("lowbit_comm_info_t")
CommStats = _struct_type("lowbit_comm_stats_t")

# name -> (restype, [argtypes]) derived from FUNCTION_DECLS.
FUNCTIONS = {
    name: (ctype_of(ret), [ctype_of(a) for a in args]) for name, (ret, args) in FUNCTION_DECLS.items()
}


def bind(lib: ctypes.CDLL) -> list:
    """Attach restype/argtypes to every function of FUNCTIONS that `lib` exports.

    Returns the names the library does not export (the caller decides)."""
    missing = []
    for name, (restype, argtypes) in FUNCTIONS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return missing

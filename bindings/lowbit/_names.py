"""The one home of the names every entry point accepts (lowbit.Optimizer,
lowbit.torch, lowbit.jax) and of their parsers: algorithms, state formats,
normalisations, the presets of the C API (lowbit_preset_t, whose formats and
normalisations the library gives), checkpoint modes, devices, CUDA streams,
thread counts, and the integers handed to the library's C types.

Every parser raises :class:`lowbit.InvalidArgumentError` (a ValueError)
naming the argument and the value."""

from __future__ import annotations

import functools
import operator
import os

import numpy as np

from ._errors import InvalidArgumentError
from ._ffi import ENUMS, Algorithm, CheckpointMode, Device, Normalization, StateFormat, ffi
from ._lib import call

Preset = ENUMS["lowbit_preset_t"]  # LPMM_ADAMW_4BIT, ADAMW_4BIT_FACTOR, ADAMW_4BIT_SR, ADAMW_4BIT_SR_DYN
# Muon's enums (since 0.7; absent from an older library's declarations)
MuonLrAdjust = ENUMS.get("lowbit_muon_lr_adjust_t")  # ORIGINAL, MATCH_RMS_ADAMW, SPECTRAL_UNCLAMPED, NONE
NsPrecision = ENUMS.get("lowbit_ns_precision_t")  # DEFAULT, FP32, BF16

# ----------------------------------------------------------------- integers for the C types


def c_int(value, arg: str, ctype: str = "int64_t") -> int:
    """`value` as a Python int that fits the declared C integer type `ctype`
    (its size from the declarations): ints and numpy integers, and floats
    with an integral value; anything else (1.5, "3", True) and values out of
    the type's range raise InvalidArgumentError naming `arg`."""
    if isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{arg}={value!r} is not an integer")
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value) or not float(value).is_integer():
            raise InvalidArgumentError(f"{arg}={value!r} is not an integer")
        v = int(value)
    else:
        try:
            v = operator.index(value)
        except TypeError:
            raise InvalidArgumentError(f"{arg}={value!r} is not an integer") from None
    lo, hi = _int_range(ctype)
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{arg}={v} does not fit the library's {ctype} (range [{lo}, {hi}])")
    return v


@functools.lru_cache(maxsize=None)
def _int_range(ctype: str) -> tuple:
    bits = 8 * ffi.sizeof(ctype)
    if ctype.startswith("u"):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def parse_seed(seed) -> int:
    """A seed as the library's uint64_t: an integer in [-2^63, 2^64),
    negative ones taken modulo 2^64."""
    try:
        return c_int(seed, "seed", "uint64_t")
    except InvalidArgumentError:
        return c_int(seed, "seed", "int64_t") & ((1 << 64) - 1)


# ----------------------------------------------------------------- algorithms

ALGORITHMS = {
    "adamw": Algorithm.ADAMW,
    "adam": Algorithm.ADAM,
    "lion": Algorithm.LION,
    "sgd": Algorithm.SGD,
    "onebit_adam": Algorithm.ONEBIT_ADAM,
    "1bit_adam": Algorithm.ONEBIT_ADAM,
    "zeroone_adam": Algorithm.ZEROONE_ADAM,
    "0/1_adam": Algorithm.ZEROONE_ADAM,
    "onebit_lamb": Algorithm.ONEBIT_LAMB,
    "1bit_lamb": Algorithm.ONEBIT_LAMB,
}
if hasattr(Algorithm, "MUON"):  # since 0.7
    ALGORITHMS["muon"] = Algorithm.MUON
# Since 0.8 every algorithm's name comes from its descriptor (lowbit_algorithm_info).
for _algo in Algorithm:
    if _algo.name.endswith("FORCE_INT32") or _algo.name.endswith("FORCE_INT32_MIN") or _algo in ALGORITHMS.values():
        continue
    try:
        from ._algorithms import algorithm_spec

        ALGORITHMS[algorithm_spec(_algo).name] = _algo
    except Exception:  # a library without the descriptors
        ALGORITHMS[_algo.name.lower()] = _algo
#: The algorithms a Muon optimizer's group may take instead of Muon (the hybrid:
#: 1-D params, embeddings, heads stepped in the same optimizer).
MUON_GROUP_ALGORITHMS = (Algorithm.ADAMW, Algorithm.ADAM, Algorithm.LION, Algorithm.SGD)
#: The algorithms that exchange through a communicator (lowbit_optimizer_set_comm).
ONEBIT_ALGORITHMS = (Algorithm.ONEBIT_ADAM, Algorithm.ZEROONE_ADAM, Algorithm.ONEBIT_LAMB)


def parse_algorithm(algorithm) -> Algorithm:
    if isinstance(algorithm, Algorithm):
        return algorithm
    if isinstance(algorithm, int) and not isinstance(algorithm, bool):
        try:
            return Algorithm(algorithm)
        except ValueError:
            raise InvalidArgumentError(f"algorithm={algorithm!r} is not a lowbit algorithm") from None
    key = str(algorithm).lower()
    if key not in ALGORITHMS:
        raise InvalidArgumentError(f"algorithm={algorithm!r} is not one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[key]


def algorithm_name(algorithm) -> str:
    """The package's name of an Algorithm ("adamw", "muon", ...)."""
    return Algorithm(int(algorithm)).name.lower()


# ----------------------------------------------------------------- Muon's options

#: torch.optim.Muon's adjust_lr_fn names (None and "original": its default) and
#: "none" (the lr as given) -> lowbit_muon_lr_adjust_t.
MUON_LR_ADJUSTS = {}
MUON_LR_ADJUST_NAMES = {}
#: How Muon's Newton-Schulz products are rounded -> lowbit_ns_precision_t.
NS_PRECISIONS = {}
NS_PRECISION_NAMES = {}
if MuonLrAdjust is not None:
    MUON_LR_ADJUSTS = {None: MuonLrAdjust.ORIGINAL, "original": MuonLrAdjust.ORIGINAL,
                       "match_rms_adamw": MuonLrAdjust.MATCH_RMS_ADAMW,
                       "spectral_unclamped": MuonLrAdjust.SPECTRAL_UNCLAMPED, "none": MuonLrAdjust.NONE}
    MUON_LR_ADJUST_NAMES = {MuonLrAdjust.ORIGINAL: "original", MuonLrAdjust.MATCH_RMS_ADAMW: "match_rms_adamw",
                            MuonLrAdjust.SPECTRAL_UNCLAMPED: "spectral_unclamped", MuonLrAdjust.NONE: "none"}
if NsPrecision is not None:
    NS_PRECISIONS = {None: NsPrecision.DEFAULT, "default": NsPrecision.DEFAULT, "fp32": NsPrecision.FP32,
                     "float32": NsPrecision.FP32, "bf16": NsPrecision.BF16, "bfloat16": NsPrecision.BF16}
    NS_PRECISION_NAMES = {NsPrecision.DEFAULT: "default", NsPrecision.FP32: "fp32", NsPrecision.BF16: "bf16"}


def _parse_named(value, table, arg, enum_cls, what):
    if enum_cls is None:
        from ._errors import UnsupportedError

        raise UnsupportedError(f"{arg}: the loaded library has no {what} (Muon needs lowbit >= 0.7)")
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        try:
            return enum_cls(int(value))
        except ValueError:
            raise InvalidArgumentError(f"{arg}={value!r} is not a {what} value") from None
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, (list, dict, set, tuple)) or key not in table:
        raise InvalidArgumentError(f"{arg}={value!r} is not one of {_names(table)}"
                                   + (" (or None)" if None in table else ""))
    return table[key]


def parse_adjust_lr(value, arg="adjust_lr"):
    """A lowbit_muon_lr_adjust_t from torch.optim.Muon's adjust_lr_fn names
    (None / "original", "match_rms_adamw", "spectral_unclamped") or "none"
    (no adjustment)."""
    return _parse_named(value, MUON_LR_ADJUSTS, arg, MuonLrAdjust, "Muon lr adjustment")


def parse_ns_precision(value, arg="ns_precision"):
    """A lowbit_ns_precision_t from "default" (None; CPU fp32, CUDA bf16),
    "fp32" or "bf16" (torch.optim.Muon's rounding)."""
    return _parse_named(value, NS_PRECISIONS, arg, NsPrecision, "Newton-Schulz precision")


# ----------------------------------------------------------------- state formats, normalisations, presets

STATE_FORMATS = {
    None: StateFormat.DEFAULT,
    "default": StateFormat.DEFAULT,
    "fp32": StateFormat.FP32,
    "float32": StateFormat.FP32,
    "bf16": StateFormat.BF16,
    "bfloat16": StateFormat.BF16,
    "8bit": StateFormat.BIT8,
    "int8": StateFormat.BIT8,
    "4bit": StateFormat.BIT4,
    "int4": StateFormat.BIT4,
    "fp8": StateFormat.FP8,
    "e4m3": StateFormat.FP8,
    "4bit-sr": StateFormat.BIT4_SR,  # 4bit with stochastically rounded codes (issue 37)
    "int4-sr": StateFormat.BIT4_SR,
    "4bit-dyn": StateFormat.BIT4_DYN,  # 4bit, an unsigned moment on the dynamic-exponent map (issue 50)
}
STATE_FORMAT_NAMES = {
    StateFormat.DEFAULT: "default",
    StateFormat.FP32: "fp32",
    StateFormat.BF16: "bf16",
    StateFormat.BIT8: "8bit",
    StateFormat.BIT4: "4bit",
    StateFormat.FP8: "fp8",
    StateFormat.BIT4_SR: "4bit-sr",
    StateFormat.BIT4_DYN: "4bit-dyn",
}
# How a moment's quantized values are scaled (lowbit.h, "Shaped parameters").
NORMALIZATIONS = {
    None: Normalization.DEFAULT,
    "default": Normalization.DEFAULT,
    "block": Normalization.BLOCK,
    "blocks": Normalization.BLOCK,
    "rank1": Normalization.RANK1,
    "rank-1": Normalization.RANK1,
    "factored": Normalization.FACTORED,
    "factor": Normalization.FACTORED,
}
NORMALIZATION_NAMES = {Normalization.DEFAULT: "default", Normalization.BLOCK: "block",
                       Normalization.RANK1: "rank1", Normalization.FACTORED: "factored"}
# state= names of the presets of the C API (lpmm's 4-bit optimizers, "Memory
# Efficient Optimizers with 4-bit States"); what each sets comes from the
# library (preset_config).
STATE_PRESETS = {
    "4bit-rank1": Preset.LPMM_ADAMW_4BIT,  # lpmm's 4-bit AdamW: m 4-bit blocks, v 4-bit rank-1
    "lpmm-4bit": Preset.LPMM_ADAMW_4BIT,
    "4bit-factor": Preset.ADAMW_4BIT_FACTOR,  # lpmm's 4-bit Factor: m 4-bit blocks, v factored
    "4bit-sr": Preset.ADAMW_4BIT_SR,  # m 4bit-sr (stochastic codes), v 4-bit blocks (issue 37)
    "4bit-sr-dyn": Preset.ADAMW_4BIT_SR_DYN,  # m 4bit-sr, v 4bit-dyn (v on the dynamic map: issue 50)
}


def _names(table) -> list:
    return sorted(k for k in table if isinstance(k, str))


def parse_state_format(fmt, arg="state") -> StateFormat:
    """A StateFormat from a name of STATE_FORMATS, a StateFormat or its int
    value; None and "default" are StateFormat.DEFAULT."""
    if isinstance(fmt, StateFormat):
        return fmt
    if isinstance(fmt, (int, np.integer)) and not isinstance(fmt, bool):
        try:
            return StateFormat(int(fmt))
        except ValueError:
            raise InvalidArgumentError(f"{arg}={fmt!r} is not a lowbit state format") from None
    key = fmt.lower() if isinstance(fmt, str) else fmt
    if key not in STATE_FORMATS:
        raise InvalidArgumentError(f"{arg}={fmt!r} is not one of {_names(STATE_FORMATS)}")
    return STATE_FORMATS[key]


def parse_normalization(value, arg) -> Normalization:
    """A Normalization from a name of NORMALIZATIONS or a Normalization; None
    and "default" are Normalization.DEFAULT."""
    if isinstance(value, Normalization):
        return value
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, (list, dict, set)) or key not in NORMALIZATIONS:
        raise InvalidArgumentError(f"{arg}={value!r} is not one of {_names(NORMALIZATIONS)}")
    return NORMALIZATIONS[key]


def is_preset(state) -> bool:
    return isinstance(state, str) and state.lower() in STATE_PRESETS


@functools.lru_cache(maxsize=16)
def preset_config(preset) -> tuple:
    """(state_format, second_state_format, first_normalization,
    second_normalization) of a lowbit_preset_t, as
    lowbit_optimizer_config_preset sets them."""
    cfg = ffi.new("lowbit_optimizer_config_t *")
    call("lowbit_optimizer_config_init_sized", cfg, ffi.sizeof(cfg[0]), int(Algorithm.ADAMW))
    call("lowbit_optimizer_config_preset", cfg, int(preset))
    return (StateFormat(cfg.state_format), StateFormat(cfg.second_state_format),
            Normalization(cfg.first_normalization), Normalization(cfg.second_normalization))


#: The algorithms that take a preset (lowbit_optimizer_config_preset makes an AdamW config).
PRESET_ALGORITHMS = (Algorithm.ADAMW, Algorithm.ADAM)


def parse_state_option(state, second_state=None, first_normalization=None, second_normalization=None,
                       arg="state", second_arg="second_state", algorithm=None) -> tuple:
    """(state format, second moment's format, first normalisation, second
    normalisation) of the state options: `state` is a format name or a
    preset of STATE_PRESETS (as the library sets it; for the algorithms of
    PRESET_ALGORITHMS, when `algorithm` is given); a second format or a
    normalisation given explicitly (not None / "default") wins over the
    preset's."""
    if is_preset(state) and state.lower() in STATE_FORMATS and algorithm is not None and \
            algorithm not in PRESET_ALGORITHMS:
        state = STATE_FORMATS[state.lower()]  # "4bit-sr" for Lion / SGD: their one moment in that format
    if is_preset(state):
        if algorithm is not None and algorithm not in PRESET_ALGORITHMS:
            raise InvalidArgumentError(f"{arg}={state!r} is a preset of AdamW / Adam (adamw, adam); "
                                       f"{Algorithm(algorithm).name.lower()} takes a state format")
        fmt, fmt2, n1, n2 = preset_config(STATE_PRESETS[state.lower()])
    else:
        try:
            fmt = parse_state_format(state, arg)
        except InvalidArgumentError:
            raise InvalidArgumentError(f"{arg}={state!r} is not one of "
                                       f"{_names(STATE_FORMATS) + sorted(STATE_PRESETS)}") from None
        fmt2, n1, n2 = StateFormat.DEFAULT, Normalization.DEFAULT, Normalization.DEFAULT
    second = parse_state_format(second_state, second_arg)
    first_norm = parse_normalization(first_normalization, "first_normalization")
    second_norm = parse_normalization(second_normalization, "second_normalization")
    return (fmt,
            second if second != StateFormat.DEFAULT else fmt2,
            first_norm if first_norm != Normalization.DEFAULT else n1,
            second_norm if second_norm != Normalization.DEFAULT else n2)


# ----------------------------------------------------------------- checkpoints

CHECKPOINT_MODES = {
    "compressed": CheckpointMode.COMPRESSED,
    "fp32": CheckpointMode.MATERIALIZED_FP32,
    "materialized_fp32": CheckpointMode.MATERIALIZED_FP32,
    "bf16": CheckpointMode.MATERIALIZED_BF16,
    "materialized_bf16": CheckpointMode.MATERIALIZED_BF16,
}


def parse_checkpoint_mode(mode) -> CheckpointMode:
    if isinstance(mode, CheckpointMode):
        return mode
    key = str(mode).lower()
    if key not in CHECKPOINT_MODES:
        raise InvalidArgumentError(f"mode={mode!r} is not one of {sorted(CHECKPOINT_MODES)}")
    return CHECKPOINT_MODES[key]


# ----------------------------------------------------------------- devices, streams, threads


def parse_device(device, device_index=None):
    """'cpu', 'cuda', 'cuda:1', a Device, or a torch.device -> (Device, index)."""
    index = None if device_index is None else c_int(device_index, "device_index", "int32_t")
    if isinstance(device, Device):
        return device, index or 0
    s = str(device).lower()
    if s == "cpu":
        return Device.CPU, 0
    if s.startswith("cuda"):
        rest = s[4:]
        if rest.startswith(":"):
            try:
                idx = c_int(int(rest[1:]), "device", "int32_t")
            except ValueError:
                raise InvalidArgumentError(f"device={device!r} is not 'cpu', 'cuda' or 'cuda:N'") from None
            if index is not None and index != idx:
                raise InvalidArgumentError(f"device={device!r} contradicts device_index={device_index}")
            return Device.CUDA, idx
        if rest == "":
            return Device.CUDA, index or 0
    raise InvalidArgumentError(f"device={device!r} is not 'cpu', 'cuda' or 'cuda:N'")


def stream_pointer(stream) -> int | None:
    """A cudaStream_t as an int from None, an int, a torch.cuda.Stream
    (.cuda_stream), a cupy Stream (.ptr) or a numba stream (.handle)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return c_int(stream, "stream", "uintptr_t")
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    handle = getattr(stream, "handle", None)
    if handle is not None:
        v = getattr(handle, "value", handle)
        if isinstance(v, int) or v is None:
            return v or 0
    raise InvalidArgumentError(f"stream={stream!r} is not a CUDA stream (int, torch/cupy/numba stream)")


NUM_THREADS_ENV = "LOWBIT_NUM_THREADS"


def resolve_num_threads(num_threads, default=0, arg="num_threads") -> int:
    """The CPU engine's thread count: `num_threads` when given (an int >= 0;
    0 means all OpenMP threads, omp_get_max_threads()), else the environment
    variable LOWBIT_NUM_THREADS when set, else `default` (an int or a
    zero-argument callable, e.g. torch.get_num_threads). The library checks
    the upper bound."""
    source = arg
    if num_threads is None:
        env = os.environ.get(NUM_THREADS_ENV, "").strip()
        if env:
            num_threads, source = env, f"{NUM_THREADS_ENV}={env!r}"
        else:
            return int(default() if callable(default) else default)
    try:
        n = int(num_threads)
        if isinstance(num_threads, float) and n != num_threads:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgumentError(f"{source}: {num_threads!r} is not an int (0 = all OpenMP threads)") from None
    if isinstance(num_threads, bool) or n < 0:
        raise InvalidArgumentError(f"{source}: {num_threads!r} must be an int >= 0 (0 = all OpenMP threads)")
    return c_int(n, source, "int32_t")

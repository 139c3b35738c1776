"""lowbit for JAX: optax-compatible optimizers with low-bit state.

Each optimizer step is one XLA FFI custom call (``lowbit_step``) into
``liblowbit_jax``, which runs the library's own engine (the code behind the C
API): dequantize state, update in fp32, requantize, write params and state,
in one pass and in place (the outputs alias the inputs).

    import optax, lowbit.jax as ljax

    opt = ljax.adamw(1e-3, state_format="8bit")
    state = opt.init(params)

    # optax style: updates = new_params - params
    updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)

    # or the direct fused step, in place when params and state are donated:
    step = jax.jit(opt.step, donate_argnums=(0, 2))
    params, state = step(params, grads, state)

State formats are those of the C API: ``"fp32"``, ``"bf16"``, ``"8bit"``,
``"4bit"``, ``"fp8"``; params with fewer than ``min_quantized_numel`` (4096)
elements keep fp32 state when a quantized format is asked for.

Shaped moments (capi/lowbit.h, "Shaped parameters"; lpmm's 4-bit
optimizers): each leaf's shape goes to the library's plan, and a moment may be
normalised per block (``"block"``, the default), rank-1 (``"rank1"``: one
max vector per dim, 8bit/4bit moments of leaves with >= 2 dims) or factored
(``"factored"``: Adafactor-style fp32 row and column accumulators instead of
Adam's second moment, leaves with >= 2 dims), through
``first_normalization`` / ``second_normalization``, or the presets of the C
API as ``state_format`` of ``adamw`` / ``adam``:

    ljax.adamw(1e-3, state_format="4bit-rank1")   # lpmm 4-bit AdamW: m 4-bit blocks, v 4-bit rank-1
    ljax.adamw(1e-3, state_format="4bit-factor")  # lpmm 4-bit Factor: m 4-bit blocks, v factored

1-D leaves (and leaves of more than 8 dims) keep blocks; leaves under
``min_quantized_numel`` keep fp32 state, as in the C API. The state is a
pytree of arrays (:class:`LowbitState`), so it checkpoints with ordinary JAX
tools. Its arrays are the library's storage, flattened: moment data
(float32, bfloat16 or uint8 codes; a factored moment's fp32 accumulators),
one float32 scale per block (a rank-1 moment: its vectors and their step
workspace), the error-correction bytes of 16-bit params, an int32 step count,
and the layout (formats, normalisations, rounding and shape of each param)
that the step checks on every call.

Bad input. On the CPU every check raises an XLA error naming what is wrong.
On a GPU the dtypes, shapes and attributes are checked the same way, but JAX
dispatches asynchronously, so the error surfaces when the result is awaited.
What lives in device arrays (an lr from a schedule, ``state.count``, the
layout recorded in the state) is checked by the engine on the device, where
the host never waits for it: a mismatch makes the step change nothing, params,
state and count included, instead of raising. A count that stops advancing
shows it.

Semantics of ``update``: optax wants updates, the fused step computes new
params, so ``update`` returns ``new_params - params`` computed in the param
dtype. ``optax.apply_updates`` then gives back ``new_params`` exactly whenever
that subtraction is exact, which holds when a weight changes by less than a
factor of two in a step (Sterbenz); for 16-bit params it is exact only in the
param dtype. ``step`` has no such caveat and, jitted with donation, updates
params and state without copies.

The shared library is found through the environment variable
``LOWBIT_JAX_LIBRARY``, else next to ``LOWBIT_LIBRARY`` (build trees write both
into the build directory), else inside this package.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import threading
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._ffi import Algorithm, Dtype, StateFormat
from ._lib import JAX_LIBRARY_ENV as LIBRARY_ENV
from ._lib import jax_module_candidates
from ._optimizer import resolve_num_threads
from ._plan import MAX_DIMS, Normalization, Preset, plan_param_state, preset_config

__all__ = [
    "LIBRARY_ENV",
    "LowbitState",
    "LowbitTransformation",
    "adam",
    "adamw",
    "library_path",
    "lion",
    "moments",
    "sgd",
]

PROTOCOL_VERSION = 3  # bindings/jax/step_common.hpp kProtocolVersion
LAYOUT_COLUMNS = 14  # core/layout_record.hpp kLayoutColumns

_STEP_TARGET = "lowbit_step"
_DECODE_TARGET = "lowbit_decode_moment"

_FORMATS = {
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
}
# state_format presets (lowbit_preset_t): AdamW / Adam only
_PRESETS = {
    "4bit-rank1": Preset.LPMM_ADAMW_4BIT,
    "lpmm-4bit": Preset.LPMM_ADAMW_4BIT,
    "4bit-factor": Preset.ADAMW_4BIT_FACTOR,
}
_NORMALIZATIONS = {
    "block": Normalization.BLOCK,
    "rank1": Normalization.RANK1,
    "rank-1": Normalization.RANK1,
    "factored": Normalization.FACTORED,
    "factor": Normalization.FACTORED,
}
_PARAM_DTYPES = {jnp.dtype(jnp.float32): Dtype.FLOAT32, jnp.dtype(jnp.bfloat16): Dtype.BFLOAT16,
                 jnp.dtype(jnp.float16): Dtype.FLOAT16}

# ----------------------------------------------------------------- the module


class _Module:
    def __init__(self):
        self._lock = threading.Lock()
        self.lib = None
        self.path = None
        self.has_cuda = False

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
                lib = ctypes.CDLL(path)
                lib.lowbit_jax_protocol_version.restype = ctypes.c_int32
                version = lib.lowbit_jax_protocol_version()
                if version != PROTOCOL_VERSION:
                    raise ImportError(
                        f"{path} speaks FFI protocol {version}, this lowbit.jax expects {PROTOCOL_VERSION} "
                        "(rebuild liblowbit_jax)"
                    )
                lib.lowbit_jax_has_cuda.restype = ctypes.c_int32
                lib.lowbit_jax_check_hparams.restype = ctypes.c_int32
                lib.lowbit_jax_check_hparams.argtypes = [ctypes.c_int32] + [ctypes.c_float] * 7 + [
                    ctypes.c_int32,
                    ctypes.c_int32,
                    ctypes.c_char_p,
                    ctypes.c_int64,
                ]
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


def _check_hparams(algorithm, lr, b1, b2, eps, wd, momentum, dampening, nesterov, bias_correction):
    lib = _MODULE.load()
    buf = ctypes.create_string_buffer(512)
    status = lib.lowbit_jax_check_hparams(
        int(algorithm), lr, b1, b2, eps, wd, momentum, dampening, int(nesterov), int(bias_correction), buf, 512
    )
    if status:
        raise ValueError(f"lowbit.jax: {buf.value.decode('utf-8', 'replace')}")


# ----------------------------------------------------------------- state


class LowbitState(NamedTuple):
    """Optimizer state. ``mu``/``nu`` (moment data), ``mu_scale``/``nu_scale``
    (per-block float32 scales) and ``ecc`` (error-correction bytes) are pytrees
    with the structure of the params whose leaves are flat arrays, None where a
    param has no such part (an absent part is no array, so a jitted step
    dispatches fewer of them). States from earlier lowbit versions hold
    zero-size arrays there instead; a step takes either and returns each part
    in the form it came, so a carried state keeps its structure. ``count`` is
    the number of steps applied (a skipped non-finite step does not count);
    ``layout[i]`` (14 int32) = format of moment 0, format of moment 1
    (lowbit_state_format_t values, 0: no such moment), rounding (0 nearest /
    1 stochastic / 2 error correction), normalisation of moment 0 and 1
    (lowbit_normalization_t values, 0: no such moment), then ndim and the 8
    dims of the shape the step binds (the leaf's, when a moment is rank-1 or
    factored; else ndim 0). A factored second moment has format fp32 (its
    accumulators)."""

    count: jax.Array
    layout: jax.Array
    mu: Any
    mu_scale: Any
    nu: Any
    nu_scale: Any
    ecc: Any


try:  # optax is optional: with it, the transformation is an optax one
    import optax as _optax

    _TransformationBase = _optax.GradientTransformation
except ImportError:  # pragma: no cover - exercised only without optax

    class _TransformationBase(NamedTuple):
        init: Callable
        update: Callable


class LowbitTransformation(_TransformationBase):
    """An optax ``GradientTransformation`` (``init``, ``update``) that also has
    ``step(params, grads, state) -> (new_params, new_state)``, the fused step
    without the updates round trip, and ``config`` (the settings)."""

    # A NamedTuple subclass without __slots__: instances take attributes.
    def __repr__(self):
        cfg = getattr(self, "config", None)
        return f"LowbitTransformation({cfg!r})" if cfg is not None else super().__repr__()


@dataclasses.dataclass(frozen=True)
class Config:
    algorithm: Algorithm
    learning_rate: Union[float, Callable]
    b1: float = 0.0
    b2: float = 0.0
    eps: float = 0.0
    weight_decay: float = 0.0
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    bias_correction: bool = True
    mask: Any = None
    state_format: StateFormat = StateFormat.FP32
    second_state_format: Optional[StateFormat] = None
    first_normalization: Normalization = Normalization.DEFAULT
    second_normalization: Normalization = Normalization.DEFAULT
    min_quantized_numel: int = 4096
    stochastic_rounding: bool = False
    error_correction: bool = False
    seed: int = 0
    skip_nonfinite: bool = True
    num_threads: int = 0


def _parse_format(fmt, arg):
    if fmt is None:
        return None
    if isinstance(fmt, StateFormat):
        if fmt == StateFormat.DEFAULT:
            return None
        return fmt
    key = fmt.lower() if isinstance(fmt, str) else fmt
    if key not in _FORMATS:
        raise ValueError(f"lowbit.jax: {arg}={fmt!r} is not one of {sorted(_FORMATS)}")
    return _FORMATS[key]


def _parse_normalization(norm, arg):
    if norm is None:
        return Normalization.DEFAULT
    if isinstance(norm, Normalization):
        return norm
    key = norm.lower() if isinstance(norm, str) else norm
    if key not in _NORMALIZATIONS:
        raise ValueError(f"lowbit.jax: {arg}={norm!r} is not one of {sorted(_NORMALIZATIONS)}")
    return _NORMALIZATIONS[key]


class _Leaf(NamedTuple):
    formats: tuple  # (moment 0, moment 1) lowbit_state_format_t values, 0 = none
    rounding: int
    data_bytes: tuple
    scale_count: tuple
    ecc_bytes: int
    normalizations: tuple  # (moment 0, moment 1) lowbit_normalization_t values, 0 = none
    bound_shape: tuple  # the shape the step binds: the leaf's when a moment is rank-1 / factored, else ()

    def layout_row(self):
        shape = list(self.bound_shape) + [0] * (MAX_DIMS - len(self.bound_shape))
        return [self.formats[0], self.formats[1], self.rounding, self.normalizations[0], self.normalizations[1],
                len(self.bound_shape)] + shape


def _plan_leaf(shape, dtype, cfg: Config, name) -> _Leaf:
    """The state of one leaf, as the library plans it (lowbit_plan_param_state)."""
    dtype = jnp.dtype(dtype)
    if dtype not in _PARAM_DTYPES:
        raise TypeError(f"lowbit.jax: param {name} has dtype {dtype}; lowbit updates float32, bfloat16 and float16")
    shape = tuple(int(d) for d in shape)
    numel = int(np.prod(shape, dtype=np.int64))
    # The library plans 1..8 dims; a leaf of more dims (or none, or an empty
    # one) is planned flat, so its moments keep blocks.
    plan_shape = shape if 1 <= len(shape) <= MAX_DIMS and numel > 0 else ()
    plan = plan_param_state(
        cfg.algorithm, numel, _PARAM_DTYPES[dtype], state_format=cfg.state_format,
        second_state_format=cfg.second_state_format if cfg.second_state_format is not None else StateFormat.DEFAULT,
        min_quantized_numel=cfg.min_quantized_numel, stochastic_rounding=cfg.stochastic_rounding,
        error_correction=cfg.error_correction, momentum=cfg.momentum, shape=plan_shape,
        first_normalization=cfg.first_normalization, second_normalization=cfg.second_normalization)
    norms = tuple(int(n) for n in plan.normalization)
    shaped = any(n in (Normalization.RANK1, Normalization.FACTORED) for n in norms)
    if shaped and max(shape) > 2**31 - 1:
        raise ValueError(f"lowbit.jax: param {name} has shape {shape}: rank1 and factored moments need dims "
                         "< 2^31")
    return _Leaf(tuple(int(f) for f in plan.formats), int(plan.rounding), plan.data_bytes, plan.scale_count,
                 plan.ecc_bytes, norms, shape if shaped else ())


def _moment_arrays(plan: _Leaf, m: int):
    """Zero data and scales of moment m: the data as its format stores it
    (float32, bfloat16 or uint8 codes), one float32 per scale; None for a part
    the moment does not have."""
    fmt, nbytes = plan.formats[m], plan.data_bytes[m]
    if fmt == 0:
        data = None
    elif fmt == StateFormat.FP32:
        data = jnp.zeros((nbytes // 4,), jnp.float32)
    elif fmt == StateFormat.BF16:
        data = jnp.zeros((nbytes // 2,), jnp.bfloat16)
    else:
        data = jnp.zeros((nbytes,), jnp.uint8)
    count = plan.scale_count[m]
    return data, jnp.zeros((count,), jnp.float32) if count else None


def _present(part) -> bool:
    """A state part with elements (absent: None, or a zero-size array from an
    earlier lowbit)."""
    return part is not None and np.size(part) > 0


def _leaf_names(params):
    paths, _ = jax.tree_util.tree_flatten_with_path(params)
    return [jax.tree_util.keystr(p) or "<root>" for p, _ in paths]


def _weight_decays(params, treedef, cfg: Config):
    n = treedef.num_leaves
    if cfg.mask is None:
        return [float(cfg.weight_decay)] * n
    mask = cfg.mask(params) if callable(cfg.mask) else cfg.mask
    try:
        leaves = treedef.flatten_up_to(mask)
    except (ValueError, TypeError) as e:
        raise ValueError(f"lowbit.jax: mask does not have the structure of the params: {e}") from None
    out = []
    for m in leaves:
        try:
            m = bool(m)
        except jax.errors.ConcretizationTypeError:
            raise ValueError("lowbit.jax: mask leaves must be Python bools (the mask is fixed at trace time)") from None
        out.append(float(cfg.weight_decay) if m else 0.0)
    return out


def _init(params, cfg: Config) -> LowbitState:
    leaves, treedef = jax.tree_util.tree_flatten(params)
    names = _leaf_names(params)
    mu, mus, nu, nus, ecc, layout = [], [], [], [], [], []
    for leaf, name in zip(leaves, names):
        shape, dtype = jnp.shape(leaf), jnp.result_type(leaf)
        plan = _plan_leaf(shape, dtype, cfg, name)
        d0, s0 = _moment_arrays(plan, 0)
        d1, s1 = _moment_arrays(plan, 1)
        mu.append(d0)
        mus.append(s0)
        nu.append(d1)
        nus.append(s1)
        ecc.append(jnp.zeros((plan.ecc_bytes,), jnp.uint8) if plan.ecc_bytes else None)
        layout.append(plan.layout_row())
    un = treedef.unflatten
    return LowbitState(
        count=jnp.zeros((), jnp.int32),
        layout=jnp.asarray(np.array(layout, dtype=np.int32).reshape(len(leaves), LAYOUT_COLUMNS)),
        mu=un(mu),
        mu_scale=un(mus),
        nu=un(nu),
        nu_scale=un(nus),
        ecc=un(ecc),
    )


def _flatten_like(treedef, tree, what):
    try:
        return treedef.flatten_up_to(tree)
    except (ValueError, TypeError) as e:
        raise ValueError(f"lowbit.jax: {what} does not have the structure of the params: {e}") from None


def _fused_step(params, grads, state: LowbitState, cfg: Config):
    _MODULE.load()
    if not isinstance(state, LowbitState):
        raise TypeError(f"lowbit.jax: state must be a LowbitState (from init), got {type(state).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    if not leaves:
        return params, state
    leaves = [jnp.asarray(p) for p in leaves]
    g = [jnp.asarray(x) for x in _flatten_like(treedef, grads, "grads")]
    mu = _flatten_like(treedef, state.mu, "state.mu")
    mus = _flatten_like(treedef, state.mu_scale, "state.mu_scale")
    nu = _flatten_like(treedef, state.nu, "state.nu")
    nus = _flatten_like(treedef, state.nu_scale, "state.nu_scale")
    ecc = _flatten_like(treedef, state.ecc, "state.ecc")
    names = _leaf_names(params)
    plans = [_plan_leaf(p.shape, p.dtype, cfg, name) for p, name in zip(leaves, names)]

    lr = cfg.learning_rate(state.count) if callable(cfg.learning_rate) else cfg.learning_rate
    lr = jnp.asarray(lr, jnp.float32)
    if lr.shape != ():
        raise ValueError(f"lowbit.jax: the learning rate must be a scalar, got shape {lr.shape}")

    # Per param: param, grad and the state parts that have elements. An
    # absent part (None, or an empty array) stays out of the custom call, which
    # keeps XLA's compile time down (it grows steeply with the call's
    # operands), and is returned as it came.
    args = [lr, state.count, state.layout]
    results = [jax.ShapeDtypeStruct(jnp.shape(state.count), jnp.result_type(state.count))]
    aliases = {1: 0}
    all_parts = [(mu[i], mus[i], nu[i], nus[i], ecc[i]) for i in range(len(leaves))]
    masks = [sum(1 << k for k, x in enumerate(parts) if _present(x)) for parts in all_parts]
    for leaf, grad, parts, mask in zip(leaves, g, all_parts, masks):
        aliases[len(args)] = len(results)
        args += [leaf, grad]
        results.append(jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)))
        for k, x in enumerate(parts):
            if mask >> k & 1:
                aliases[len(args)] = len(results)
                args.append(x)
                results.append(jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)))

    call = jax.ffi.ffi_call(_STEP_TARGET, results, input_output_aliases=aliases, vmap_method="sequential")
    out = call(
        *args,
        algorithm=np.int32(cfg.algorithm),
        beta1=np.float32(cfg.b1),
        beta2=np.float32(cfg.b2),
        eps=np.float32(cfg.eps),
        momentum=np.float32(cfg.momentum),
        dampening=np.float32(cfg.dampening),
        nesterov=np.int32(cfg.nesterov),
        bias_correction=np.int32(cfg.bias_correction),
        weight_decay=np.array(_weight_decays(params, treedef, cfg), np.float32),
        formats=np.array([f for p in plans for f in p.formats], np.int32),
        rounding=np.array([p.rounding for p in plans], np.int32),
        normalizations=np.array([n for p in plans for n in p.normalizations], np.int32),
        parts=np.array(masks, np.int32),
        seed=np.uint64(cfg.seed),
        skip_nonfinite=np.int32(cfg.skip_nonfinite),
        num_threads=np.int32(cfg.num_threads),
        names="\n".join(names),
    )
    un = treedef.unflatten
    pos = 1
    new_leaves, per = [], []
    for parts, mask in zip(all_parts, masks):
        new_leaves.append(out[pos])
        pos += 1
        new_parts = []
        for k, x in enumerate(parts):
            if mask >> k & 1:
                x = out[pos]
                pos += 1
            new_parts.append(x)
        per.append(new_parts)
    new_params = un(new_leaves)
    new_state = LowbitState(
        count=out[0],
        layout=state.layout,
        mu=un([p[0] for p in per]),
        mu_scale=un([p[1] for p in per]),
        nu=un([p[2] for p in per]),
        nu_scale=un([p[3] for p in per]),
        ecc=un([p[4] for p in per]),
    )
    return new_params, new_state


def _make(cfg: Config) -> LowbitTransformation:
    lr0 = 0.0 if callable(cfg.learning_rate) else float(cfg.learning_rate)
    _check_hparams(cfg.algorithm, lr0, cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay, cfg.momentum, cfg.dampening,
                   cfg.nesterov, cfg.bias_correction)
    if cfg.min_quantized_numel < 0:
        raise ValueError(f"lowbit.jax: min_quantized_numel = {cfg.min_quantized_numel} must be >= 0")
    if cfg.num_threads < 0:
        raise ValueError(f"lowbit.jax: num_threads = {cfg.num_threads} must be >= 0")
    if not 0 <= int(cfg.seed) < 2**64:
        raise ValueError(f"lowbit.jax: seed = {cfg.seed} must be in [0, 2^64)")

    def init(params):
        return _init(params, cfg)

    def _update(updates, state, params):
        new_params, new_state = _fused_step(params, updates, state, cfg)
        deltas = jax.tree_util.tree_map(lambda n, p: n - jnp.asarray(p), new_params, params)
        return deltas, new_state

    # Jitted once per optimizer: called outside jit, a step is one compiled
    # program (cached per argument shapes) instead of op-by-op dispatch with
    # the leaf planning redone in Python at every call; inside the caller's
    # jit the call is inlined (donation and in-place aliasing unchanged).
    jit_update = jax.jit(_update)
    jit_step = jax.jit(functools.partial(_fused_step, cfg=cfg))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("lowbit.jax: update() needs params (the fused step computes new params from them)")
        return jit_update(updates, state, params)

    def step(params, grads, state):
        return jit_step(params, grads, state)

    t = LowbitTransformation(init, update)
    t.step = step
    t.config = cfg
    return t


def _formats(state_format, second_state_format, first_normalization, second_normalization, presets):
    """state_format (a format or, where `presets`, a preset name), the second
    moment's format and the normalisations; explicit arguments win over a
    preset's."""
    first_norm = _parse_normalization(first_normalization, "first_normalization")
    second_norm = _parse_normalization(second_normalization, "second_normalization")
    if first_norm == Normalization.FACTORED:
        raise ValueError("lowbit.jax: first_normalization='factored': only the second moment of AdamW / Adam can "
                         "be factored (second_normalization)")
    key = state_format.lower() if isinstance(state_format, str) else None
    if key in _PRESETS:
        if not presets:
            raise ValueError(f"lowbit.jax: state_format={state_format!r} is a preset of AdamW / Adam "
                             f"(adamw, adam); this optimizer takes one of {sorted(_FORMATS)}")
        fmt, fmt2, n1, n2 = preset_config(_PRESETS[key])
        second = _parse_format(second_state_format, "second_state_format")
        return dict(state_format=fmt, second_state_format=second if second is not None else fmt2,
                    first_normalization=first_norm if first_norm != Normalization.DEFAULT else n1,
                    second_normalization=second_norm if second_norm != Normalization.DEFAULT else n2)
    if isinstance(state_format, str) and key not in _FORMATS:
        choices = sorted(_FORMATS) + (sorted(_PRESETS) if presets else [])
        raise ValueError(f"lowbit.jax: state_format={state_format!r} is not one of {choices}")
    return dict(state_format=_parse_format(state_format, "state_format") or StateFormat.FP32,
                second_state_format=_parse_format(second_state_format, "second_state_format"),
                first_normalization=first_norm, second_normalization=second_norm)


def _common(state_format, second_state_format, min_quantized_numel, stochastic_rounding, error_correction, seed,
            skip_nonfinite, num_threads, first_normalization=None, second_normalization=None, presets=False):
    return dict(
        **_formats(state_format, second_state_format, first_normalization, second_normalization, presets),
        min_quantized_numel=int(min_quantized_numel),
        stochastic_rounding=bool(stochastic_rounding),
        error_correction=bool(error_correction),
        seed=int(seed),
        skip_nonfinite=bool(skip_nonfinite),
        num_threads=_num_threads(num_threads),
    )


def _num_threads(num_threads) -> int:
    try:
        return resolve_num_threads(num_threads)
    except ValueError as e:
        raise ValueError(f"lowbit.jax: {e}") from None


_COMMON_DOC = """
    state_format: "fp32" (default), "bf16", "8bit", "4bit" or "fp8", of both
        moments unless ``second_state_format`` is given. AdamW / Adam also
        take the presets of the C API (lowbit_preset_t): "4bit-rank1" (alias
        "lpmm-4bit": m 4-bit blocks, v 4-bit rank-1) and "4bit-factor" (m
        4-bit blocks, v factored); explicit formats and normalisations given
        with a preset win over its own.
    first_normalization / second_normalization: "block" (default), "rank1"
        (8bit / 4bit moments of leaves with >= 2 dims: one max vector per dim)
        or "factored" (second moment of AdamW / Adam only: fp32 row and column
        accumulators); leaves with fewer than 2 dims keep blocks. Lion and
        SGD take ``first_normalization`` only.
    min_quantized_numel: params with fewer elements keep fp32 state when the
        format is quantized (8bit/4bit/fp8), as in the C API.
    stochastic_rounding / error_correction: how 16-bit params are written back
        (error correction keeps one extra byte per element in the state and
        wins over stochastic rounding). ``seed`` keys the stochastic rounding.
    skip_nonfinite: a NaN/Inf anywhere in the grads leaves params and state
        unchanged (``count`` does not advance).
    num_threads: CPU threads of the step (0: all OpenMP threads); when not
        given, the environment variable LOWBIT_NUM_THREADS, else 0. Fixed
        when the optimizer is made (``config.num_threads``).
    learning_rate may be a float or a schedule ``count -> lr`` (evaluated
    under jit; the step receives it as a buffer)."""


def adamw(learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4, mask=None, *, bias_correction=True,
          state_format="fp32", second_state_format=None, first_normalization=None, second_normalization=None,
          min_quantized_numel=4096, stochastic_rounding=False, error_correction=False, seed=0, skip_nonfinite=True,
          num_threads=None) -> LowbitTransformation:
    """AdamW (decoupled weight decay), the arguments and defaults of
    ``optax.adamw``: p = p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps).
    ``mask`` (pytree of bools or callable params -> pytree) selects the params
    that are decayed.""" + _COMMON_DOC
    return _make(Config(Algorithm.ADAMW, learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask,
                        bias_correction=bias_correction,
                        **_common(state_format, second_state_format, min_quantized_numel, stochastic_rounding,
                                  error_correction, seed, skip_nonfinite, num_threads, first_normalization,
                                  second_normalization, presets=True)))


def adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, mask=None, *, bias_correction=True,
         state_format="fp32", second_state_format=None, first_normalization=None, second_normalization=None,
         min_quantized_numel=4096, stochastic_rounding=False, error_correction=False, seed=0, skip_nonfinite=True,
         num_threads=None) -> LowbitTransformation:
    """Adam; ``weight_decay`` is L2 (added to the gradient), as torch.optim.Adam.""" + _COMMON_DOC
    return _make(Config(Algorithm.ADAM, learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask,
                        bias_correction=bias_correction,
                        **_common(state_format, second_state_format, min_quantized_numel, stochastic_rounding,
                                  error_correction, seed, skip_nonfinite, num_threads, first_normalization,
                                  second_normalization, presets=True)))


def lion(learning_rate, b1=0.9, b2=0.99, weight_decay=1e-3, mask=None, *, state_format="fp32",
         first_normalization=None, min_quantized_numel=4096, stochastic_rounding=False, error_correction=False,
         seed=0, skip_nonfinite=True, num_threads=None) -> LowbitTransformation:
    """Lion with decoupled weight decay, the arguments and defaults of
    ``optax.lion``.""" + _COMMON_DOC
    return _make(Config(Algorithm.LION, learning_rate, b1=b1, b2=b2, weight_decay=weight_decay, mask=mask,
                        **_common(state_format, None, min_quantized_numel, stochastic_rounding, error_correction,
                                  seed, skip_nonfinite, num_threads, first_normalization)))


def sgd(learning_rate, momentum=None, nesterov=False, *, dampening=0.0, weight_decay=0.0, mask=None,
        state_format="fp32", first_normalization=None, min_quantized_numel=4096, stochastic_rounding=False,
        error_correction=False, seed=0, skip_nonfinite=True, num_threads=None) -> LowbitTransformation:
    """SGD as torch.optim.SGD (L2 ``weight_decay``, ``momentum`` with
    ``dampening``, Nesterov); with dampening 0 it equals ``optax.sgd``. No
    momentum: no state besides the count.""" + _COMMON_DOC
    return _make(Config(Algorithm.SGD, learning_rate, momentum=float(momentum or 0.0), dampening=dampening,
                        nesterov=bool(nesterov), weight_decay=weight_decay, mask=mask,
                        **_common(state_format, None, min_quantized_numel, stochastic_rounding, error_correction,
                                  seed, skip_nonfinite, num_threads, first_normalization)))


# ----------------------------------------------------------------- inspection


def _decode(data, scales, fmt, norm, moment, shape):
    # the output has the param's shape: rank-1 and factored moments decode with it
    call = jax.ffi.ffi_call(_DECODE_TARGET, jax.ShapeDtypeStruct(tuple(shape), jnp.float32),
                            vmap_method="sequential")
    return call(data, scales, format=np.int32(fmt), moment=np.int32(moment), normalization=np.int32(norm))


def moments(state: LowbitState, params):
    """The moments of ``state``, dequantized to float32 with the library's
    codec, as ``(mu, nu)`` pytrees shaped like ``params`` (None where the
    algorithm keeps no such moment). Runs on the CPU."""
    _MODULE.load()
    leaves, treedef = jax.tree_util.tree_flatten(params)
    layout = np.asarray(jax.device_get(state.layout))
    if layout.shape != (len(leaves), LAYOUT_COLUMNS):
        raise ValueError(f"lowbit.jax: state.layout has shape {layout.shape}, expected ({len(leaves)}, "
                         f"{LAYOUT_COLUMNS}) for params of {len(leaves)} leaves")
    cpu = jax.devices("cpu")[0]
    out = []
    for m, (data_tree, scale_tree) in enumerate(((state.mu, state.mu_scale), (state.nu, state.nu_scale))):
        data = _flatten_like(treedef, data_tree, "state moment data")
        scales = _flatten_like(treedef, scale_tree, "state moment scales")
        vals = []
        for i, p in enumerate(leaves):
            fmt = int(layout[i, m])
            if fmt == 0:
                vals.append(None)
                continue
            norm = int(layout[i, 3 + m])
            if norm not in (Normalization.BLOCK, Normalization.RANK1, Normalization.FACTORED):
                raise ValueError(f"lowbit.jax: state.layout[{i}, {3 + m}] = {norm} is not a normalisation")
            bound = tuple(int(d) for d in layout[i, 6:6 + int(layout[i, 5])])
            if norm != Normalization.BLOCK and bound != tuple(jnp.shape(p)):
                raise ValueError(f"lowbit.jax: state of leaf {i} was made for shape {bound}, the param has shape "
                                 f"{tuple(jnp.shape(p))}")
            d = jax.device_put(data[i] if _present(data[i]) else jnp.zeros((0,), jnp.uint8), cpu)
            s = jax.device_put(scales[i] if _present(scales[i]) else jnp.zeros((0,), jnp.float32), cpu)
            vals.append(_decode(d, s, fmt, norm, m, jnp.shape(p)))
        out.append(treedef.unflatten(vals))
    return tuple(out)

"""The state of lowbit.jax: :class:`LowbitState` (a pytree of the
library's storage), planned per leaf by the library (lowbit_plan_param_state),
made by init, and read back by :func:`moments`; and :class:`Config`, the
settings of an optimizer."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from .._algorithms import algorithm_spec
from .._errors import InvalidArgumentError
from .._ffi import MAX_DIMS, Algorithm, Dtype, Normalization, StateFormat
from .._plan import plan_param_state
from ._module import _DECODE_TARGET, _MODULE

_PARAM_DTYPES = {jnp.dtype(jnp.float32): Dtype.FLOAT32, jnp.dtype(jnp.bfloat16): Dtype.BFLOAT16,
                 jnp.dtype(jnp.float16): Dtype.FLOAT16}


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


# The names earlier lowbit.jax configs gave hyper-parameters that the
# descriptors name otherwise (optax's b1 / b2).
_OPTAX_NAMES = {"b1": "beta1", "b2": "beta2"}


@dataclasses.dataclass(frozen=True)
class Config:
    """The settings of a lowbit.jax optimizer. ``hparams``: the algorithm's
    hyper-parameters but lr and weight_decay, as (name, value) pairs in the
    order and with the names of its descriptor (lowbit_hparam_info, read by
    lowbit._algorithms), every one present (:func:`make_config` fills the
    defaults); read one with :meth:`hparam` or as an attribute
    (``config.alpha``, ``config.b1``)."""

    algorithm: Algorithm
    learning_rate: Union[float, Callable]
    weight_decay: float = 0.0
    mask: Any = None
    hparams: tuple = ()
    state_format: StateFormat = StateFormat.FP32
    second_state_format: Optional[StateFormat] = None
    first_normalization: Normalization = Normalization.DEFAULT
    second_normalization: Normalization = Normalization.DEFAULT
    min_quantized_numel: Optional[int] = None  # None: the library's default
    stochastic_rounding: bool = False
    error_correction: bool = False
    seed: int = 0
    skip_nonfinite: bool = True
    num_threads: int = 0

    def hparam(self, name):
        for key, value in self.hparams:
            if key == name:
                return value
        raise KeyError(name)

    def __getattr__(self, name):  # only for names that are no attribute
        if name.startswith("_") or name in _CONFIG_FIELDS:  # a field not yet set (copy, unpickling)
            raise AttributeError(name)
        try:
            return self.hparam(_OPTAX_NAMES.get(name, name))
        except KeyError:
            raise AttributeError(f"{type(self).__name__} of {Algorithm(self.algorithm).name.lower()} has no "
                                 f"{name!r}") from None


_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))


def make_config(algorithm, learning_rate, hparams: dict, *, weight_decay=None, mask=None, **settings) -> Config:
    """A Config of `algorithm` whose hyper-parameters are `hparams` (by
    descriptor names) over the descriptor's defaults; a name the descriptor
    does not have is an InvalidArgumentError naming it and the known ones."""
    spec = algorithm_spec(algorithm)
    known = [h.name for h in spec.hparams if h.name not in ("lr", "weight_decay")]
    unknown = [k for k in hparams if k not in known]
    if unknown:
        raise InvalidArgumentError(f"lowbit.jax.{spec.name}: unknown hyper-parameter {unknown[0]!r} (its: "
                                   f"{', '.join(known)})")
    defaults = spec.defaults()
    values = tuple((k, hparams[k] if hparams.get(k) is not None else defaults[k]) for k in known)
    if weight_decay is None:
        weight_decay = defaults.get("weight_decay", 0.0)
    return Config(Algorithm(int(algorithm)), learning_rate, weight_decay=weight_decay, mask=mask, hparams=values,
                  **settings)


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
    spec = algorithm_spec(cfg.algorithm)
    if spec.matrices and not 2 <= len(shape) <= MAX_DIMS:
        raise ValueError(f"lowbit.jax.{spec.name}: param {name} has shape {shape}: {spec.title} steps matrices (2 "
                         f"to {MAX_DIMS} dims); step 1-D leaves (biases, norms) with another transformation, e.g. "
                         "optax.partition with lowbit.jax.adamw")
    numel = int(np.prod(shape, dtype=np.int64))
    # The library plans 1..8 dims; a leaf of more dims (or none, or an empty
    # one) is planned flat, so its moments keep blocks.
    plan_shape = shape if 1 <= len(shape) <= MAX_DIMS and numel > 0 else ()
    plan = plan_param_state(
        cfg.algorithm, numel, _PARAM_DTYPES[dtype], state_format=cfg.state_format,
        second_state_format=cfg.second_state_format if cfg.second_state_format is not None else StateFormat.DEFAULT,
        min_quantized_numel=cfg.min_quantized_numel, stochastic_rounding=cfg.stochastic_rounding,
        error_correction=cfg.error_correction, shape=plan_shape,
        first_normalization=cfg.first_normalization, second_normalization=cfg.second_normalization,
        hparams=cfg.hparams)  # the plan's moments follow them (SGD's momentum, RMSprop's centered)
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


def _init(params, cfg: Config) -> LowbitState:
    _MODULE.load()
    columns = _MODULE.layout_columns
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
        layout=jnp.asarray(np.array(layout, dtype=np.int32).reshape(len(leaves), columns)),
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


def _decode(data, scales, fmt, norm, moment, shape, algorithm):
    # the output has the param's shape: rank-1 and factored moments decode with it
    call = jax.ffi.ffi_call(_DECODE_TARGET, jax.ShapeDtypeStruct(tuple(shape), jnp.float32),
                            vmap_method="sequential")
    return call(data, scales, format=np.int32(fmt), moment=np.int32(moment), normalization=np.int32(norm),
                algorithm=np.int32(algorithm))


def _algorithm_of(algorithm) -> int:
    """An algorithm given as a transformation, a Config, a name or a value."""
    cfg = getattr(algorithm, "config", algorithm)
    if isinstance(cfg, Config):
        return int(cfg.algorithm)
    if isinstance(algorithm, str):
        from .._algorithms import algorithm_specs

        specs = algorithm_specs()
        if algorithm.lower() not in specs:
            raise InvalidArgumentError(f"lowbit.jax: algorithm={algorithm!r} is not one of {', '.join(specs)}")
        return int(specs[algorithm.lower()].algorithm)
    return int(algorithm)


def moments(state: LowbitState, params, algorithm=None):
    """The moments of ``state``, dequantized to float32 with the library's
    codec, as ``(mu, nu)`` pytrees shaped like ``params`` (None where the
    algorithm keeps no such moment). Runs on the CPU.

    ``algorithm`` (the transformation that made the state, its config, its
    name or its Algorithm) picks each moment's maps by the kind its
    descriptor gives the slot; None reads moment 0 as signed and moment 1
    as unsigned, the kinds of AdamW, Adam, Lion, SGD and Muon. A state of
    RMSprop or Adagrad (an unsigned moment 0) needs it, or
    ``opt.moments(state, params)``."""
    _MODULE.load()
    algo = int(Algorithm.ADAMW) if algorithm is None else _algorithm_of(algorithm)
    columns = _MODULE.layout_columns
    leaves, treedef = jax.tree_util.tree_flatten(params)
    layout = np.asarray(jax.device_get(state.layout))
    if layout.shape != (len(leaves), columns):
        raise InvalidArgumentError(f"lowbit.jax: state.layout has shape {layout.shape}, expected ({len(leaves)}, "
                                   f"{columns}) for params of {len(leaves)} leaves")
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
            vals.append(_decode(d, s, fmt, norm, m, jnp.shape(p), algo))
        out.append(treedef.unflatten(vals))
    return tuple(out)

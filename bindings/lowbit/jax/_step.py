"""The step of lowbit.jax: one XLA FFI custom call (``lowbit_step``) per
step over every leaf, and the optax transformation around it
(:class:`LowbitTransformation`, made by :func:`_make`)."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._algorithms import algorithm_spec
from .._errors import LowbitError
from .._options import fill_hparams, new_hparams
from ._module import _MODULE, _STEP_TARGET
from ._state import Config, LowbitState, _flatten_like, _init, _leaf_names, _plan_leaf, _present, moments

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

    hparam_names, hparam_values = _hparam_attributes(int(cfg.algorithm), cfg.hparams)
    call = jax.ffi.ffi_call(_STEP_TARGET, results, input_output_aliases=aliases, vmap_method="sequential")
    out = call(
        *args,
        algorithm=np.int32(cfg.algorithm),
        hparam_names=hparam_names,
        hparam_values=hparam_values,
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


def _hparam_values(algorithm, hparams: tuple):
    """A cffi lowbit_hparams_t of the algorithm's defaults with `hparams`
    ((name, value) pairs by descriptor name) written as the library's fields
    take them (flags 0/1, enums their values, reals float32)."""
    hp = new_hparams(algorithm)
    fill_hparams(hp, dict(hparams))
    return hp


@functools.lru_cache(maxsize=256)
def _hparam_attributes(algorithm, hparams: tuple):
    """The step's hparam_names / hparam_values attributes: every
    hyper-parameter of the algorithm's descriptor but lr (a buffer) and
    weight_decay (per leaf), read back from the lowbit_hparams_t that
    fill_hparams wrote (the library's types and parsing, one place)."""
    hp = _hparam_values(algorithm, hparams)
    names, values = [], []
    for h in algorithm_spec(algorithm).hparams:
        if h.name in ("lr", "weight_decay"):
            continue
        field = getattr(hp, h.name)
        names.append(h.name)
        values += [float(field[k]) for k in range(h.count)] if h.count > 1 else [float(field)]
    return "\n".join(names), np.array(values, np.float64)


def _check_hparams(cfg: Config, lr: float) -> None:
    """The hyper-parameters checked by the library (lowbit_hparams_check, as
    the C API checks them), raising its error."""
    from .._lib import call

    try:
        hp = _hparam_values(cfg.algorithm, cfg.hparams)
        fill_hparams(hp, dict(lr=lr, weight_decay=cfg.weight_decay))
        call("lowbit_hparams_check", hp, int(cfg.algorithm))
    except LowbitError as e:
        raise type(e)(f"lowbit.jax.{algorithm_spec(cfg.algorithm).name}: {e.message}", e.status) from None


def _make(cfg: Config) -> LowbitTransformation:
    lr0 = 0.0 if callable(cfg.learning_rate) else float(cfg.learning_rate)
    _check_hparams(cfg, lr0)
    # The library checks the state settings (formats, normalisations, the
    # threshold) as it plans a leaf: one now, so that they fail here.
    _plan_leaf((1, 1) if algorithm_spec(cfg.algorithm).matrices else (1,), jnp.float32, cfg, "<settings>")

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
    t.moments = functools.partial(moments, algorithm=cfg)
    return t

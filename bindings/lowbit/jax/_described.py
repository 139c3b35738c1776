"""lowbit.jax optimizers made from the library's algorithm descriptors
(lowbit_algorithm_info, lowbit_hparam_info, read by lowbit._algorithms): a
function per described algorithm that has no hand-written one (RMSprop,
Adagrad, ...), whose positional and keyword arguments are the descriptor's
hyper-parameters in its order (as torch.optim names them; ``lr`` is
``learning_rate``, optax's name, and may be a schedule), with its defaults,
then ``mask`` where it has a weight decay, then the state settings every
lowbit.jax optimizer takes. Adding an algorithm to the library adds its
function here without a line of Python."""

from __future__ import annotations

import inspect

import numpy as np

from .._algorithms import algorithm_specs
from .._errors import InvalidArgumentError

# The algorithms whose function lowbit.jax writes by hand (optax's names and
# signatures: b1 / b2, SGD's momentum=None, Muon's adjust_lr_fn).
HAND_WRITTEN = ("adamw", "adam", "lion", "sgd", "muon")

# The state settings, keyword-only, with their defaults; the second moment's
# only for algorithms that may keep two.
_SETTINGS = (("state_format", "fp32"), ("second_state_format", None), ("first_normalization", None),
             ("second_normalization", None), ("min_quantized_numel", None), ("stochastic_rounding", False),
             ("error_correction", False), ("seed", 0), ("skip_nonfinite", True), ("num_threads", None))
_SECOND = ("second_state_format", "second_normalization")


def _arg(name: str) -> str:
    return "learning_rate" if name == "lr" else name


def _default(h):
    """The descriptor's default; a real as the shortest decimal of its
    float32 (0.01, not 0.009999999776482582: the same float32)."""
    if h.type != "real":
        return h.default
    short = lambda x: float(str(np.float32(x)))  # noqa: E731
    return tuple(short(x) for x in h.default) if h.count > 1 else short(h.default)


def _check_types(spec, values: dict) -> None:
    """Flags must be bools (or 0 / 1) and ints ints: a value of another type
    would otherwise be read silently (the library checks the bounds)."""
    for h in spec.hparams:
        v = values[_arg(h.name)]
        if h.type == "flag" and not (isinstance(v, bool) or (isinstance(v, int) and v in (0, 1))):
            raise InvalidArgumentError(f"lowbit.jax.{spec.name}: {h.name}={v!r} must be a bool ({h.meaning})")
        if h.type == "int" and (isinstance(v, bool) or not isinstance(v, int)):
            raise InvalidArgumentError(f"lowbit.jax.{spec.name}: {h.name}={v!r} must be an int ({h.meaning})")


def _doc(spec, common_doc: str) -> str:
    args = ", ".join(f"{_arg(h.name)}={_default(h)!r}" for h in spec.hparams)
    lines = [f"{spec.title} with lowbit state, made from the library's descriptor: {spec.name}({args}, ...).", ""]
    lines += [f"    {_arg(h.name)}: {h.meaning} ({h.type}" + (f", {h.bounds_text()})" if h.type == "real" else ")")
              for h in spec.hparams]
    moments = ", ".join(f"{n} ({k})" for n, k in zip(spec.moment_names, spec.moment_kinds))
    lines += [f"    State: {moments or 'none'} (``mu``, ``nu`` in slot order; read them with "
              "``opt.moments(state, params)``)."]
    return "\n".join(lines) + common_doc


def _function(spec, make, make_config, common, common_doc):
    P = inspect.Parameter
    params = [P(_arg(h.name), P.POSITIONAL_OR_KEYWORD, default=_default(h)) for h in spec.hparams]
    has_decay = any(h.name == "weight_decay" for h in spec.hparams)
    if has_decay:
        params.append(P("mask", P.POSITIONAL_OR_KEYWORD, default=None))
    params += [P(name, P.KEYWORD_ONLY, default=d) for name, d in _SETTINGS
               if spec.max_moments >= 2 or name not in _SECOND]
    signature = inspect.Signature(params)

    def optimizer(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"lowbit.jax.{spec.name}: {e}") from None
        bound.apply_defaults()
        a = bound.arguments
        _check_types(spec, a)
        hparams = {h.name: a[h.name] for h in spec.hparams if h.name not in ("lr", "weight_decay")}
        settings = common(spec.algorithm, a["state_format"], a.get("second_state_format"),
                          a["min_quantized_numel"], a["stochastic_rounding"], a["error_correction"], a["seed"],
                          a["skip_nonfinite"], a["num_threads"], a["first_normalization"],
                          a.get("second_normalization"))
        return make(make_config(spec.algorithm, a["learning_rate"], hparams,
                                weight_decay=a["weight_decay"] if has_decay else 0.0, mask=a.get("mask"),
                                **settings))

    optimizer.__signature__ = signature
    optimizer.__name__ = optimizer.__qualname__ = spec.name
    optimizer.__module__ = "lowbit.jax"
    optimizer.__doc__ = _doc(spec, common_doc)
    return optimizer


def described_functions(make, make_config, common, common_doc) -> dict:
    """name -> optimizer function, for every algorithm the library describes
    that lowbit.jax can step and has no hand-written function for: not a
    distributed (1-bit) optimizer, at most the two moments a JAX state holds."""
    out = {}
    for spec in algorithm_specs().values():
        if spec.name in HAND_WRITTEN or spec.distributed or spec.max_moments > 2:
            continue
        out[spec.name] = _function(spec, make, make_config, common, common_doc)
    return out

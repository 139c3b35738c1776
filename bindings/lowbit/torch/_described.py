"""lowbit.torch classes made from the library's algorithm descriptors
(lowbit_algorithm_info, lowbit_hparam_info): their keyword arguments, in
order, are the descriptor's hyper-parameters (named as torch.optim names
them), their defaults the descriptor's, their state names its moment names.
Adding an algorithm to the library adds its class here without a line of
Python (DESCRIBED_CLASSES: every described algorithm without a hand-written
class)."""

from __future__ import annotations

from .._algorithms import algorithm_spec, algorithm_specs, moments_in_use
from .._ffi import Algorithm
from .._options import fill_hparams, new_hparams
from ._base import LowbitOptimizer, refuse

# torch's switches the described classes have no counterpart for
_TORCH_SWITCHES = ("maximize", "foreach", "capturable", "differentiable", "fused")


def described_hparams(algorithm, group, real) -> dict:
    """A group's hyper-parameters by the descriptor's field names (flags as
    bools, reals through `real`)."""
    out = {}
    for h in algorithm_spec(algorithm).hparams:
        v = group[h.name]
        out[h.name] = bool(v) if h.type == "flag" else (real(v) if h.type == "real" else v)
    return out


def described_num_moments(algorithm, hparams: dict) -> int:
    """The moments a group with these hyper-parameters (by name) keeps, as
    the library counts them (lowbit_moments_in_use)."""
    hp = new_hparams(algorithm)
    fill_hparams(hp, hparams)
    return moments_in_use(algorithm, hp)


def _public_names(fields: list) -> list:
    """The keyword arguments of a described class: the descriptor's fields,
    with the pair beta1, beta2 as one ``betas``, as torch.optim and
    bitsandbytes name it."""
    if "beta1" in fields and "beta2" in fields and fields.index("beta2") == fields.index("beta1") + 1:
        i = fields.index("beta1")
        return fields[:i] + ["betas"] + fields[i + 2:]
    return list(fields)


class DescribedOptimizer(LowbitOptimizer):
    """Base of the descriptor-made classes: ``Class(params, *hparams,
    **hparams_and_lowbit_options)``, the hyper-parameters positionally in
    the descriptor's order, as torch.optim's signatures have them."""

    _refused = ("maximize",)

    def __init__(self, params, *args, **kwargs):
        spec = algorithm_spec(self._algorithm)
        fields = [h.name for h in spec.hparams]
        names = _public_names(fields)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional hyper-parameters "
                            f"({', '.join(names)}), got {len(args)}")
        defaults = spec.defaults()
        if "betas" in names:
            defaults["betas"] = (defaults.pop("beta1"), defaults.pop("beta2"))
        for name, value in zip(names, args):
            defaults[name] = value
        for name in list(kwargs):
            if name in defaults:
                if name in dict(zip(names, args)):
                    raise TypeError(f"{type(self).__name__} got hyper-parameter {name!r} twice")
                defaults[name] = kwargs.pop(name)
        if "betas" in names:
            betas = defaults.pop("betas")
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise TypeError(f"{type(self).__name__}: betas must be a pair (beta1, beta2), got {betas!r}")
            defaults["beta1"], defaults["beta2"] = betas
        switches = {name: kwargs.pop(name, None) for name in _TORCH_SWITCHES}
        refuse(maximize=switches.pop("maximize"))
        for name, value in switches.items():  # performance switches of torch's: lowbit has one fused path
            if value:
                raise ValueError(f"{name}=True is not supported by lowbit.torch.{type(self).__name__} "
                                 "(its step is always one fused pass)")
        self._hparam_names = tuple(fields)
        super().__init__(params, defaults, **kwargs)

    @property
    def _moment_names(self):  # noqa: D401  (the class attribute of the hand-written classes)
        return algorithm_spec(self._algorithm).moment_names

    def _moment_names_for(self, group):
        names = list(algorithm_spec(self._algorithm).moment_names)
        if self._algorithm == getattr(Algorithm, "RMSPROP", None) and len(names) > 1 and group.get("centered"):
            names[1] = "grad_avg"  # RMSprop's second slot holds the centred average
        return tuple(names)

    def _num_moments(self, group) -> int:
        return described_num_moments(self._algorithm, self._hparams(group))

    def _hparams(self, group):
        return described_hparams(self._algorithm, group, self._f)


# The algorithms whose lowbit.torch class is written by hand (their torch
# signatures differ from the descriptor's fields: betas, Muon's options, the
# 1-bit optimizers' communicators).
_HAND_WRITTEN = ("adamw", "adam", "lion", "sgd", "muon", "onebit_adam", "zeroone_adam", "onebit_lamb")


def _class_name(title: str) -> str:
    return "".join(ch for ch in title if ch.isalnum())


def _doc(spec) -> str:
    args = ", ".join(f"{h.name}={h.default!r}" for h in spec.hparams)
    lines = [f"{spec.title} with lowbit state, made from the library's descriptor: {spec.title}(params, {args}, "
             "**lowbit_options).", ""]
    lines += [f"* ``{h.name}``: {h.meaning} ({h.type}, {h.bounds_text() if h.type == 'real' else 'flag'})"
              for h in spec.hparams]
    moments = ", ".join(f"``{n}`` ({k})" for n, k in zip(spec.moment_names, spec.moment_kinds))
    lines += ["", f"State: {moments or 'none'}."]
    return "\n".join(lines)


def _make_classes() -> dict:
    out = {}
    for spec in algorithm_specs().values():
        if spec.name in _HAND_WRITTEN or spec.distributed or spec.matrices:
            continue
        name = _class_name(spec.title)
        out[name] = type(name, (DescribedOptimizer,), {"_algorithm": spec.algorithm, "__doc__": _doc(spec),
                                                       "__module__": "lowbit.torch"})
    return out


#: Every algorithm the library describes that has no hand-written class:
#: class name -> class (RMSprop, Adagrad, ...), exported by lowbit.torch.
DESCRIBED_CLASSES = _make_classes()

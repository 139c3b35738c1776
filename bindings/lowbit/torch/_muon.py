"""Muon of lowbit.torch: torch.optim.Muon's arguments, lowbit state, and the
usual hybrid (1-D params, embeddings and heads stepped with AdamW in the same
optimizer, through a param group that says ``"algorithm": "adamw"``)."""

from __future__ import annotations

import torch

from .._algorithms import algorithm_spec
from .._ffi import Algorithm, Normalization, StateFormat
from .._names import parse_adjust_lr, parse_algorithm, parse_ns_precision, parse_state_format
from ._adam import _betas
from ._base import LowbitOptimizer
from ._tensors import _is_dtensor

# torch.optim.Muon's constants (Keller Jordan's Muon)
DEFAULT_NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
DEFAULT_NS_STEPS = 5
EPS = 1e-7
_TORCH_ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped", "none")

# What a hybrid group of each algorithm keeps, and its defaults (those of
# lowbit.torch.AdamW / Adam / Lion / SGD, i.e. torch's), filled in before the
# Muon defaults so that a group saying {"params": ..., "algorithm": "adamw"}
# gets AdamW's betas, eps and weight decay, not Muon's.
_GROUP_DEFAULTS = {
    Algorithm.ADAMW: dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, bias_correction=True),
    Algorithm.ADAM: dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, bias_correction=True),
    Algorithm.LION: dict(betas=(0.9, 0.99), weight_decay=0.0),
    Algorithm.SGD: dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
}
# The algorithms made from the library's descriptors (lowbit.torch.RMSprop,
# Adagrad) take their defaults, fields and state names from them.
from ._described import DESCRIBED_CLASSES, described_hparams, described_num_moments  # noqa: E402

_DESCRIBED = tuple(c._algorithm for c in DESCRIBED_CLASSES.values() if algorithm_spec(c._algorithm).hybrid_group)
for _algo in _DESCRIBED:
    _GROUP_DEFAULTS[_algo] = algorithm_spec(_algo).defaults()
_GROUP_MOMENTS = {algo: algorithm_spec(algo).moment_names for algo in _GROUP_DEFAULTS}
# Group keys that are lowbit's own (not torch.optim.Muon's): dropped from torch_state_dict().
_LOWBIT_MUON_KEYS = ("ns_precision",)


def _group_algorithm(group) -> Algorithm:
    """The algorithm of a param group: Muon unless it says "adamw", "adam",
    "lion" or "sgd" under "algorithm"."""
    name = group.get("algorithm")
    if name is None:
        return Algorithm.MUON
    try:
        algo = parse_algorithm(name)
    except ValueError:
        algo = None
    if algo not in (Algorithm.MUON,) + tuple(_GROUP_DEFAULTS):
        others = ", ".join(repr(a.name.lower()) for a in _GROUP_DEFAULTS)
        raise ValueError(f"param group algorithm={name!r}: a Muon optimizer's group is 'muon' (the default) or "
                         f"one of {others}")
    return algo


class Muon(LowbitOptimizer):
    """Muon, like ``torch.optim.Muon`` (the same arguments and defaults), with
    lowbit state for its momentum buffer.

    For a param of >= 2 dims (more dims are read as rows = dim 0, cols = the
    rest, as Keller Jordan's Muon reshapes conv weights; torch.optim.Muon
    takes 2-D params only)::

        B <- B + (1 - momentum) (g - B)          (the momentum buffer)
        U <- nesterov ? g + momentum (B - g) : B
        O <- NS(U)   (ns_steps Newton-Schulz iterations of ns_coefficients,
                      on U / max(||U||_F, eps), transposed when rows > cols)
        p <- p (1 - lr weight_decay) - adjusted_lr O

    ``adjust_lr_fn``: None / "original" (``lr sqrt(max(1, rows / cols))``),
    "match_rms_adamw" (``0.2 lr sqrt(max(rows, cols))``), "spectral_unclamped"
    (``lr sqrt(rows / cols)``) as torch's, and "none" (``lr``).

    lowbit's options: ``state`` ("fp32", "bf16", "8bit", "4bit", "fp8", ...:
    how the momentum buffer is kept; an 8-bit or 4-bit momentum of a Muon
    param is normalised rank-1, one max vector per dim, unless
    ``first_normalization`` says otherwise), ``ns_precision``: how the Newton-Schulz
    products are rounded: "default" (fp32 on the CPU, bf16 on CUDA), "fp32",
    or "bf16" (torch.optim.Muon's: the update, its norm and every product
    rounded to bf16), and the options every lowbit.torch optimizer takes
    (``min_quantized_numel``, ``stochastic_rounding``, ``error_correction``,
    ``seed``, ``skip_nonfinite``, ``num_threads``).

    Hybrid: a param group may say ``"algorithm": "adamw"`` (or "adam",
    "lion", "sgd"); its params are stepped with that algorithm in the same
    optimizer, with its own hyper-parameters and defaults (AdamW: betas
    (0.9, 0.999), eps 1e-8, weight_decay 1e-2), and any state format::

        opt = lowbit.torch.Muon([
            {"params": [p for p in model.parameters() if p.ndim >= 2], "lr": 0.02},
            {"params": [p for p in model.parameters() if p.ndim < 2], "algorithm": "adamw", "lr": 3e-4},
        ], state="8bit")

    A param of fewer than 2 dims in a Muon group is refused (ValueError) when
    the group is added. ``state_dict()`` holds lowbit's compressed state;
    ``torch_state_dict()`` gives torch.optim.Muon's layout (a float32
    ``momentum_buffer`` per Muon param; the hybrid groups' params as AdamW /
    Adam / SGD keep theirs); ``load_state_dict()`` also takes a
    ``torch.optim.Muon`` state dict."""

    _algorithm = Algorithm.MUON
    _moment_names = ("momentum_buffer",)

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=DEFAULT_NS_COEFFICIENTS, eps=EPS, ns_steps=DEFAULT_NS_STEPS, adjust_lr_fn=None, *,
                 ns_precision="default", **lowbit_options):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        _check_muon_options(adjust_lr_fn, ns_coefficients, ns_steps, ns_precision)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, ns_precision=ns_precision)
        super().__init__(params, defaults, **lowbit_options)

    # -- groups

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, plus: a hybrid group gets its algorithm's
        defaults (not Muon's), and a Muon group's params must have >= 2 dims."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group.get("params")
        if isinstance(params, torch.Tensor):
            param_group["params"] = [params]
        elif params is not None and not isinstance(params, set):  # torch raises for a set
            param_group["params"] = list(params)
        algo = _group_algorithm(param_group)
        if algo == Algorithm.MUON:
            for i, p in enumerate(param_group.get("params") or ()):
                if isinstance(p, torch.Tensor) and p.ndim < 2:
                    raise ValueError(
                        f"Muon orthogonalises matrices: param {i} of a Muon group has shape {tuple(p.shape)} "
                        f"({p.ndim} dims). Put 1-D params (biases, norms) in a param group with "
                        "\"algorithm\": \"adamw\" (e.g. {\"params\": [...], \"algorithm\": \"adamw\", \"lr\": 3e-4})")
                if isinstance(p, torch.Tensor) and _is_dtensor(p):
                    raise ValueError(f"param {i} of a Muon group is a DTensor: Muon orthogonalises whole matrices, "
                                     "and lowbit steps a DTensor's local shard; keep Muon's params unsharded")
        else:
            for k, v in _GROUP_DEFAULTS[algo].items():
                param_group.setdefault(k, v)
        super().add_param_group(param_group)

    def _check_group(self, group):
        super()._check_group(group)
        if _group_algorithm(group) == Algorithm.MUON:
            _check_muon_options(group.get("adjust_lr_fn"), group.get("ns_coefficients", DEFAULT_NS_COEFFICIENTS),
                                group.get("ns_steps", DEFAULT_NS_STEPS), group.get("ns_precision", "default"))

    def _num_moments(self, group) -> int:
        algo = _group_algorithm(group)
        if algo == Algorithm.SGD:
            return 1 if self._f(group["momentum"]) != 0 else 0
        if algo in _DESCRIBED:
            return described_num_moments(algo, described_hparams(algo, group, self._f))
        return len(self._moment_names_for(group))

    def _moment_names_for(self, group) -> tuple:
        algo = _group_algorithm(group)
        return self._moment_names if algo == Algorithm.MUON else _GROUP_MOMENTS[algo]

    def _param_options(self, p, group) -> dict:
        # A Muon matrix's 8-bit / 4-bit momentum is normalised rank-1 (one
        # max vector per dim; capi "Shaped parameters") unless the optimizer
        # was given first_normalization: 1.004 / 0.504 bytes per element of a
        # 4096 x 4096 matrix, where blocks take 1.016 / 0.531, and 4-bit
        # trains closer to fp32 (tests/python/test_muon.py).
        if _group_algorithm(group) != Algorithm.MUON or self._config["first_normalization"] != Normalization.DEFAULT:
            return {}
        fmt = parse_state_format(group.get("state"), "state")
        if fmt == StateFormat.DEFAULT:
            fmt = self._state_format
        return {"first_normalization": "rank1"} if fmt in (StateFormat.BIT8, StateFormat.BIT4) else {}

    def _hparams(self, group) -> dict:
        algo = _group_algorithm(group)
        f = self._f
        if algo == Algorithm.MUON:
            return dict(algorithm="muon", lr=f(group["lr"]), weight_decay=f(group["weight_decay"]),
                        momentum=f(group["momentum"]), nesterov=bool(group["nesterov"]), eps=f(group["eps"]),
                        ns_steps=int(group.get("ns_steps", DEFAULT_NS_STEPS)),
                        ns_coefficients=tuple(float(c) for c in group.get("ns_coefficients",
                                                                          DEFAULT_NS_COEFFICIENTS)),
                        adjust_lr=_adjust_name(group.get("adjust_lr_fn")),
                        ns_precision=_precision_name(group.get("ns_precision", "default")))
        name = algo.name.lower()
        if algo in _DESCRIBED:
            return dict(algorithm=name, **described_hparams(algo, group, f))
        if algo in (Algorithm.ADAMW, Algorithm.ADAM):
            b1, b2 = _betas(group)
            return dict(algorithm=name, lr=f(group["lr"]), beta1=b1, beta2=b2, eps=f(group["eps"]),
                        weight_decay=f(group["weight_decay"]), bias_correction=bool(group.get("bias_correction", True)))
        if algo == Algorithm.LION:
            b1, b2 = _betas(group)
            return dict(algorithm=name, lr=f(group["lr"]), beta1=b1, beta2=b2, weight_decay=f(group["weight_decay"]))
        return dict(algorithm=name, lr=f(group["lr"]), momentum=f(group["momentum"]),
                    dampening=f(group["dampening"]), weight_decay=f(group["weight_decay"]),
                    nesterov=bool(group["nesterov"]))

    # -- state dicts

    def torch_state_dict(self) -> dict:
        """This optimizer's state in torch.optim.Muon's layout: per Muon param
        a float32 ``momentum_buffer`` shaped like the param (no step count,
        as torch's), param groups without lowbit's own options. The params of
        hybrid groups keep their algorithm's torch layout (AdamW / Adam:
        ``step``, ``exp_avg``, ``exp_avg_sq``; SGD: ``momentum_buffer``)."""
        out = super().torch_state_dict()
        index = self._param_index()
        for group, packed in zip(self.param_groups, out["param_groups"]):
            algo = _group_algorithm(group)
            if algo == Algorithm.MUON:
                for k in _LOWBIT_MUON_KEYS:
                    packed.pop(k, None)
            if algo in (Algorithm.MUON, Algorithm.SGD):
                for p in group["params"]:
                    out["state"].get(index[p], {}).pop("step", None)
        return out


def _precision_name(ns_precision) -> str:
    return parse_ns_precision(ns_precision, "ns_precision").name.lower()


def _adjust_name(adjust_lr_fn) -> str:
    return "original" if adjust_lr_fn is None else str(adjust_lr_fn).lower()


def _check_muon_options(adjust_lr_fn, ns_coefficients, ns_steps, ns_precision) -> None:
    """torch.optim.Muon's checks of its options (ValueError), and lowbit's
    ns_precision names."""
    if adjust_lr_fn is not None and (not isinstance(adjust_lr_fn, str) or
                                     adjust_lr_fn.lower() not in _TORCH_ADJUST_LR_FNS):
        raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported (one of None, 'original', "
                         "'match_rms_adamw', 'spectral_unclamped', or lowbit's 'none')")
    parse_adjust_lr(_adjust_name(adjust_lr_fn), "adjust_lr_fn")
    try:
        coeffs = tuple(ns_coefficients)
    except TypeError:
        raise ValueError(f"ns_coefficients={ns_coefficients!r} must be a tuple of exactly 3 values") from None
    if len(coeffs) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or not 1 <= ns_steps < 100:
        raise ValueError(f"ns_steps={ns_steps!r} must be an int in 1..99 (Newton-Schulz iterations; torch.optim.Muon "
                         "also refuses 100 or more)")
    parse_ns_precision(ns_precision, "ns_precision")

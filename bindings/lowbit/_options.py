"""The structs the optimizer exchanges with the library by value:
hyper-parameters (lowbit_hparams_t), the 1-bit options
(lowbit_onebit_options_t, names and defaults from the declarations and
lowbit_onebit_options_init; the library checks their ranges), and what the
library reports (:class:`OneBitStatus`, :class:`ParamInfo`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ._errors import InvalidArgumentError
from ._ffi import Algorithm, Dtype, Normalization, StateFormat, ffi, struct_fields
from ._lib import call
from ._names import (
    MUON_LR_ADJUST_NAMES,
    NORMALIZATION_NAMES,
    NS_PRECISION_NAMES,
    STATE_FORMAT_NAMES,
    MuonLrAdjust,
    NsPrecision,
    algorithm_name,
    c_int,
    parse_adjust_lr,
    parse_algorithm,
    parse_ns_precision,
)

# ----------------------------------------------------------------- optimizer settings


@functools.lru_cache(maxsize=16)
def _config_defaults(algorithm) -> tuple:
    cfg = ffi.new("lowbit_optimizer_config_t *")
    call("lowbit_optimizer_config_init_sized", cfg, ffi.sizeof(cfg[0]), int(algorithm))
    return tuple((name, getattr(cfg, name)) for name in struct_fields("lowbit_optimizer_config_t")[1:])


def config_defaults(algorithm) -> dict:
    """The library's defaults of lowbit_optimizer_config_t for `algorithm`
    (lowbit_optimizer_config_init), by field name."""
    return dict(_config_defaults(int(algorithm)))


# ----------------------------------------------------------------- hyper-parameters

HPARAM_NAMES = ("lr", "betas", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening", "nesterov",
                "bias_correction")
_HPARAM_FIELDS = set(struct_fields("lowbit_hparams_t"))
#: Since 0.7: a group's own algorithm (a Muon optimizer's hybrid groups) and
#: Muon's options; present where the loaded library declares them.
MUON_HPARAM_NAMES = tuple(n for n in ("ns_steps", "ns_coefficients", "adjust_lr", "ns_precision")
                          if n in _HPARAM_FIELDS)
if "algorithm" in _HPARAM_FIELDS:
    HPARAM_NAMES += ("algorithm",) + MUON_HPARAM_NAMES
_HPARAM_FLAGS = ("nesterov", "bias_correction")
_HPARAM_REALS = ("lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening")


def _described_hparams() -> dict:
    """The fields the library's descriptors name beyond the ones above
    (since 0.8: RMSprop's, Adagrad's, ...), by name: their type."""
    try:
        from ._algorithms import algorithm_specs

        specs = algorithm_specs()
    except Exception:  # a library before 0.8: no descriptors
        return {}
    out = {}
    for spec in specs.values():
        for h in spec.hparams:
            if h.name not in HPARAM_NAMES and h.name in _HPARAM_FIELDS:
                out[h.name] = h.type
    return out


_DESCRIBED = _described_hparams()
HPARAM_NAMES += tuple(_DESCRIBED)
_HPARAM_FLAGS += tuple(n for n, t in _DESCRIBED.items() if t == "flag")
_HPARAM_REALS += tuple(n for n, t in _DESCRIBED.items() if t == "real")
_HPARAM_INTS = tuple(n for n, t in _DESCRIBED.items() if t in ("int", "enum"))


def hparam_keywords(algorithm) -> tuple | None:
    """The hyper-parameter keywords `algorithm` takes: its descriptor's
    fields (lowbit_hparam_info), in its order, with ``betas`` beside
    ``beta1`` / ``beta2`` (torch's pair). None for a library without
    descriptors (before 0.8: every field is taken)."""
    try:
        from ._algorithms import algorithm_spec

        names = [h.name for h in algorithm_spec(algorithm).hparams]
    except Exception:  # a library before 0.8: no descriptors
        return None
    if "beta1" in names and "beta2" in names:
        names.insert(names.index("beta1"), "betas")
    return tuple(names)


def check_hparam_keywords(algorithm, kw: dict) -> dict:
    """The hyper-parameters given by keyword to an optimizer of `algorithm`
    (None: not given, dropped), checked against its descriptor: a field of
    other algorithms only is InvalidArgumentError naming it and who takes
    it; a name no algorithm has, TypeError (as Python's own for an
    unexpected keyword)."""
    given = {k: v for k, v in kw.items() if v is not None}
    mine = hparam_keywords(algorithm)
    known = set(HPARAM_NAMES) - {"algorithm"}
    for name in given:
        if name not in known:
            raise TypeError(f"lowbit.Optimizer() got an unexpected keyword argument {name!r} (hyper-parameters of "
                            f"{algorithm_name(algorithm)}: {', '.join(mine or sorted(known))})")
    if mine is None:
        return given
    foreign = [n for n in given if n not in mine]
    if foreign:
        from ._algorithms import algorithm_specs

        takers = {}
        for spec in algorithm_specs().values():
            names = set(hparam_keywords(spec.algorithm) or ())
            for n in foreign:
                if n in names:
                    takers.setdefault(n, []).append(spec.title)
        said = "; ".join(f"{n} is {', '.join(t + chr(39) + 's' for t in takers.get(n, []))}" for n in foreign)
        raise InvalidArgumentError(f"not hyper-parameters of {algorithm_name(algorithm)}: {', '.join(foreign)} "
                                   f"({said}); {algorithm_name(algorithm)} takes {', '.join(mine)}")
    return given


def new_hparams(algorithm):
    """A cffi lowbit_hparams_t, the whole struct as declared, with the
    algorithm's defaults (a group of another algorithm in a Muon optimizer:
    that algorithm's defaults, and its ``algorithm`` field set)."""
    hp = ffi.new("lowbit_hparams_t *")
    call("lowbit_hparams_init_sized", hp, ffi.sizeof(hp[0]), int(algorithm))
    return hp


def as_real(name, value) -> float:
    """`value` as a float, or InvalidArgumentError naming `name`."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name}={value!r} is not a real number") from None


def fill_hparams(hp, kw: dict) -> None:
    """Write hyper-parameters given by name into a cffi lowbit_hparams_t (the
    library checks their values when it receives them)."""
    for name, value in kw.items():
        if value is None:
            continue
        if name == "betas":
            b1, b2 = value
            hp.beta1, hp.beta2 = as_real("beta1", b1), as_real("beta2", b2)
        elif name in _HPARAM_FLAGS:
            setattr(hp, name, int(bool(value)))
        elif name in _HPARAM_REALS:
            setattr(hp, name, as_real(name, value))
        elif name == "algorithm" and "algorithm" in _HPARAM_FIELDS:
            hp.algorithm = int(parse_algorithm(value)) if value != 0 else 0
        elif name == "ns_steps" and name in _HPARAM_FIELDS:
            hp.ns_steps = c_int(value, "ns_steps", "int32_t")
        elif name == "ns_coefficients" and name in _HPARAM_FIELDS:
            try:
                coeffs = [as_real("ns_coefficients", c) for c in value]
            except TypeError:
                raise InvalidArgumentError(f"ns_coefficients={value!r} is not a sequence of 3 reals") from None
            if len(coeffs) != 3:
                raise InvalidArgumentError(f"ns_coefficients={value!r} must hold exactly 3 values (a, b, c)")
            for k, c in enumerate(coeffs):
                hp.ns_coefficients[k] = c
        elif name == "adjust_lr" and name in _HPARAM_FIELDS:
            hp.adjust_lr = int(parse_adjust_lr(value))
        elif name == "ns_precision" and name in _HPARAM_FIELDS:
            hp.ns_precision = int(parse_ns_precision(value))
        elif name in _HPARAM_INTS:
            setattr(hp, name, c_int(value, name, "int32_t"))
        else:
            raise InvalidArgumentError(f"unknown hyper-parameter {name!r}; known: {', '.join(HPARAM_NAMES)}")


def hparams_to_dict(hp, optimizer_algorithm=None) -> dict:
    """The hyper-parameters by name (what fill_hparams takes). Since 0.7
    also the group's ``algorithm`` (its name; the optimizer's when the
    library says 0 and `optimizer_algorithm` is given), and for a Muon group
    Muon's options (``ns_steps``, ``ns_coefficients``,
    ``adjust_lr``, ``ns_precision``, by name)."""
    out = {
        "lr": hp.lr,
        "betas": (hp.beta1, hp.beta2),
        "eps": hp.eps,
        "weight_decay": hp.weight_decay,
        "momentum": hp.momentum,
        "dampening": hp.dampening,
        "nesterov": bool(hp.nesterov),
        "bias_correction": bool(hp.bias_correction),
    }
    algo = int(getattr(hp, "algorithm", 0) or 0) or (int(optimizer_algorithm) if optimizer_algorithm else 0)
    if _DESCRIBED and algo:
        from ._algorithms import algorithm_spec

        for h in algorithm_spec(algo).hparams:  # the 0.8 fields of the group's algorithm
            t = _DESCRIBED.get(h.name)
            if t is not None:
                v = getattr(hp, h.name)
                out[h.name] = bool(v) if t == "flag" else int(v) if t in ("int", "enum") else float(v)
    if "algorithm" in _HPARAM_FIELDS:
        algo = int(hp.algorithm) or (int(optimizer_algorithm) if optimizer_algorithm is not None else 0)
        if algo:
            out["algorithm"] = algorithm_name(algo)
        muon = getattr(Algorithm, "MUON", None)
        if muon is not None and algo == muon and MUON_HPARAM_NAMES:
            out["ns_steps"] = int(hp.ns_steps)
            out["ns_coefficients"] = tuple(float(c) for c in hp.ns_coefficients)
            out["adjust_lr"] = MUON_LR_ADJUST_NAMES.get(MuonLrAdjust(hp.adjust_lr), int(hp.adjust_lr))
            out["ns_precision"] = NS_PRECISION_NAMES.get(NsPrecision(hp.ns_precision), int(hp.ns_precision))
    return out


# ----------------------------------------------------------------- 1-bit options

# lowbit_onebit_options_t (0/1 Adam and 1-bit LAMB; DeepSpeed's names), from
# the declarations: the integer fields and the real ones.
_ONEBIT_FIELDS = [(name, f.type) for name, f in ffi.typeof("lowbit_onebit_options_t").fields if name != "struct_size"]
ONEBIT_INT_OPTIONS = tuple(name for name, t in _ONEBIT_FIELDS if t.kind == "primitive" and "int" in t.cname)
ONEBIT_FLOAT_OPTIONS = tuple(name for name, t in _ONEBIT_FIELDS if t.cname in ("float", "double"))
ONEBIT_OPTION_NAMES = tuple(name for name, _ in _ONEBIT_FIELDS)
_ONEBIT_TYPES = dict(_ONEBIT_FIELDS)


def onebit_options_defaults() -> dict:
    """The library's defaults of lowbit_onebit_options_t, by name."""
    o = ffi.new("lowbit_onebit_options_t *")
    call("lowbit_onebit_options_init", o)
    return {name: getattr(o, name) for name in ONEBIT_OPTION_NAMES}


def check_onebit_options(options: dict) -> dict:
    """The options given by name, checked for names and types (the library
    checks the values' ranges): ints for the 0/1 Adam counts, reals for the
    LAMB factors. Returns them converted (int / float)."""
    out = {}
    for name, value in options.items():
        if name not in ONEBIT_OPTION_NAMES:
            raise InvalidArgumentError(f"unknown 1-bit option {name!r}; known: {', '.join(ONEBIT_OPTION_NAMES)}")
        if name in ONEBIT_INT_OPTIONS:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidArgumentError(f"{name}={value!r} must be an int")
            out[name] = c_int(value, name, _ONEBIT_TYPES[name].cname)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InvalidArgumentError(f"{name}={value!r} must be a real number")
            out[name] = float(value)
    return out


def onebit_options_struct(options: dict):
    """A cffi lowbit_onebit_options_t: the library's defaults, then
    `options` (checked by check_onebit_options)."""
    o = ffi.new("lowbit_onebit_options_t *")
    call("lowbit_onebit_options_init", o)
    for name, value in options.items():
        setattr(o, name, value)
    return o


# ----------------------------------------------------------------- what the library reports

_EXCHANGE_NAMES = {0: "none", 1: "average", 2: "1bit"}


@dataclass(frozen=True)
class OneBitStatus:
    """Where a 1-bit optimizer stands (lowbit_onebit_status_t).

    ``phase``: 0 in warm-up (0/1 Adam: phase 1, the variance still adapts),
    1 in the compressed stage (0/1 Adam: phase 2, local steps).
    ``next_full_average``: the next step runs on gradients averaged
    uncompressed over the ranks (by the optimizer, or by the caller, e.g. a
    DDP comm hook, after ``set_onebit_warmup_average(False)``); otherwise it
    runs on this rank's local gradients. ``next_exchange``: what the next
    step sends: ``"none"``, ``"average"`` (uncompressed) or ``"1bit"``. The
    interval fields are 0/1 Adam's schedules (0 for the others)."""

    step: int
    phase: int
    next_full_average: bool
    next_exchange: str
    var_interval: int = 0
    var_counter: int = 0
    local_step_interval: int = 0
    local_step_counter: int = 0

    @classmethod
    def from_c(cls, st) -> "OneBitStatus":
        return cls(step=st.step, phase=st.phase, next_full_average=bool(st.next_full_average),
                   next_exchange=_EXCHANGE_NAMES.get(st.next_exchange, str(st.next_exchange)),
                   var_interval=st.var_interval, var_counter=st.var_counter,
                   local_step_interval=st.local_step_interval, local_step_counter=st.local_step_counter)


@dataclass(frozen=True)
class ParamInfo:
    """What the library knows about one registered parameter."""

    numel: int
    step: int
    group: int
    param_dtype: str
    state_format: str
    second_state_format: str | None
    stochastic_rounding: bool
    error_correction: bool
    state_bytes: int
    first_normalization: str = "block"
    second_normalization: str | None = None
    ndim: int = 0

    @classmethod
    def from_c(cls, info, dtype_names: dict) -> "ParamInfo":
        second = StateFormat(info.second_state_format)
        return cls(
            numel=info.numel,
            step=info.step,
            group=info.group,
            param_dtype=dtype_names[Dtype(info.param_dtype)],
            state_format=STATE_FORMAT_NAMES[StateFormat(info.state_format)],
            second_state_format=None if second == StateFormat.DEFAULT else STATE_FORMAT_NAMES[second],
            stochastic_rounding=bool(info.stochastic_rounding),
            error_correction=bool(info.error_correction),
            state_bytes=info.state_bytes,
            first_normalization=NORMALIZATION_NAMES[Normalization(info.first_normalization)],
            second_normalization=(None if info.second_normalization == Normalization.DEFAULT
                                  else NORMALIZATION_NAMES[Normalization(info.second_normalization)]),
            ndim=info.ndim,
        )

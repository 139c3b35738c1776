"""The library's algorithm descriptors (lowbit_algorithm_info,
lowbit_hparam_info): every algorithm's name, moments and their kinds, and its
hyper-parameters with their defaults, bounds and meanings. The bindings take
their keyword arguments, defaults and hyper-parameter fields from here
instead of restating them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ._ffi import Algorithm, ffi
from ._lib import call

_TYPES = {1: "real", 2: "flag", 3: "int", 4: "enum"}
_KINDS = {1: "signed", 2: "unsigned"}


@dataclass(frozen=True)
class HparamSpec:
    """One hyper-parameter of one algorithm: the lowbit_hparams_t field
    ``name``, its ``default`` (a tuple for ns_coefficients), bounds and meaning."""

    name: str
    meaning: str
    type: str  # "real", "flag", "int", "enum"
    count: int
    default: object
    lower: float
    upper: float
    lower_inclusive: bool
    upper_inclusive: bool
    since: int

    def bounds_text(self) -> str:
        lo = "[" if self.lower_inclusive else "("
        hi = "]" if self.upper_inclusive else ")"
        return f"{lo}{self.lower:g}, {self.upper:g}{hi}"


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm's descriptor."""

    algorithm: Algorithm
    name: str
    title: str
    max_moments: int
    moment_names: tuple
    moment_kinds: tuple  # "signed" / "unsigned", per slot
    reads_param: bool
    bias_correction: bool
    factored_second: bool
    distributed: bool
    hybrid_group: bool
    matrices: bool
    hparams: tuple  # HparamSpec, in the library's order

    def hparam(self, name: str) -> HparamSpec:
        for h in self.hparams:
            if h.name == name:
                return h
        raise KeyError(name)

    def defaults(self) -> dict:
        """The hyper-parameters' defaults by field name."""
        return {h.name: h.default for h in self.hparams}


def _s(p) -> str:
    return ffi.string(p).decode() if p != ffi.NULL else ""


@functools.lru_cache(maxsize=None)
def algorithm_spec(algorithm) -> AlgorithmSpec:
    """The descriptor of `algorithm` (an :class:`Algorithm` or its value)."""
    info = ffi.new("lowbit_algorithm_info_t *")
    info.struct_size = ffi.sizeof(info[0])
    call("lowbit_algorithm_info", int(algorithm), info)
    specs = []
    for i in range(info.num_hparams):
        h = ffi.new("lowbit_hparam_info_t *")
        h.struct_size = ffi.sizeof(h[0])
        call("lowbit_hparam_info", int(algorithm), i, h)
        kind = _TYPES[int(h.type)]
        values = [float(h.default_value[k]) for k in range(h.count)]
        if kind != "real":
            values = [int(v) for v in values]
        if kind == "flag":
            values = [bool(v) for v in values]
        specs.append(HparamSpec(name=_s(h.name), meaning=_s(h.meaning), type=kind, count=int(h.count),
                                default=tuple(values) if h.count > 1 else values[0], lower=float(h.lower),
                                upper=float(h.upper), lower_inclusive=bool(h.lower_inclusive),
                                upper_inclusive=bool(h.upper_inclusive), since=int(h.since)))
    n = int(info.max_moments)
    return AlgorithmSpec(
        algorithm=Algorithm(int(algorithm)), name=_s(info.name), title=_s(info.title), max_moments=n,
        moment_names=tuple(_s(info.moment_names[k]) for k in range(n)),
        moment_kinds=tuple(_KINDS[int(info.moment_kinds[k])] for k in range(n)),
        reads_param=bool(info.reads_param), bias_correction=bool(info.bias_correction),
        factored_second=bool(info.factored_second), distributed=bool(info.distributed),
        hybrid_group=bool(info.hybrid_group), matrices=bool(info.matrices), hparams=tuple(specs))


@functools.lru_cache(maxsize=1)
def algorithm_specs() -> dict:
    """Every algorithm of the loaded library, by name."""
    count = ffi.new("int32_t *")
    call("lowbit_algorithms", ffi.NULL, 0, count)
    out = ffi.new("lowbit_algorithm_t[]", count[0])
    call("lowbit_algorithms", out, count[0], count)
    specs = (algorithm_spec(int(out[i])) for i in range(count[0]))
    return {s.name: s for s in specs}


def moments_in_use(algorithm, hparams) -> int:
    """How many moments a param of a group with the cffi lowbit_hparams_t
    `hparams` keeps (lowbit_moments_in_use)."""
    count = ffi.new("int32_t *")
    call("lowbit_moments_in_use", int(algorithm), hparams, count)
    return int(count[0])

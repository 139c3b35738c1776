"""The optimizer state a parameter gets, planned by the library
(lowbit_plan_param_state): the one home of format resolution, the size
threshold, moment counts, normalisations (block, rank-1, factored: capi/
lowbit.h "Shaped parameters"), block and byte sizes and the rounding
precedence. Used by lowbit.jax, which keeps the state itself."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ._ffi import MAX_DIMS, Algorithm, Dtype, Normalization, Rounding, StateFormat, ffi
from ._lib import call


@dataclass(frozen=True)
class StatePlan:
    num_moments: int
    formats: tuple  # StateFormat of moments 0 and 1 (DEFAULT where the algorithm keeps none)
    block_size: tuple  # elements per fp32 scale (0: unquantized)
    data_bytes: tuple
    scale_count: tuple
    rounding: Rounding
    ecc_bytes: int
    state_bytes: int
    # Normalization of moments 0 and 1, resolved (BLOCK for unquantized
    # formats and params under 2 dims; DEFAULT where the algorithm keeps none)
    normalization: tuple = (Normalization.DEFAULT, Normalization.DEFAULT)


@functools.lru_cache(maxsize=4096)
def plan_param_state(algorithm: Algorithm, numel: int, dtype: Dtype, *, state_format=StateFormat.FP32,
                     second_state_format=StateFormat.DEFAULT, min_quantized_numel: int | None = None,
                     stochastic_rounding: bool = False, error_correction: bool = False,
                     momentum: float = 0.0, shape: tuple = (),
                     first_normalization=Normalization.DEFAULT,
                     second_normalization=Normalization.DEFAULT, hparams: tuple = ()) -> StatePlan:
    """The state of a param of `numel` elements and `dtype` in an optimizer
    with these settings (the optimizer-wide ones of lowbit_optimizer_config_t;
    `momentum` is SGD's, which decides whether it keeps a moment).
    `hparams`: more of the group's hyper-parameters, as (name, value) pairs
    of lowbit_hparam_info names (e.g. RMSprop's ``centered``, which decides
    whether it keeps a second moment); written after `momentum`.

    `shape`: the param's dims (a tuple of at most 8 ints >= 1 whose product is
    `numel`; () = 1-D), which rank-1 and factored moments follow.
    `first_normalization` / `second_normalization`: the optimizer's
    (lowbit_normalization_t); the plan's `normalization` says what each
    moment gets. Arguments must be hashable (the plan is cached): a shape is a
    tuple, not a list."""
    cfg = ffi.new("lowbit_optimizer_config_t *")
    call("lowbit_optimizer_config_init_sized", cfg, ffi.sizeof(cfg[0]), int(algorithm))
    cfg.state_format = int(state_format)
    cfg.second_state_format = int(second_state_format)
    if min_quantized_numel is not None:  # else the library's default
        cfg.min_quantized_numel = int(min_quantized_numel)
    cfg.stochastic_rounding = int(bool(stochastic_rounding))
    cfg.error_correction = int(bool(error_correction))
    cfg.first_normalization = int(first_normalization)
    cfg.second_normalization = int(second_normalization)
    hp = ffi.new("lowbit_hparams_t *")
    # the whole struct as declared (the plain lowbit_hparams_init fills the
    # 0.2 struct, whose struct_size hides the later fields from the library)
    call("lowbit_hparams_init_sized", hp, ffi.sizeof(hp[0]), int(algorithm))
    hp.momentum = float(momentum)
    if hparams:
        from ._options import fill_hparams

        fill_hparams(hp, dict(hparams))
    pc = ffi.new("lowbit_param_config_t *")
    call("lowbit_param_config_init_sized", pc, ffi.sizeof(pc[0]))
    pc.param.numel = int(numel)
    pc.param.dtype = int(dtype)
    if not isinstance(shape, tuple):
        raise TypeError(f"shape must be a tuple of ints, got {type(shape).__name__}")
    if len(shape) > MAX_DIMS:
        raise ValueError(f"shape {shape} has {len(shape)} dims; lowbit takes at most {MAX_DIMS}")
    pc.ndim = len(shape)
    for k, d in enumerate(shape):
        pc.shape[k] = int(d)
    out = ffi.new("lowbit_state_plan_t *")
    out.struct_size = ffi.sizeof("lowbit_state_plan_t")
    call("lowbit_plan_param_state", cfg, hp, pc, out)
    return StatePlan(
        num_moments=out.num_moments,
        formats=tuple(StateFormat(f) for f in out.format),
        block_size=tuple(out.block_size),
        data_bytes=tuple(out.data_bytes),
        scale_count=tuple(out.scale_count),
        rounding=Rounding(out.rounding),
        ecc_bytes=out.ecc_bytes,
        state_bytes=out.state_bytes,
        normalization=tuple(Normalization(n) for n in out.normalization),
    )

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

RMSprop and Adagrad (``ljax.rmsprop``, ``ljax.adagrad``), and every other
algorithm the library describes without a function written here, are made
from the library's descriptors: torch.optim's arguments in its order (``lr``
named ``learning_rate``), its defaults, then ``mask`` and the state settings
below:

    opt = ljax.rmsprop(1e-2, alpha=0.99, momentum=0.9, state_format="8bit")
    opt = ljax.adagrad(1e-2, lr_decay=1e-3, initial_accumulator_value=0.1)
    mu, nu = opt.moments(state, params)   # dequantized, with each slot's maps

Muon (``ljax.muon``, torch.optim.Muon's arguments) takes leaves of 2 or
more dims; step the others with another transformation in the same
``optax.partition`` (the Muon + AdamW hybrid):

    labels = jax.tree_util.tree_map(lambda p: "muon" if p.ndim >= 2 else "adamw", params)
    opt = optax.partition({"muon": ljax.muon(0.02, state_format="8bit"), "adamw": ljax.adamw(3e-4)}, labels)

State formats are those of the C API: ``"fp32"``, ``"bf16"``, ``"8bit"``,
``"4bit"``, ``"fp8"``; params with fewer than ``min_quantized_numel`` (the library's default, 4096)
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
    ljax.adamw(1e-3, state_format="4bit-sr")      # m 4-bit blocks with stochastic codes, v 4-bit blocks

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

from .._errors import InvalidArgumentError
from .._ffi import Algorithm, Normalization, StateFormat
from .._names import c_int, parse_state_option, resolve_num_threads
from .._options import config_defaults
from ._module import _MODULE, LIBRARY_ENV, PROTOCOL_VERSION, library_path  # noqa: F401  (_MODULE: tests load it)
from ._state import Config, LowbitState, make_config, moments  # noqa: F401  (Config: the settings' type)
from ._step import LowbitTransformation, _make

__all__ = [
    "LIBRARY_ENV",
    "LowbitState",
    "LowbitTransformation",
    "adam",
    "adamw",
    "library_path",
    "lion",
    "moments",
    "muon",
    "sgd",
]

# ----------------------------------------------------------------- the optimizers


def _formats(state_format, second_state_format, first_normalization, second_normalization, algorithm):
    """state_format (a format or, for AdamW / Adam, a preset name), the second
    moment's format and the normalisations (lowbit._names, the package's one
    parser); explicit arguments win over a preset's."""
    fmt, fmt2, n1, n2 = parse_state_option(state_format, second_state_format, first_normalization,
                                           second_normalization, arg="state_format",
                                           second_arg="second_state_format", algorithm=algorithm)
    if n1 == Normalization.FACTORED:
        raise InvalidArgumentError("lowbit.jax: first_normalization='factored': only the second moment of AdamW / "
                                   "Adam can be factored (second_normalization)")
    return dict(state_format=StateFormat.FP32 if fmt == StateFormat.DEFAULT else fmt,
                second_state_format=None if fmt2 == StateFormat.DEFAULT else fmt2,
                first_normalization=n1, second_normalization=n2)


def _common(algorithm, state_format, second_state_format, min_quantized_numel, stochastic_rounding, error_correction,
            seed, skip_nonfinite, num_threads, first_normalization=None, second_normalization=None):
    return dict(
        **_formats(state_format, second_state_format, first_normalization, second_normalization, algorithm),
        min_quantized_numel=(config_defaults(algorithm)["min_quantized_numel"] if min_quantized_numel is None
                             else c_int(min_quantized_numel, "min_quantized_numel")),
        stochastic_rounding=bool(stochastic_rounding),
        error_correction=bool(error_correction),
        seed=c_int(seed, "seed", "uint64_t"),
        skip_nonfinite=bool(skip_nonfinite),
        num_threads=_num_threads(num_threads),
    )


def _num_threads(num_threads) -> int:
    try:
        return resolve_num_threads(num_threads)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"lowbit.jax: {e.message}") from None


_COMMON_DOC = """
    state_format: "fp32" (default), "bf16", "8bit", "4bit", "fp8",
        "4bit-sr" (4bit with stochastically rounded codes) or "4bit-dyn"
        (4bit with an unsigned moment on the dynamic map), of both moments
        unless ``second_state_format`` is given. AdamW / Adam also take the
        presets of the C API (lowbit_preset_t): "4bit-rank1" (alias
        "lpmm-4bit": m 4-bit blocks, v 4-bit rank-1), "4bit-factor" (m 4-bit
        blocks, v factored), "4bit-sr" (m 4bit-sr, v 4bit: the 4-bit
        state that keeps fp32's loss over long runs on language models) and
        "4bit-sr-dyn" (m 4bit-sr, v 4bit-dyn); explicit formats and
        normalisations given with a preset win over its own.
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
          min_quantized_numel=None, stochastic_rounding=False, error_correction=False, seed=0, skip_nonfinite=True,
          num_threads=None) -> LowbitTransformation:
    """AdamW (decoupled weight decay), the arguments and defaults of
    ``optax.adamw``: p = p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps).
    ``mask`` (pytree of bools or callable params -> pytree) selects the params
    that are decayed.""" + _COMMON_DOC
    return _make(make_config(Algorithm.ADAMW, learning_rate,
                             dict(beta1=b1, beta2=b2, eps=eps, bias_correction=bias_correction),
                             weight_decay=weight_decay, mask=mask,
                             **_common(Algorithm.ADAMW, state_format, second_state_format, min_quantized_numel,
                                       stochastic_rounding, error_correction, seed, skip_nonfinite, num_threads,
                                       first_normalization, second_normalization)))


def adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, mask=None, *, bias_correction=True,
         state_format="fp32", second_state_format=None, first_normalization=None, second_normalization=None,
         min_quantized_numel=None, stochastic_rounding=False, error_correction=False, seed=0, skip_nonfinite=True,
         num_threads=None) -> LowbitTransformation:
    """Adam; ``weight_decay`` is L2 (added to the gradient), as torch.optim.Adam.""" + _COMMON_DOC
    return _make(make_config(Algorithm.ADAM, learning_rate,
                             dict(beta1=b1, beta2=b2, eps=eps, bias_correction=bias_correction),
                             weight_decay=weight_decay, mask=mask,
                             **_common(Algorithm.ADAM, state_format, second_state_format, min_quantized_numel,
                                       stochastic_rounding, error_correction, seed, skip_nonfinite, num_threads,
                                       first_normalization, second_normalization)))


def lion(learning_rate, b1=0.9, b2=0.99, weight_decay=1e-3, mask=None, *, state_format="fp32",
         first_normalization=None, min_quantized_numel=None, stochastic_rounding=False, error_correction=False,
         seed=0, skip_nonfinite=True, num_threads=None) -> LowbitTransformation:
    """Lion with decoupled weight decay, the arguments and defaults of
    ``optax.lion``.""" + _COMMON_DOC
    return _make(make_config(Algorithm.LION, learning_rate, dict(beta1=b1, beta2=b2), weight_decay=weight_decay,
                             mask=mask,
                             **_common(Algorithm.LION, state_format, None, min_quantized_numel, stochastic_rounding,
                                       error_correction, seed, skip_nonfinite, num_threads, first_normalization)))


def sgd(learning_rate, momentum=None, nesterov=False, *, dampening=0.0, weight_decay=0.0, mask=None,
        state_format="fp32", first_normalization=None, min_quantized_numel=None, stochastic_rounding=False,
        error_correction=False, seed=0, skip_nonfinite=True, num_threads=None) -> LowbitTransformation:
    """SGD as torch.optim.SGD (L2 ``weight_decay``, ``momentum`` with
    ``dampening``, Nesterov); with dampening 0 it equals ``optax.sgd``. No
    momentum: no state besides the count.""" + _COMMON_DOC
    return _make(make_config(Algorithm.SGD, learning_rate,
                             dict(momentum=float(momentum or 0.0), dampening=dampening, nesterov=bool(nesterov)),
                             weight_decay=weight_decay, mask=mask,
                             **_common(Algorithm.SGD, state_format, None, min_quantized_numel, stochastic_rounding,
                                       error_correction, seed, skip_nonfinite, num_threads, first_normalization)))


def muon(learning_rate=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315),
         eps=1e-7, ns_steps=5, adjust_lr_fn=None, mask=None, *, ns_precision="default", state_format="fp32",
         first_normalization=None, min_quantized_numel=None, stochastic_rounding=False, error_correction=False, seed=0,
         skip_nonfinite=True, num_threads=None) -> LowbitTransformation:
    """Muon with the arguments and defaults of ``torch.optim.Muon`` (and of
    lowbit.torch.Muon): per leaf of 2 or more dims (more dims are read as
    rows = dim 0, cols = the rest), m = m + (1 - momentum) (g - m); the
    update g + momentum (m - g) (Nesterov) or m, orthogonalised by
    ``ns_steps`` Newton-Schulz iterations of ``ns_coefficients``; p = p (1 -
    lr weight_decay) - adjusted lr * update, with ``adjust_lr_fn`` None /
    "original", "match_rms_adamw", "spectral_unclamped" (torch's) or "none".
    ``ns_precision``: "default" (fp32 on the CPU, bf16 on CUDA), "fp32", or
    "bf16" (torch.optim.Muon's rounding).

    Every leaf must have 2 or more dims; step biases, norms and embeddings
    with another transformation, e.g.
    ``optax.partition({"muon": ljax.muon(0.02), "adamw": ljax.adamw(3e-4)}, labels)``.
    An 8-bit or 4-bit momentum is normalised rank-1 (one max vector per
    dim) unless ``first_normalization`` says otherwise.""" + _COMMON_DOC
    from .._names import parse_adjust_lr, parse_ns_precision

    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int):
        raise InvalidArgumentError(f"lowbit.jax: ns_steps={ns_steps!r} must be an int")
    coeffs = tuple(float(c) for c in ns_coefficients)
    if len(coeffs) != 3:
        raise InvalidArgumentError(f"lowbit.jax: ns_coefficients={ns_coefficients!r} must hold 3 values (a, b, c)")
    adjust = parse_adjust_lr("original" if adjust_lr_fn is None else adjust_lr_fn, "adjust_lr_fn")
    precision = parse_ns_precision(ns_precision)
    fmt = parse_state_option(state_format, arg="state_format", algorithm=Algorithm.MUON)[0]
    if first_normalization is None and fmt in (StateFormat.BIT8, StateFormat.BIT4):
        first_normalization = "rank1"
    return _make(make_config(Algorithm.MUON, learning_rate,
                             dict(eps=eps, momentum=momentum, nesterov=bool(nesterov), ns_steps=ns_steps,
                                  ns_coefficients=coeffs, adjust_lr=int(adjust), ns_precision=int(precision)),
                             weight_decay=weight_decay, mask=mask,
                                  **_common(Algorithm.MUON, state_format, None, min_quantized_numel, stochastic_rounding,
                                       error_correction, seed, skip_nonfinite, num_threads, first_normalization)))


# ----------------------------------------------------------------- the described optimizers

from ._described import described_functions  # noqa: E402

#: Every algorithm the library describes that has no function above (RMSprop,
#: Adagrad, ...): name -> function, made from its descriptor.
DESCRIBED = described_functions(_make, make_config, _common, _COMMON_DOC)
globals().update(DESCRIBED)
__all__ += sorted(DESCRIBED)

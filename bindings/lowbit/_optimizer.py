"""The Optimizer handle: a thin, checked wrapper over lowbit_optimizer_t."""

from __future__ import annotations

import copy as _copy
import os
import weakref
from dataclasses import dataclass

import numpy as np

from ._arrays import DTYPE_NAMES, ArrayRef, TensorArray, as_array_ref, device_string
from ._ffi import NULL, Algorithm, CData, CheckpointMode, Device, Dtype, Normalization, StateFormat, Status, ffi, lib, void_p
from ._lib import LIB, ArrayError, InvalidArgumentError, InvalidStateError, call, failure

# ----------------------------------------------------------------- names

ALGORITHMS = {
    "adamw": Algorithm.ADAMW,
    "adam": Algorithm.ADAM,
    "lion": Algorithm.LION,
    "sgd": Algorithm.SGD,
    "onebit_adam": Algorithm.ONEBIT_ADAM,
    "1bit_adam": Algorithm.ONEBIT_ADAM,
    "zeroone_adam": Algorithm.ZEROONE_ADAM,
    "0/1_adam": Algorithm.ZEROONE_ADAM,
    "onebit_lamb": Algorithm.ONEBIT_LAMB,
    "1bit_lamb": Algorithm.ONEBIT_LAMB,
}
#: The algorithms that exchange through a communicator (lowbit_optimizer_set_comm).
ONEBIT_ALGORITHMS = (Algorithm.ONEBIT_ADAM, Algorithm.ZEROONE_ADAM, Algorithm.ONEBIT_LAMB)
STATE_FORMATS = {
    None: StateFormat.DEFAULT,
    "default": StateFormat.DEFAULT,
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
STATE_FORMAT_NAMES = {
    StateFormat.DEFAULT: "default",
    StateFormat.FP32: "fp32",
    StateFormat.BF16: "bf16",
    StateFormat.BIT8: "8bit",
    StateFormat.BIT4: "4bit",
    StateFormat.FP8: "fp8",
}
CHECKPOINT_MODES = {
    "compressed": CheckpointMode.COMPRESSED,
    "fp32": CheckpointMode.MATERIALIZED_FP32,
    "materialized_fp32": CheckpointMode.MATERIALIZED_FP32,
    "bf16": CheckpointMode.MATERIALIZED_BF16,
    "materialized_bf16": CheckpointMode.MATERIALIZED_BF16,
}
HPARAM_NAMES = ("lr", "betas", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening", "nesterov",
                "bias_correction")


def parse_algorithm(algorithm) -> Algorithm:
    if isinstance(algorithm, Algorithm):
        return algorithm
    if isinstance(algorithm, int) and not isinstance(algorithm, bool):
        try:
            return Algorithm(algorithm)
        except ValueError:
            raise InvalidArgumentError(f"algorithm={algorithm!r} is not a lowbit algorithm") from None
    key = str(algorithm).lower()
    if key not in ALGORITHMS:
        raise InvalidArgumentError(f"algorithm={algorithm!r} is not one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[key]


MAX_DIMS = lib.LOWBIT_MAX_DIMS

# How a moment's quantized values are scaled (lowbit.h, "Shaped parameters").
NORMALIZATIONS = {
    None: Normalization.DEFAULT,
    "default": Normalization.DEFAULT,
    "block": Normalization.BLOCK,
    "blocks": Normalization.BLOCK,
    "rank1": Normalization.RANK1,
    "rank-1": Normalization.RANK1,
    "factored": Normalization.FACTORED,
    "factor": Normalization.FACTORED,
}
NORMALIZATION_NAMES = {Normalization.DEFAULT: "default", Normalization.BLOCK: "block",
                       Normalization.RANK1: "rank1", Normalization.FACTORED: "factored"}
# state= names of the lpmm 4-bit optimizers ("Memory Efficient Optimizers with
# 4-bit States"): (format, first moment's normalisation, second moment's).
STATE_PRESETS = {
    "4bit-rank1": (StateFormat.BIT4, Normalization.BLOCK, Normalization.RANK1),  # lpmm's 4-bit AdamW
    "4bit-factor": (StateFormat.BIT4, Normalization.BLOCK, Normalization.FACTORED),  # lpmm's 4-bit Factor
}


def parse_normalization(value, arg) -> Normalization:
    if isinstance(value, Normalization):
        return value
    key = value.lower() if isinstance(value, str) else value
    if key not in NORMALIZATIONS:
        names = sorted(k for k in NORMALIZATIONS if isinstance(k, str))
        raise InvalidArgumentError(f"{arg}={value!r} is not one of {names}")
    return NORMALIZATIONS[key]


def parse_state_option(state, first_normalization=None, second_normalization=None, arg="state"):
    """(format, first normalisation, second normalisation) of a state= value:
    a format name, or a preset of STATE_PRESETS; explicit normalisations
    override the preset's."""
    key = state.lower() if isinstance(state, str) else None
    if key in STATE_PRESETS:
        fmt, n1, n2 = STATE_PRESETS[key]
    else:
        fmt, n1, n2 = parse_state_format(state, arg), Normalization.DEFAULT, Normalization.DEFAULT
    if first_normalization is not None:
        n1 = parse_normalization(first_normalization, "first_normalization")
    if second_normalization is not None:
        n2 = parse_normalization(second_normalization, "second_normalization")
    return fmt, n1, n2


def parse_state_format(fmt, arg="state") -> StateFormat:
    if isinstance(fmt, StateFormat):
        return fmt
    if isinstance(fmt, int) and not isinstance(fmt, bool):
        try:
            return StateFormat(fmt)
        except ValueError:
            raise InvalidArgumentError(f"{arg}={fmt!r} is not a lowbit state format") from None
    key = fmt.lower() if isinstance(fmt, str) else fmt
    if key not in STATE_FORMATS:
        names = sorted(k for k in STATE_FORMATS if isinstance(k, str))
        raise InvalidArgumentError(f"{arg}={fmt!r} is not one of {names}")
    return STATE_FORMATS[key]


NUM_THREADS_ENV = "LOWBIT_NUM_THREADS"


def resolve_num_threads(num_threads, default=0, arg="num_threads") -> int:
    """The CPU engine's thread count: `num_threads` when given (an int >= 0;
    0 means all OpenMP threads, omp_get_max_threads()), else the environment
    variable LOWBIT_NUM_THREADS when set, else `default` (an int or a
    zero-argument callable, e.g. torch.get_num_threads)."""
    source = arg
    if num_threads is None:
        env = os.environ.get(NUM_THREADS_ENV, "").strip()
        if env:
            num_threads, source = env, f"{NUM_THREADS_ENV}={env!r}"
        else:
            return int(default() if callable(default) else default)
    try:
        n = int(num_threads)
        if isinstance(num_threads, float) and n != num_threads:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{source}: {num_threads!r} is not an int (0 = all OpenMP threads)") from None
    if isinstance(num_threads, bool) or n < 0:
        raise InvalidArgumentError(f"{source}: {num_threads!r} must be an int >= 0 (0 = all OpenMP threads)")
    return n


def parse_checkpoint_mode(mode) -> CheckpointMode:
    if isinstance(mode, CheckpointMode):
        return mode
    key = str(mode).lower()
    if key not in CHECKPOINT_MODES:
        raise InvalidArgumentError(f"mode={mode!r} is not one of {sorted(CHECKPOINT_MODES)}")
    return CHECKPOINT_MODES[key]


def parse_device(device, device_index=None):
    """'cpu', 'cuda', 'cuda:1', a Device, or a torch.device -> (Device, index)."""
    if isinstance(device, Device):
        return device, int(device_index or 0)
    s = str(device).lower()
    if s == "cpu":
        return Device.CPU, 0
    if s.startswith("cuda"):
        rest = s[4:]
        if rest.startswith(":"):
            idx = int(rest[1:])
            if device_index is not None and int(device_index) != idx:
                raise InvalidArgumentError(f"device={device!r} contradicts device_index={device_index}")
            return Device.CUDA, idx
        if rest == "":
            return Device.CUDA, int(device_index or 0)
    raise InvalidArgumentError(f"device={device!r} is not 'cpu', 'cuda' or 'cuda:N'")


def stream_pointer(stream) -> int | None:
    """A cudaStream_t as an int from None, an int, a torch.cuda.Stream
    (.cuda_stream), a cupy Stream (.ptr) or a numba stream (.handle)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    handle = getattr(stream, "handle", None)
    if handle is not None:
        v = getattr(handle, "value", handle)
        if isinstance(v, int) or v is None:
            return v or 0
    raise InvalidArgumentError(f"stream={stream!r} is not a CUDA stream (int, torch/cupy/numba stream)")


# ----------------------------------------------------------------- hparams


def _fill_hparams(hp, kw: dict) -> None:
    """Write hyper-parameters given by name into a cffi lowbit_hparams_t."""
    for name, value in kw.items():
        if value is None:
            continue
        if name == "betas":
            b1, b2 = value
            hp.beta1, hp.beta2 = float(b1), float(b2)
        elif name in ("nesterov", "bias_correction"):
            setattr(hp, name, int(bool(value)))
        elif name in ("lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening"):
            setattr(hp, name, float(value))
        else:
            raise InvalidArgumentError(f"unknown hyper-parameter {name!r}; known: {', '.join(HPARAM_NAMES)}")


def hparams_to_dict(hp) -> dict:
    return {
        "lr": hp.lr,
        "betas": (hp.beta1, hp.beta2),
        "eps": hp.eps,
        "weight_decay": hp.weight_decay,
        "momentum": hp.momentum,
        "dampening": hp.dampening,
        "nesterov": bool(hp.nesterov),
        "bias_correction": bool(hp.bias_correction),
    }


# lowbit_onebit_options_t (0/1 Adam and 1-bit LAMB; DeepSpeed's names): the
# integer fields, the float fields.
ONEBIT_INT_OPTIONS = ("var_update_scaler", "local_step_scaler", "local_step_clipper")
ONEBIT_FLOAT_OPTIONS = ("max_coeff", "min_coeff", "coeff_beta", "factor_max", "factor_min", "factor_threshold")
ONEBIT_OPTION_NAMES = ONEBIT_INT_OPTIONS + ONEBIT_FLOAT_OPTIONS
_EXCHANGE_NAMES = {0: "none", 1: "average", 2: "1bit"}


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
            out[name] = int(value)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InvalidArgumentError(f"{name}={value!r} must be a real number")
            out[name] = float(value)
    return out


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


def _destroy(handle_value):
    if handle_value:
        try:
            LIB.fn("lowbit_optimizer_destroy")(ffi.cast("lowbit_optimizer_t", handle_value))
        except Exception:  # interpreter shutdown: nothing sensible left to do
            pass


def new_hparams(algorithm):
    """A cffi lowbit_hparams_t with the algorithm's defaults."""
    hp = ffi.new("lowbit_hparams_t *")
    call("lowbit_hparams_init", hp, int(algorithm))
    return hp


_step_with_grads = LIB.fn("lowbit_optimizer_step_with_grads")
_step = LIB.fn("lowbit_optimizer_step")
_last_step_skipped = LIB.fn("lowbit_optimizer_last_step_skipped")
_tensor_array_type = ffi.typeof("lowbit_tensor_t[]")


# ----------------------------------------------------------------- Optimizer


class Optimizer:
    """A lowbit optimizer over caller-owned arrays (numpy on the CPU; DLPack /
    ``__cuda_array_interface__`` objects on CUDA).

    Example::

        opt = lowbit.Optimizer("adamw", lr=1e-3, state="8bit")
        pid = opt.add_param(w, grad=gw)   # w, gw: float32 numpy arrays
        for ...:
            gw[...] = compute_grad(w)
            opt.step()                    # updates w in place

    Arrays are used in place and never copied; the optimizer keeps references
    to registered arrays so their memory stays valid. Free the handle with
    :meth:`close` or a ``with`` block (garbage collection also frees it).
    Every failure raises a :class:`lowbit.LowbitError` subclass carrying the
    library's message, and leaves the optimizer unchanged.

    ``num_threads``: threads of the CPU engine's steps (0: all OpenMP threads,
    i.e. ``OMP_NUM_THREADS`` or the cores); when not given, the environment
    variable ``LOWBIT_NUM_THREADS``, else 0. Fixed at creation (the
    :attr:`num_threads` property). Steps of fewer than 2^18 elements in all
    run on the calling thread whatever the count.

    Copies: ``copy.deepcopy(opt)`` is an independent optimizer (a new library
    handle, the same settings, groups and state, loaded from a checkpoint of
    this one) over deep copies of the registered arrays (with the same memo,
    so ``copy.deepcopy((params, opt))`` keeps them paired). ``copy.copy`` and
    pickling raise TypeError: a shallow copy would share the library handle.
    """

    def __init__(
        self,
        algorithm="adamw",
        *,
        lr=None,
        betas=None,
        eps=None,
        weight_decay=None,
        momentum=None,
        dampening=None,
        nesterov=None,
        bias_correction=None,
        state="fp32",
        second_state=None,
        first_normalization=None,
        second_normalization=None,
        min_quantized_numel=None,
        seed=0,
        stochastic_rounding=False,
        error_correction=False,
        skip_nonfinite=True,
        num_threads=None,
        freeze_step=None,
        device="cpu",
        device_index=None,
        stream=None,
    ):
        self._handle = None
        self._finalizer = None
        self._comm = None
        self.algorithm = parse_algorithm(algorithm)
        self.device, self.device_index = parse_device(device, device_index)
        self.stream = stream_pointer(stream)

        cfg = ffi.new("lowbit_optimizer_config_t *")
        call("lowbit_optimizer_config_init_sized", cfg, ffi.sizeof(cfg[0]), int(self.algorithm))
        cfg.device = int(self.device)
        cfg.device_index = self.device_index
        fmt, n1, n2 = parse_state_option(state, first_normalization, second_normalization)
        cfg.state_format = int(fmt)
        cfg.second_state_format = int(parse_state_format(second_state, "second_state"))
        cfg.first_normalization = int(n1)
        cfg.second_normalization = int(n2)
        if min_quantized_numel is not None:
            cfg.min_quantized_numel = int(min_quantized_numel)
        cfg.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        cfg.stochastic_rounding = int(bool(stochastic_rounding))
        cfg.error_correction = int(bool(error_correction))
        cfg.skip_nonfinite = int(bool(skip_nonfinite))
        cfg.num_threads = self._num_threads = resolve_num_threads(num_threads)
        if freeze_step is not None:
            cfg.freeze_step = int(freeze_step)

        hp = new_hparams(self.algorithm)
        _fill_hparams(hp, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, momentum=momentum,
                               dampening=dampening, nesterov=nesterov, bias_correction=bias_correction))
        out = ffi.new("lowbit_optimizer_t *")
        call("lowbit_optimizer_create", out, cfg, hp)
        self._handle = out[0]
        self._finalizer = weakref.finalize(self, _destroy, self.handle)
        # What a deep copy needs to build the same optimizer.
        self._config = dict(state=StateFormat(cfg.state_format), second_state=StateFormat(cfg.second_state_format),
                            first_normalization=Normalization(cfg.first_normalization),
                            second_normalization=Normalization(cfg.second_normalization),
                            min_quantized_numel=cfg.min_quantized_numel, seed=cfg.seed,
                            stochastic_rounding=bool(cfg.stochastic_rounding),
                            error_correction=bool(cfg.error_correction), skip_nonfinite=bool(cfg.skip_nonfinite),
                            num_threads=cfg.num_threads, freeze_step=cfg.freeze_step, device=self.device,
                            device_index=self.device_index, stream=self.stream)
        self._stream_arg = void_p(self.stream)
        self._i32 = ffi.new("int32_t *")  # out-params, reused
        self._i64 = ffi.new("int64_t *")
        self._params: list[ArrayRef] = []
        self._shapes: list = []  # per param: the shape given to the library (() for none)
        self._grads: list[ArrayRef | None] = []
        self._step_grads: TensorArray | None = None  # descriptors of step(grads), reused
        self._has_masks = False
        self._num_groups = 1
        self._onebit_options = None  # set_onebit_options' last values (None: the library's defaults)

    # -- lifetime

    def close(self) -> None:
        """Free the library handle now (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
        self._handle = None
        self._params, self._grads, self._step_grads = [], [], None
        if self._comm is not None:
            self._comm._detach(self)
            self._comm = None

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __copy__(self):
        raise TypeError("copy.copy() of a lowbit.Optimizer would share its library handle (closing one would free "
                        "the other's); use copy.deepcopy() for an independent optimizer over copies of its arrays, "
                        "or save() / load()")

    def __reduce_ex__(self, protocol):
        raise TypeError("a lowbit.Optimizer cannot be pickled (it holds a library handle and caller arrays); "
                        "pickle save()'s checkpoint bytes and load() them into an optimizer with the same params")

    def __deepcopy__(self, memo):
        """An independent optimizer over deep copies of the registered arrays
        (through `memo`), with this one's settings, groups, state and step
        counts (a checkpoint of this one, loaded into the copy)."""
        self._h()
        if self._comm is not None:
            raise TypeError("a lowbit.Optimizer with a communicator (1-bit Adam) cannot be copied: a copy would "
                            "interleave its collectives with this one's on the same communicator")
        if self._has_masks:
            raise TypeError("a lowbit.Optimizer with momentum masks cannot be copied (the library does not give "
                            "them back); build the copy and set its masks yourself")
        new = Optimizer(self.algorithm, **self._config)
        memo[id(self)] = new
        try:
            new.set_hparams(0, **self.get_hparams(0))
            for g in range(1, self._num_groups):
                new.add_group(**self.get_hparams(g))
            for pid, (p, g) in enumerate(zip(self._params, self._grads)):
                info = self.param_info(pid)
                p2 = _copy.deepcopy(_owner(p), memo)
                g2 = None if g is None else _copy.deepcopy(_owner(g), memo)
                factored = info.second_normalization == "factored"  # its format reads fp32 (accumulators)
                new.add_param(p2, g2, group=info.group, state=info.state_format,
                              second_state=None if factored else info.second_state_format,
                              stochastic_rounding=info.stochastic_rounding,
                              error_correction=info.error_correction, dtype=p.dtype,
                              grad_dtype=None if g is None else g.dtype, shape=self._shapes[pid],
                              first_normalization=info.first_normalization,
                              second_normalization=info.second_normalization)
            if self._params:
                new.load(self.save("compressed"))
        except BaseException:
            new.close()
            raise
        return new

    def _h(self):
        h = self._handle
        if h is None:
            raise InvalidStateError("the optimizer is closed", Status.ERROR_INVALID_STATE)
        return h

    def _call(self, name, *args):
        call(name, self._h(), *args, handle=self._handle)

    @property
    def num_threads(self) -> int:
        """The thread count given to the library's CPU engine (0: all OpenMP
        threads). Set at creation: ``num_threads=``, else the environment
        variable LOWBIT_NUM_THREADS, else 0."""
        return self._num_threads

    @property
    def handle(self) -> int:
        """The raw lowbit_optimizer_t as an int, for other C code (valid until close)."""
        return int(ffi.cast("uintptr_t", self._h()))

    def __repr__(self):
        state = "closed" if self.closed else f"{len(self._params)} params"
        return (f"<lowbit.Optimizer {self.algorithm.name.lower()} on "
                f"{device_string(self.device, self.device_index)}, {state}>")

    # -- groups and hyper-parameters

    @property
    def num_groups(self) -> int:
        return self._num_groups

    def add_group(self, **hparams) -> int:
        """Add a parameter group; unspecified hparams take the algorithm's defaults."""
        hp = new_hparams(self.algorithm)
        _fill_hparams(hp, hparams)
        self._call("lowbit_optimizer_add_group", hp, self._i32)
        group = self._i32[0]
        self._num_groups = max(self._num_groups, group + 1)
        return group

    def _get_hparams(self, group: int):
        hp = ffi.new("lowbit_hparams_t *")
        hp.struct_size = ffi.sizeof("lowbit_hparams_t")
        self._call("lowbit_optimizer_get_hparams", int(group), hp)
        return hp

    def get_hparams(self, group: int = 0) -> dict:
        return hparams_to_dict(self._get_hparams(group))

    def set_hparams(self, group: int = 0, **hparams) -> None:
        """Change some hyper-parameters of a group (the others keep their values)."""
        hp = self._get_hparams(group)
        _fill_hparams(hp, hparams)
        self._call("lowbit_optimizer_set_hparams", int(group), hp)

    def set_lr(self, lr: float, group: int | None = None) -> None:
        """Set the learning rate of one group, or of every group when group is None."""
        groups = range(self._num_groups) if group is None else [group]
        for g in groups:
            self._call("lowbit_optimizer_set_lr", int(g), float(lr))

    @property
    def lr(self) -> float:
        return self.get_hparams(0)["lr"]

    # -- params

    def _ref(self, obj, role, writable, dtype=None):
        return as_array_ref(obj, role=role, writable=writable, dtype=dtype, device=self.device,
                            device_index=self.device_index, stream=self.stream)

    def add_param(
        self,
        param,
        grad=None,
        *,
        group: int = 0,
        state=None,
        second_state=None,
        stochastic_rounding=None,
        error_correction=None,
        dtype=None,
        grad_dtype=None,
        shape=None,
        first_normalization=None,
        second_normalization=None,
    ) -> int:
        """Register `param` (updated in place) and optionally its gradient
        buffer (read at each step()). Returns the parameter id (0, 1, ...).

        state/second_state override the optimizer's state format for this
        param (an explicit format also applies below min_quantized_numel).
        dtype/grad_dtype are needed only for uint16 arrays holding bf16/fp16 bits.
        shape: the param's shape for rank-1 and factored moments (lowbit.h,
        "Shaped parameters"; row-major, product = numel); default: the
        array's own shape when it has 2 to 8 dims. first/second_normalization
        override the optimizer's ("block", "rank1", "factored").
        """
        p = self._ref(param, "param", True, dtype)
        g = self._ref(grad, "grad", False, grad_dtype) if grad is not None else None
        return self._add_param_ref(p, g, group=group, state=state, second_state=second_state,
                                   stochastic_rounding=stochastic_rounding, error_correction=error_correction,
                                   shape=shape, first_normalization=first_normalization,
                                   second_normalization=second_normalization)

    def _add_param_ref(self, p: ArrayRef, g: ArrayRef | None, *, group=0, state=None, second_state=None,
                       stochastic_rounding=None, error_correction=None, shape=None, first_normalization=None,
                       second_normalization=None) -> int:
        if g is not None and g.numel != p.numel:
            raise ArrayError(f"grad: has {g.numel} elements but param has {p.numel}")
        pc = ffi.new("lowbit_param_config_t *")
        call("lowbit_param_config_init_sized", pc, ffi.sizeof(pc[0]))
        pc.param = p.desc[0]
        if g is not None:
            pc.grad = g.desc[0]
        pc.group = int(group)
        pc.state_format = int(parse_state_format(state, "state"))
        pc.second_state_format = int(parse_state_format(second_state, "second_state"))
        if stochastic_rounding is not None:
            pc.stochastic_rounding = int(bool(stochastic_rounding))
        if error_correction is not None:
            pc.error_correction = int(bool(error_correction))
        if shape is None:
            shape = p.shape if 2 <= len(p.shape) <= MAX_DIMS else ()
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_DIMS:
            raise InvalidArgumentError(f"shape={shape} has {len(shape)} dims; lowbit takes at most {MAX_DIMS}")
        pc.ndim = len(shape)
        for k, d in enumerate(shape):
            pc.shape[k] = d
        pc.first_normalization = int(parse_normalization(first_normalization, "first_normalization"))
        pc.second_normalization = int(parse_normalization(second_normalization, "second_normalization"))
        self._call("lowbit_optimizer_add_param", pc, self._i64)
        pid = self._i64[0]
        assert pid == len(self._params), "library param ids must be 0, 1, 2, ..."
        self._shapes.append(shape)
        self._params.append(p)
        self._grads.append(g)
        self._step_grads = None
        return pid

    def _pid(self, param_id) -> int:
        pid = int(param_id)
        if not 0 <= pid < len(self._params):
            raise InvalidArgumentError(f"param_id={param_id} is not a registered parameter id "
                                       f"(0..{len(self._params) - 1})")
        return pid

    def set_grad(self, param_id: int, grad, *, grad_dtype=None) -> None:
        """Replace the gradient buffer of a param (None: the param is left
        alone by later steps)."""
        pid = int(param_id)
        if grad is None:
            self._call("lowbit_optimizer_set_grad", pid, NULL)
            self._grads[self._pid(pid)] = None
            return
        g = self._ref(grad, "grad", False, grad_dtype)
        self._call("lowbit_optimizer_set_grad", pid, g.desc)
        self._grads[self._pid(pid)] = g

    @property
    def num_params(self) -> int:
        self._call("lowbit_optimizer_num_params", self._i64)
        return self._i64[0]

    # -- stepping

    def step(self, grads=None, *, stream=None) -> bool:
        """One optimizer step.

        grads None: use the registered gradient buffers. Otherwise a sequence
        with one entry per param (None skips that param), used for this step
        only. Returns True if the step was applied, False if it was skipped
        because a gradient held NaN/Inf (skip_nonfinite). On CUDA the return
        value reads the flag, which is only valid once the stream has
        reached the step; use ``last_step_skipped`` after synchronising.
        """
        h = self._h()
        if grads is None:
            s = self._stream_arg if stream is None else void_p(stream_pointer(stream))
            status = _step(h, s)
            if status:
                raise failure("lowbit_optimizer_step", status, h)
        else:
            s = self.stream if stream is None else stream_pointer(stream)
            grads = list(grads)
            n = len(self._params)
            if len(grads) != n:
                raise InvalidArgumentError(f"grads: got {len(grads)} gradients for {n} registered params")
            arr = self._step_grads
            if arr is None:
                arr = self._step_grads = TensorArray(n)
            cdata = arr.cdata
            keep = []
            for i, g in enumerate(grads):
                if g is None:
                    cdata[i].data = NULL
                    continue
                ref = as_array_ref(g, role=f"grads[{i}]", writable=False, device=self.device,
                                   device_index=self.device_index, stream=s)
                if ref.numel != self._params[i].numel:
                    raise ArrayError(f"grads[{i}]: has {ref.numel} elements but param {i} has "
                                     f"{self._params[i].numel}")
                cdata[i] = ref.desc[0]
                keep.append(ref)
            self._step_tensors(cdata, n, s)
            del keep
        if self.device == Device.CPU:
            status = _last_step_skipped(h, self._i32)
            if status:
                raise failure("lowbit_optimizer_last_step_skipped", status, h)
            return not self._i32[0]
        return True

    def _step_tensors(self, grads_array, n: int, stream) -> None:
        """step_with_grads on an already-built array of n lowbit_tensor_t: a
        cffi ``lowbit_tensor_t[]`` (TensorArray.cdata), or any buffer laid out
        as one (a ctypes array of lowbit._ffi.Tensor)."""
        h = self._h()
        if not isinstance(grads_array, CData):
            grads_array = ffi.from_buffer(_tensor_array_type, grads_array)
        if n > len(grads_array):
            raise InvalidArgumentError(f"grads: {n} descriptors asked for, the array holds {len(grads_array)}")
        status = _step_with_grads(h, grads_array, n, void_p(stream))
        if status:
            raise failure("lowbit_optimizer_step_with_grads", status, h)

    # -- 1-bit Adam, 0/1 Adam, 1-bit LAMB

    def set_comm(self, comm) -> None:
        """1-bit Adam, 0/1 Adam, 1-bit LAMB: the lowbit.Communicator that
        averages gradients (warm-up, 0/1 Adam's variance steps) and carries the
        1-bit compressed exchanges. Required before the first step. The optimizer keeps
        the communicator referenced and registers itself with it: closing the
        communicator while this optimizer is open raises InvalidStateError
        (close the optimizer first)."""
        # None reaches the library as NULL, which refuses it (NullPointerError):
        # a communicator is not removed from an optimizer, the optimizer is closed.
        self._call("lowbit_optimizer_set_comm", NULL if comm is None else comm._h())
        if self._comm is not None and self._comm is not comm:
            self._comm._detach(self)
        self._comm = comm
        comm._attach(self)

    def set_onebit_warmup_average(self, average: bool) -> None:
        """1-bit optimizers: True (the default): a step that needs averaged
        gradients (1-bit Adam's and 1-bit LAMB's warm-up, 0/1 Adam's variance
        steps; ``onebit_status().next_full_average``) averages them over the
        communicator; False: the caller averages them over the ranks before
        such a step (e.g. DDP), which then exchanges only the argument
        agreement. The same on every rank."""
        self._call("lowbit_optimizer_set_onebit_warmup_average", 1 if average else 0)

    def set_onebit_options(self, **options) -> None:
        """0/1 Adam and 1-bit LAMB options, by DeepSpeed's names (the others
        keep their values): ``var_update_scaler``, ``local_step_scaler``,
        ``local_step_clipper`` (0/1 Adam; ints >= 1); ``max_coeff``,
        ``min_coeff``, ``coeff_beta``, ``factor_max``, ``factor_min``,
        ``factor_threshold`` (1-bit LAMB). Any time between steps, the same on
        every rank; not saved in checkpoints. Bad names, types or values
        raise InvalidArgumentError and change nothing."""
        given = check_onebit_options(options)
        if self.algorithm not in (Algorithm.ZEROONE_ADAM, Algorithm.ONEBIT_LAMB):
            raise InvalidArgumentError(f"set_onebit_options: the {self.algorithm.name.lower()} optimizer has no "
                                       "1-bit options (zeroone_adam and onebit_lamb have)")
        merged = dict(self.onebit_options())
        merged.update(given)
        o = ffi.new("lowbit_onebit_options_t *")
        call("lowbit_onebit_options_init", o)
        for name, value in merged.items():
            setattr(o, name, value)
        self._call("lowbit_optimizer_set_onebit_options", o)
        self._onebit_options = {name: getattr(o, name) for name in ONEBIT_OPTION_NAMES}

    def onebit_options(self) -> dict:
        """The 0/1 Adam / 1-bit LAMB options last set (the library's defaults
        until set_onebit_options), by name."""
        if self._onebit_options is None:
            self._onebit_options = onebit_options_defaults()
        return dict(self._onebit_options)

    def onebit_status(self) -> OneBitStatus:
        """Where a 1-bit optimizer (1-bit Adam, 0/1 Adam, 1-bit LAMB) stands:
        its step count, phase and what the next step needs (a
        :class:`OneBitStatus`). On CUDA it waits for the device."""
        st = ffi.new("lowbit_onebit_status_t *")
        st.struct_size = ffi.sizeof("lowbit_onebit_status_t")
        self._call("lowbit_optimizer_onebit_status", st)
        return OneBitStatus(step=st.step, phase=st.phase, next_full_average=bool(st.next_full_average),
                            next_exchange=_EXCHANGE_NAMES.get(st.next_exchange, str(st.next_exchange)),
                            var_interval=st.var_interval, var_counter=st.var_counter,
                            local_step_interval=st.local_step_interval, local_step_counter=st.local_step_counter)

    def set_momentum_mask(self, param_id: int, mask) -> None:
        """1-bit Adam: elements where `mask` (numel values, host) is 0 keep a
        momentum of exactly zero. None removes the mask."""
        if mask is None:
            self._call("lowbit_optimizer_set_momentum_mask", int(param_id), NULL, 0)
            return
        m = np.ascontiguousarray(np.asarray(mask) != 0, dtype=np.uint8).reshape(-1)
        self._call("lowbit_optimizer_set_momentum_mask", int(param_id), ffi.from_buffer("uint8_t[]", m), m.size)
        self._has_masks = True

    @property
    def last_step_skipped(self) -> bool:
        self._call("lowbit_optimizer_last_step_skipped", self._i32)
        return bool(self._i32[0])

    # -- inspection

    def param_info(self, param_id: int) -> ParamInfo:
        info = ffi.new("lowbit_param_info_t *")
        info.struct_size = ffi.sizeof("lowbit_param_info_t")
        self._call("lowbit_optimizer_param_info", int(param_id), info)
        second = StateFormat(info.second_state_format)
        return ParamInfo(
            numel=info.numel,
            step=info.step,
            group=info.group,
            param_dtype=DTYPE_NAMES[Dtype(info.param_dtype)],
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

    def state_bytes(self, param_id: int | None = None) -> int:
        """Bytes of optimizer state of one param, or of all params."""
        self._call("lowbit_optimizer_state_bytes", -1 if param_id is None else int(param_id), self._i64)
        return self._i64[0]

    def read_moment(self, param_id: int, moment: int = 0) -> np.ndarray:
        """A dequantized float32 copy of moment 0 (first) or 1 (second) of a
        param, shaped like the param (after the work on the optimizer's stream)."""
        pid = self._pid(param_id)
        p = self._params[pid]
        out = np.empty(p.shape, dtype=np.float32)
        self._call("lowbit_optimizer_read_moment", pid, int(moment), ffi.from_buffer("float[]", out), out.size,
                   self._stream_arg)
        return out

    def write_moment(self, param_id: int, moment, values) -> None:
        """Replace moment 0 or 1 of a param by `values` (any array-like with
        the param's number of elements, converted to float32 on the host); the
        library encodes them into the param's state format. Values must be
        finite, and a second moment >= 0; on error nothing changes."""
        pid = self._pid(param_id)
        v = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
        self._call("lowbit_optimizer_write_moment", pid, int(moment), ffi.from_buffer("float[]", v), v.size,
                   self._stream_arg)

    def set_step(self, step: int, param_id: int | None = None) -> None:
        """Set the number of steps applied to one param, or to every param
        (bias corrections and stochastic-rounding bits follow it)."""
        pid = -1 if param_id is None else self._pid(param_id)
        self._call("lowbit_optimizer_set_step", pid, int(step), self._stream_arg)

    def param(self, param_id: int):
        """The array registered as param `param_id`."""
        return _owner(self._params[self._pid(param_id)])

    # -- checkpoints

    def save(self, mode="compressed") -> bytes:
        """The whole optimizer state as bytes. mode: 'compressed' (as stored),
        'fp32' or 'bf16' (materialised moments)."""
        m = int(parse_checkpoint_mode(mode))
        self._call("lowbit_optimizer_save", m, NULL, 0, self._i64, self._stream_arg)
        size = self._i64[0]
        buf = ffi.new("char[]", max(size, 1))
        self._call("lowbit_optimizer_save", m, buf, size, self._i64, self._stream_arg)
        return ffi.buffer(buf, self._i64[0])[:]

    def save_file(self, path, mode="compressed") -> None:
        self._call("lowbit_optimizer_save_file", int(parse_checkpoint_mode(mode)), os.fsencode(path),
                   self._stream_arg)

    def load(self, data) -> None:
        """Load a checkpoint made by save() (any mode) into this optimizer,
        which must have the same params registered. On error nothing changes."""
        buf, n = _byte_buffer(data)
        self._call("lowbit_optimizer_load", buf, n, self._stream_arg)

    def load_file(self, path) -> None:
        self._call("lowbit_optimizer_load_file", os.fsencode(path), self._stream_arg)


def _owner(ref: ArrayRef):
    """The caller's array behind an ArrayRef (DLPack refs keep (array, capsule))."""
    return ref.owner[0] if isinstance(ref.owner, tuple) else ref.owner


def _byte_buffer(data):
    """(a `const void *` argument, its size in bytes) for any bytes-like
    object, without a copy when it is contiguous."""
    try:
        mv = memoryview(data)
    except TypeError:
        raise InvalidArgumentError(f"data: {type(data).__name__} is not a bytes-like object") from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    if mv.nbytes == 0:
        return ffi.new("char[]", 1), 0  # a valid pointer to nothing: the library names the size
    return ffi.from_buffer(mv), mv.nbytes

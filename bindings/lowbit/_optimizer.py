"""The Optimizer handle: a thin, checked wrapper over lowbit_optimizer_t."""

from __future__ import annotations

import contextlib
import copy as _copy
import operator
import os

import numpy as np

from ._arrays import DTYPE_NAMES, ArrayRef, TensorArray, as_array_ref, device_string, fingerprint, kept_fingerprint
from ._ffi import MAX_DIMS, NULL, Algorithm, CData, Device, Normalization, StateFormat, ffi, void_p
from ._handle import Handle, locked
from ._errors import ArrayError, InvalidArgumentError, InvalidStateError, LowbitError
from ._lib import LIB, call, failure
from ._names import (  # noqa: F401  (re-exported: lowbit._optimizer's names before the split)
    ALGORITHMS,
    CHECKPOINT_MODES,
    NORMALIZATION_NAMES,
    NORMALIZATIONS,
    NUM_THREADS_ENV,
    ONEBIT_ALGORITHMS,
    STATE_FORMAT_NAMES,
    STATE_FORMATS,
    STATE_PRESETS,
    c_int,
    parse_algorithm,
    parse_checkpoint_mode,
    parse_device,
    parse_normalization,
    parse_seed,
    parse_state_format,
    parse_state_option,
    resolve_num_threads,
    stream_pointer,
)
from ._options import (  # noqa: F401
    HPARAM_NAMES,
    ONEBIT_OPTION_NAMES,
    check_hparam_keywords,
    hparam_keywords,
    OneBitStatus,
    ParamInfo,
    as_real,
    check_onebit_options,
    fill_hparams,
    hparams_to_dict,
    new_hparams,
    onebit_options_defaults,
    onebit_options_struct,
)


def _destroy(handle_value):
    if handle_value:
        try:
            LIB.fn("lowbit_optimizer_destroy")(ffi.cast("lowbit_optimizer_t", handle_value))
        except Exception:  # interpreter shutdown: nothing sensible left to do
            pass


_step_with_grads = LIB.fn("lowbit_optimizer_step_with_grads")
_step = LIB.fn("lowbit_optimizer_step")
_step_params = LIB.fn("lowbit_optimizer_step_params")
_last_step_skipped = LIB.fn("lowbit_optimizer_last_step_skipped")
_tensor_array_type = ffi.typeof("lowbit_tensor_t[]")


# ----------------------------------------------------------------- Optimizer


class Optimizer(Handle):
    """A lowbit optimizer over caller-owned arrays (numpy on the CPU; DLPack /
    ``__cuda_array_interface__`` objects on CUDA).

    Example::

        opt = lowbit.Optimizer("adamw", lr=1e-3, state="8bit")
        pid = opt.add_param(w, grad=gw)   # w, gw: float32 numpy arrays
        for ...:
            gw[...] = compute_grad(w)
            opt.step()                    # updates w in place

    Muon (``algorithm="muon"``, as torch.optim.Muon) takes params of 2 or
    more dims (their shape: the array's, or ``shape=``) and the options
    ``ns_steps``, ``ns_coefficients`` (a, b, c), ``adjust_lr`` ("original",
    "match_rms_adamw", "spectral_unclamped" or "none") and ``ns_precision``
    ("default": fp32 on the CPU, bf16 on CUDA; "fp32"; "bf16": torch's
    rounding), besides lr, weight_decay, momentum, nesterov and eps. A group
    added with ``add_group(algorithm="adamw", ...)`` (or "adam", "lion",
    "sgd") steps its params, 1-D ones included, with that algorithm::

        opt = lowbit.Optimizer("muon", lr=0.02, state="8bit", first_normalization="rank1")
        opt.add_param(w, grad=gw)                       # a matrix
        g = opt.add_group(algorithm="adamw", lr=3e-4)   # AdamW's defaults
        opt.add_param(b, grad=gb, group=g)              # a bias

    Hyper-parameters: every field of the algorithm's descriptor
    (lowbit_hparam_info; ``lowbit._options.hparam_keywords(algorithm)``
    lists them) is a keyword, ``betas`` being torch's pair for ``beta1`` /
    ``beta2``; a field not given (or None) takes the algorithm's default. So
    ``Optimizer("rmsprop", lr=1e-2, alpha=0.9, centered=True)`` and
    ``Optimizer("adagrad", lr_decay=1e-3, initial_accumulator_value=0.1)``.
    A field of other algorithms only (``alpha`` for AdamW, ``ns_steps`` for
    SGD) raises InvalidArgumentError naming it and who takes it; a name no
    algorithm has, TypeError.

    Arrays are used in place and never copied; the optimizer keeps references
    to registered arrays so their memory stays valid. Free the handle with
    :meth:`close` or a ``with`` block (garbage collection also frees it).
    Every failure raises a :class:`lowbit.LowbitError` subclass carrying the
    library's message, and leaves the optimizer unchanged.

    Threads: calls on one optimizer are serialised (a call waits while
    another thread is inside one; a step is never interleaved with another
    call), so threads may share it; distinct optimizers run in parallel.

    Registered arrays must keep their memory: a torch tensor whose storage
    is replaced or resized after registration (``t.data = ...``,
    ``t.resize_()``) makes the next :meth:`step` raise InvalidStateError and
    change nothing (the registered storage itself is kept alive, never
    freed under the library).

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
        **hparams,
    ):
        super().__init__()
        self._comm = None
        self._params: list[ArrayRef] = []
        self._grads: list[ArrayRef | None] = []
        self.algorithm = parse_algorithm(algorithm)
        hparams = check_hparam_keywords(self.algorithm, hparams)
        self.device, self.device_index = parse_device(device, device_index)
        self.stream = stream_pointer(stream)

        cfg = ffi.new("lowbit_optimizer_config_t *")
        call("lowbit_optimizer_config_init_sized", cfg, ffi.sizeof(cfg[0]), int(self.algorithm))
        cfg.device = int(self.device)
        cfg.device_index = self.device_index
        fmt, fmt2, n1, n2 = parse_state_option(state, second_state, first_normalization, second_normalization,
                                               algorithm=self.algorithm)
        cfg.state_format = int(fmt)
        cfg.second_state_format = int(fmt2)
        cfg.first_normalization = int(n1)
        cfg.second_normalization = int(n2)
        if min_quantized_numel is not None:
            cfg.min_quantized_numel = c_int(min_quantized_numel, "min_quantized_numel")
        cfg.seed = parse_seed(seed)
        cfg.stochastic_rounding = int(bool(stochastic_rounding))
        cfg.error_correction = int(bool(error_correction))
        cfg.skip_nonfinite = int(bool(skip_nonfinite))
        cfg.num_threads = self._num_threads = resolve_num_threads(num_threads)
        if freeze_step is not None:
            cfg.freeze_step = c_int(freeze_step, "freeze_step")

        hp = new_hparams(self.algorithm)
        fill_hparams(hp, hparams)
        out = ffi.new("lowbit_optimizer_t *")
        call("lowbit_optimizer_create", out, cfg, hp)
        self._open(out[0], _destroy, int(ffi.cast("uintptr_t", out[0])))
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
        self._shapes: list = []  # per param: the shape given to the library (() for none)
        self._step_grads: TensorArray | None = None  # descriptors of step(grads), reused
        self._has_masks = False
        self._num_groups = 1
        self._onebit_options = None  # set_onebit_options' last values (None: the library's defaults)
        self._movable = None  # the registered arrays that can lose their memory (ArrayRef.probe); None: to list

    # -- lifetime

    _kind = "optimizer"
    _error_fn = "lowbit_optimizer_last_error"

    def _after_close(self) -> None:
        self._params, self._grads, self._step_grads, self._movable = [], [], None, None
        if self._comm is not None:
            self._comm._detach(self)
            self._comm = None

    def __copy__(self):
        raise TypeError("copy.copy() of a lowbit.Optimizer would share its library handle (closing one would free "
                        "the other's); use copy.deepcopy() for an independent optimizer over copies of its arrays, "
                        "or save() / load()")

    def __reduce_ex__(self, protocol):
        raise TypeError("a lowbit.Optimizer cannot be pickled (it holds a library handle and caller arrays); "
                        "pickle save()'s checkpoint bytes and load() them into an optimizer with the same params")

    @locked
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

    @property
    def num_threads(self) -> int:
        """The thread count given to the library's CPU engine (0: all OpenMP
        threads). Set at creation: ``num_threads=``, else the environment
        variable LOWBIT_NUM_THREADS, else 0."""
        return self._num_threads

    def __repr__(self):
        state = "closed" if self.closed else f"{len(self._params)} params"
        return (f"<lowbit.Optimizer {self.algorithm.name.lower()} on "
                f"{device_string(self.device, self.device_index)}, {state}>")

    # -- groups and hyper-parameters

    @property
    def num_groups(self) -> int:
        return self._num_groups

    @locked
    def add_group(self, *, algorithm=None, **hparams) -> int:
        """Add a parameter group; unspecified hparams take the algorithm's defaults.

        ``algorithm``: a Muon optimizer's group may take "adamw", "adam",
        "lion" or "sgd" instead (the hybrid: 1-D params, embeddings and heads
        stepped with AdamW in the same optimizer); its defaults are then that
        algorithm's. Other optimizers' groups take their own algorithm only."""
        group_algorithm = self.algorithm if algorithm is None or algorithm == 0 else parse_algorithm(algorithm)
        hp = new_hparams(group_algorithm)
        fill_hparams(hp, hparams)
        self._call("lowbit_optimizer_add_group", hp, self._i32)
        group = self._i32[0]
        self._num_groups = max(self._num_groups, group + 1)
        return group

    def _get_hparams(self, group: int):
        hp = ffi.new("lowbit_hparams_t *")
        hp.struct_size = ffi.sizeof("lowbit_hparams_t")
        self._call("lowbit_optimizer_get_hparams", c_int(group, "group", "int32_t"), hp)
        return hp

    @locked
    def get_hparams(self, group: int = 0) -> dict:
        """The group's hyper-parameters by name (what set_hparams and
        add_group take), with its ``algorithm`` (since 0.7) and, for a Muon
        group, Muon's options."""
        return hparams_to_dict(self._get_hparams(group), self.algorithm)

    @locked
    def set_hparams(self, group: int = 0, **hparams) -> None:
        """Change some hyper-parameters of a group (the others keep their values)."""
        hp = self._get_hparams(group)
        fill_hparams(hp, hparams)
        self._call("lowbit_optimizer_set_hparams", c_int(group, "group", "int32_t"), hp)

    @locked
    def set_lr(self, lr: float, group: int | None = None) -> None:
        """Set the learning rate of one group, or of every group when group is None."""
        groups = range(self._num_groups) if group is None else [c_int(group, "group", "int32_t")]
        value = as_real("lr", lr)
        for g in groups:
            self._call("lowbit_optimizer_set_lr", g, value)

    @locked
    def lr_address(self, group: int = 0) -> int:
        """The address of the group's lr (a float32) in the engine's own copy
        of its hyper-parameters (lowbit_optimizer_device_hparams): device
        memory on CUDA, host memory on the CPU. Steps read lr there, so a
        captured CUDA graph takes a new lr at each replay when the graph
        writes it there before its step. set_lr / set_hparams replace it at
        the next step."""
        out = ffi.new("lowbit_hparams_t **")
        self._call("lowbit_optimizer_device_hparams", c_int(group, "group", "int32_t"), out)
        return int(ffi.cast("uintptr_t", out[0])) + ffi.offsetof("lowbit_hparams_t", "lr")

    @property
    @locked
    def lr(self) -> float:
        return self.get_hparams(0)["lr"]

    # -- params

    def _ref(self, obj, role, writable, dtype=None):
        return as_array_ref(obj, role=role, writable=writable, dtype=dtype, device=self.device,
                            device_index=self.device_index, stream=self.stream)

    @locked
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

    @locked
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
        pc.group = c_int(group, "group", "int32_t")
        pc.state_format = int(parse_state_format(state, "state"))
        pc.second_state_format = int(parse_state_format(second_state, "second_state"))
        if stochastic_rounding is not None:
            pc.stochastic_rounding = int(bool(stochastic_rounding))
        if error_correction is not None:
            pc.error_correction = int(bool(error_correction))
        if shape is None:
            shape = p.shape if 2 <= len(p.shape) <= MAX_DIMS else ()
        shape = tuple(c_int(d, "shape", "int64_t") for d in shape)
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
        self._movable = None
        return pid

    def _pid(self, param_id, arg="param_id") -> int:
        self._h()  # a closed optimizer has no params: say so
        pid = c_int(param_id, arg)
        if not 0 <= pid < len(self._params):
            raise InvalidArgumentError(f"param_id={param_id} is not a registered parameter id "
                                       f"(0..{len(self._params) - 1})")
        return pid

    @locked
    def set_grad(self, param_id: int, grad, *, grad_dtype=None) -> None:
        """Replace the gradient buffer of a param (None: the param is left
        alone by later steps)."""
        pid = c_int(param_id, "param_id")
        g = None if grad is None else self._ref(grad, "grad", False, grad_dtype)
        self._call("lowbit_optimizer_set_grad", pid, NULL if g is None else g.desc)
        self._grads[self._pid(pid)] = g
        self._movable = None

    @property
    @locked
    def num_params(self) -> int:
        self._call("lowbit_optimizer_num_params", self._i64)
        return self._i64[0]

    # -- stepping

    def _check_unmoved(self, ids=None, registered_grads: bool = True) -> None:
        """InvalidStateError if a registered array lost the memory the
        library holds (ArrayRef.moved): the step would update freed memory.
        ids: only those params (step_params), and their registered grads
        when `registered_grads`; ids out of range are the library's to name."""
        if ids is None:
            movable = self._movable
            if movable is None:
                movable = self._movable = [(f"{role} {i}", ref) for role, refs in (("param", self._params),
                                                                                    ("grad of param", self._grads))
                                           for i, ref in enumerate(refs) if ref is not None and ref.probe is not None]
        else:
            n = len(self._params)
            movable = [(f"{role} {i}", ref) for i in ids if 0 <= i < n
                       for role, ref in (("param", self._params[i]),
                                         ("grad of param", self._grads[i] if registered_grads else None))
                       if ref is not None and ref.probe is not None]
        for what, ref in movable:
            why = ref.moved()
            if why is not None:
                raise InvalidStateError(
                    f"step: {what} no longer holds the memory registered with the optimizer: {why}. Nothing was "
                    "done; register the array again (add_param / set_grad in a new optimizer) after changing it")

    def _stepping(self):
        """Held while a step runs: this optimizer's communicator, whose
        handle the step uses too, serves no other call meanwhile."""
        return self._comm._lock if self._comm is not None else contextlib.nullcontext()

    @locked
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
        self._check_unmoved()
        if grads is None:
            s = self._stream_arg if stream is None else void_p(stream_pointer(stream))
            with self._stepping():
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
                # per param: the kept fingerprint of the array described
                # there, while the descriptor may be reused (None: describe)
                self._step_seen = [None] * n
            seen = self._step_seen
            # CPU: an array with the memory and layout of the one described
            # there at the last call (the same array, mostly: its fingerprint,
            # which determines the descriptor) keeps the descriptor;
            # describing it again was most of a small step's cost. On CUDA
            # each export also orders the producer's stream before the
            # step's: described at every call.
            reuse = self.device == Device.CPU
            keep = []
            for i, g in enumerate(grads):
                if g is None:
                    arr.clear(i)
                    seen[i] = None
                    continue
                last = seen[i]
                if last is not None and last == fingerprint(g):
                    continue
                seen[i] = None
                ref = as_array_ref(g, role=f"grads[{i}]", writable=False, device=self.device,
                                   device_index=self.device_index, stream=s)
                if ref.numel != self._params[i].numel:
                    raise ArrayError(f"grads[{i}]: has {ref.numel} elements but param {i} has "
                                     f"{self._params[i].numel}")
                arr.set(i, ref)
                keep.append(ref)
                if reuse:
                    seen[i] = kept_fingerprint(g)
            self._step_tensors(arr.cdata, n, s)
            del keep
        return self._applied(h)

    def _applied(self, h) -> bool:
        """After a step: whether it was applied (CPU: the skip flag; CUDA:
        True, the flag being valid only once the stream reaches the step)."""
        if self.device == Device.CPU:
            status = _last_step_skipped(h, self._i32)
            if status:
                raise failure("lowbit_optimizer_last_step_skipped", status, h)
            return not self._i32[0]
        return True

    @locked
    def step_params(self, ids, grads=None, *, stream=None) -> bool:
        """A step of the params `ids` only (distinct param ids, any order):
        with their registered gradients (grads None) or grads[k] for ids[k].
        Each param gets the bits a full step would give it; the others are
        left alone. NaN/Inf in this call's gradients skips this call's
        params only. Returns True if applied (CPU; on CUDA see step())."""
        h = self._h()
        ids = _param_ids(ids)
        self._check_unmoved(ids, registered_grads=grads is None)
        n = len(ids)
        s = self.stream if stream is None else stream_pointer(stream)
        id_array = ffi.new("int64_t[]", ids) if n else ffi.new("int64_t[]", 1)
        arr = NULL
        keep = []
        if grads is not None:
            grads = list(grads)
            if len(grads) != n:
                raise InvalidArgumentError(f"grads: got {len(grads)} gradients for {n} ids")
            arr = TensorArray(n)
            for k, g in enumerate(grads):
                if not 0 <= ids[k] < len(self._params):
                    break  # the library names the bad id
                ref = g if isinstance(g, ArrayRef) else as_array_ref(
                    g, role=f"grads[{k}]", writable=False, device=self.device, device_index=self.device_index,
                    stream=s)
                arr.set(k, ref)
                keep.append(ref)
            arr = arr.cdata
        self._step_params_array(id_array, n, arr, s)
        del keep
        return self._applied(h)

    @locked
    def _step_params_array(self, id_array, n: int, grads_array, stream) -> None:
        """lowbit_optimizer_step_params on prepared cffi arrays (an
        ``int64_t[]`` of ids, a ``lowbit_tensor_t[]`` or NULL)."""
        h = self._h()
        with self._stepping():
            status = _step_params(h, id_array, n, grads_array, void_p(stream))
        if status:
            raise failure("lowbit_optimizer_step_params", status, h)

    @locked
    def _step_tensors(self, grads_array, n: int, stream) -> None:
        """step_with_grads on an already-built array of n lowbit_tensor_t: a
        cffi ``lowbit_tensor_t[]`` (TensorArray.cdata), or any buffer laid out
        as one (a ctypes array of lowbit._ffi.Tensor)."""
        h = self._h()
        if not isinstance(grads_array, CData):
            grads_array = ffi.from_buffer(_tensor_array_type, grads_array)
        if n > len(grads_array):
            raise InvalidArgumentError(f"grads: {n} descriptors asked for, the array holds {len(grads_array)}")
        with self._stepping():
            status = _step_with_grads(h, grads_array, n, void_p(stream))
        if status:
            raise failure("lowbit_optimizer_step_with_grads", status, h)

    @locked
    def _join_failed_step(self, stream=None) -> LowbitError:
        """1-bit optimizers: for a caller that failed before its step (its
        own checks), a step that fails in the library's local checks, so that
        it joins the agreement the other ranks' steps start with: every rank
        fails and nothing changes anywhere (where the communicator has an
        agreement; see lowbit_comm.h, "Failures"). Returns the error the
        library reported here."""
        h = self._h()
        with self._stepping():
            status = _step_with_grads(h, NULL, 0, void_p(stream))  # grads NULL: refused before any pass
        return failure("lowbit_optimizer_step_with_grads", status, h) if status else None

    # -- 1-bit Adam, 0/1 Adam, 1-bit LAMB

    @locked
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

    @locked
    def set_onebit_warmup_average(self, average: bool) -> None:
        """1-bit optimizers: True (the default): a step that needs averaged
        gradients (1-bit Adam's and 1-bit LAMB's warm-up, 0/1 Adam's variance
        steps; ``onebit_status().next_full_average``) averages them over the
        communicator; False: the caller averages them over the ranks before
        such a step (e.g. DDP), which then exchanges only the argument
        agreement. The same on every rank."""
        self._call("lowbit_optimizer_set_onebit_warmup_average", 1 if average else 0)

    @locked
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
        o = onebit_options_struct(merged)
        self._call("lowbit_optimizer_set_onebit_options", o)
        self._onebit_options = {name: getattr(o, name) for name in ONEBIT_OPTION_NAMES}

    @locked
    def onebit_options(self) -> dict:
        """The 0/1 Adam / 1-bit LAMB options last set (the library's defaults
        until set_onebit_options), by name."""
        if self._onebit_options is None:
            self._onebit_options = onebit_options_defaults()
        return dict(self._onebit_options)

    @locked
    def onebit_status(self) -> OneBitStatus:
        """Where a 1-bit optimizer (1-bit Adam, 0/1 Adam, 1-bit LAMB) stands:
        its step count, phase and what the next step needs (a
        :class:`OneBitStatus`). On CUDA it waits for the device."""
        st = ffi.new("lowbit_onebit_status_t *")
        st.struct_size = ffi.sizeof("lowbit_onebit_status_t")
        self._call("lowbit_optimizer_onebit_status", st)
        return OneBitStatus.from_c(st)

    @locked
    def set_momentum_mask(self, param_id: int, mask) -> None:
        """1-bit Adam: elements where `mask` (numel values, host) is 0 keep a
        momentum of exactly zero. None removes the mask."""
        pid = c_int(param_id, "param_id")
        if mask is None:
            self._call("lowbit_optimizer_set_momentum_mask", pid, NULL, 0)
            return
        m = np.ascontiguousarray(np.asarray(mask) != 0, dtype=np.uint8).reshape(-1)
        self._call("lowbit_optimizer_set_momentum_mask", pid, ffi.from_buffer("uint8_t[]", m), m.size)
        self._has_masks = True

    @property
    @locked
    def last_step_skipped(self) -> bool:
        self._call("lowbit_optimizer_last_step_skipped", self._i32)
        return bool(self._i32[0])

    # -- inspection

    @locked
    def param_info(self, param_id: int) -> ParamInfo:
        info = ffi.new("lowbit_param_info_t *")
        info.struct_size = ffi.sizeof("lowbit_param_info_t")
        self._call("lowbit_optimizer_param_info", c_int(param_id, "param_id"), info)
        return ParamInfo.from_c(info, DTYPE_NAMES)

    @locked
    def state_bytes(self, param_id: int | None = None) -> int:
        """Bytes of optimizer state of one param, or of all params."""
        self._call("lowbit_optimizer_state_bytes", -1 if param_id is None else c_int(param_id, "param_id"),
                   self._i64)
        return self._i64[0]

    @locked
    def workspace_bytes(self) -> int:
        """Bytes of step workspace the optimizer holds on its device besides
        its state (Muon: its batch of fp32 updates and Newton-Schulz products;
        0 for the element-wise algorithms). Allocated at registration."""
        self._call("lowbit_optimizer_workspace_bytes", self._i64)
        return self._i64[0]

    @locked
    def read_moment(self, param_id: int, moment: int = 0) -> np.ndarray:
        """A dequantized float32 copy of moment 0 (first) or 1 (second) of a
        param, shaped like the param (after the work on the optimizer's stream)."""
        pid = self._pid(param_id)
        p = self._params[pid]
        out = np.empty(p.shape, dtype=np.float32)
        self._call("lowbit_optimizer_read_moment", pid, c_int(moment, "moment", "int32_t"), ffi.from_buffer("float[]", out), out.size,
                   self._stream_arg)
        return out

    @locked
    def write_moment(self, param_id: int, moment, values) -> None:
        """Replace moment 0 or 1 of a param by `values` (any array-like with
        the param's number of elements, converted to float32 on the host); the
        library encodes them into the param's state format. Values must be
        finite, and a second moment >= 0; on error nothing changes."""
        pid = self._pid(param_id)
        k = c_int(moment, "moment", "int32_t")
        v = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
        self._call("lowbit_optimizer_write_moment", pid, k, ffi.from_buffer("float[]", v), v.size,
                   self._stream_arg)

    @locked
    def set_step(self, step: int, param_id: int | None = None) -> None:
        """Set the number of steps applied to one param, or to every param
        (bias corrections and stochastic-rounding bits follow it). `step`
        is an integer (1.5 is refused, not truncated)."""
        pid = -1 if param_id is None else self._pid(param_id)
        self._call("lowbit_optimizer_set_step", pid, c_int(step, "step"), self._stream_arg)

    @locked
    def param(self, param_id: int):
        """The array registered as param `param_id`."""
        return _owner(self._params[self._pid(param_id)])

    # -- checkpoints

    @locked
    def save(self, mode="compressed") -> bytes:
        """The whole optimizer state as bytes. mode: 'compressed' (as stored),
        'fp32' or 'bf16' (materialised moments)."""
        m = int(parse_checkpoint_mode(mode))
        self._call("lowbit_optimizer_save", m, NULL, 0, self._i64, self._stream_arg)
        size = self._i64[0]
        buf = ffi.new("char[]", max(size, 1))
        self._call("lowbit_optimizer_save", m, buf, size, self._i64, self._stream_arg)
        return ffi.buffer(buf, self._i64[0])[:]

    @locked
    def save_file(self, path, mode="compressed") -> None:
        self._call("lowbit_optimizer_save_file", int(parse_checkpoint_mode(mode)), os.fsencode(path),
                   self._stream_arg)

    @locked
    def load(self, data) -> None:
        """Load a checkpoint made by save() (any mode) into this optimizer,
        which must have the same params registered. On error nothing changes."""
        buf, n = _byte_buffer(data)
        self._call("lowbit_optimizer_load", buf, n, self._stream_arg)

    @locked
    def load_file(self, path) -> None:
        self._call("lowbit_optimizer_load_file", os.fsencode(path), self._stream_arg)


def _param_ids(ids) -> list:
    """step_params' ids as Python ints: ints and numpy integers; anything
    else (1.5, "0", True, None) raises TypeError naming it, where int()
    would have truncated or parsed it into another param's id."""
    out = []
    for k, i in enumerate(ids):
        try:
            if isinstance(i, (bool, np.bool_)):
                raise TypeError
            out.append(operator.index(i))
        except TypeError:
            raise TypeError(f"step_params: ids[{k}] = {i!r} is not an integer param id") from None
    return out


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

"""The 1-bit optimizers of lowbit.torch, for data-parallel training under
torchrun: OneBitAdam, ZeroOneAdam and OneBitLamb. Their schedules are the
library's (onebit_status() asks it), and so are the checks of their
settings."""

from __future__ import annotations

import torch

from .._ffi import Algorithm, Device
from .._errors import CommunicationError, LowbitError, StateMismatchError
from .._names import c_int
from .._options import check_onebit_options, config_defaults, onebit_options_defaults
from ._adam import _AdamBase
from ._dist import process_group_communicator
from ._tensors import _device_key, _is_dtensor, _local


def _sharded_dims(p) -> list:
    """The mesh dimensions (of size > 1) over which the DTensor `p` is not
    replicated (Shard, _StridedShard, Partial): its local tensor is then a
    piece of the param, not all of it. [] for plain tensors."""
    if not _is_dtensor(p):
        return []
    mesh = p.device_mesh
    return [(i, pl) for i, pl in enumerate(p.placements) if mesh.size(i) > 1 and not pl.is_replicate()]


def _refuse_sharded(optimizer: str, params: list, group_index: int) -> None:
    """ValueError naming the first param of a new group that is a sharded
    DTensor (FSDP2's fully_shard, distribute_tensor with Shard): the 1-bit
    optimizers exchange each rank's local tensors as if every rank held the
    same params (data parallelism), so over shards they would average
    different ranks' different pieces of a param (docs/ONEBIT_SHARDED.md).
    Replicated DTensors (every placement Replicate, or a mesh of one rank)
    hold the whole param on every rank and are taken."""
    for i, item in enumerate(params):
        name, p = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
        dims = _sharded_dims(p)
        if not dims:
            continue
        what = f"param {name!r}" if isinstance(name, str) else f"param {i} of param group {group_index}"
        placed = ", ".join(f"{pl} over mesh dim {d} of {p.device_mesh.size(d)} ranks" for d, pl in dims)
        raise ValueError(
            f"{optimizer}: {what} (shape {tuple(p.shape)}) is a sharded DTensor ({placed}; e.g. from FSDP2's "
            f"fully_shard): the 1-bit optimizers average every rank's local tensors as data-parallel replicas, so "
            f"on shards they would average different ranks' different pieces of it. Use the 1-bit optimizers "
            f"with replicated params (DDP and lowbit.torch.onebit_ddp_comm_hook, or replicated DTensors), or a "
            f"sharded optimizer such as lowbit.torch.AdamW under FSDP2 (docs/ONEBIT_SHARDED.md); nothing was "
            f"changed")


class _OneBitBase(_AdamBase):
    """What OneBitAdam, ZeroOneAdam and OneBitLamb share: one device, a
    communicator over a torch.distributed ProcessGroup (or a given
    :class:`lowbit.Communicator`), the DDP comm hook's switch, the status of
    the schedules (the library's), and per-rank state dicts that carry the
    communicator's error buffers.

    The library checks the settings when the optimizer is made (an error
    names the arguments as given and quotes the library). An error raised on
    one rank before the library's step (a learning rate the library refuses,
    a param whose ``.data`` was replaced, a bad grad) fails that step on
    every rank at once, nothing changed: that rank raises its error, the
    others InvalidArgumentError quoting it (over a ProcessGroup or any
    transport of Python functions with ``allreduce_max``; over MPI the others'
    message names the rank; over NCCL, which has no agreement, they wait).

    ``error_format``: how the communicator keeps the worker and server
    errors of the compressed exchange, ``"fp32"`` (default: 4 + 4/W bytes per
    param per rank), ``"bf16"`` (2 + 2/W) or ``"int8"`` (blocks of 256 with
    one fp32 absmax: (1 + 1/64)(1 + 1/W)); CPU params only for the last two.
    ``state_dict()`` carries the errors in that format; loading them needs an
    optimizer of the same format (otherwise an error, nothing changed). With
    ``communicator=`` the format is the communicator's.

    Params must be replicated (every rank holds all of each): plain tensors,
    replicated DTensors, or DTensors on a mesh of one rank. A sharded DTensor
    (FSDP2's ``fully_shard``) is refused by ``add_param_group`` (so also when
    the optimizer is made) with a ValueError naming it, nothing changed
    (docs/ONEBIT_SHARDED.md)."""

    def __init__(self, params, lr, betas, eps, weight_decay, *, freeze_step, process_group=None,
                 communicator=None, onebit_options=None, freeze_name="freeze_step", error_format=None, **kwargs):
        if communicator is not None and process_group is not None:
            raise ValueError("give process_group or communicator, not both")
        if error_format is not None and error_format not in ("fp32", "bf16", "int8"):
            raise ValueError(f"error_format={error_format!r} is not 'fp32', 'bf16' or 'int8'")
        if communicator is not None and error_format is not None and error_format != communicator.error_format:
            raise ValueError(f"error_format={error_format!r}, but the communicator given keeps its errors in "
                             f"{communicator.error_format!r} (set it when making the communicator)")
        # Options left None take the library's defaults (lowbit_onebit_options_init).
        self._option_names = tuple(onebit_options or ())
        options = check_onebit_options({k: v for k, v in (onebit_options or {}).items() if v is not None})
        if freeze_step is None:
            freeze_step = config_defaults(self._algorithm)["freeze_step"]
        freeze_step = c_int(freeze_step, freeze_name)
        super().__init__(params, lr, betas, eps, weight_decay, **kwargs)
        self.freeze_step = freeze_step
        self._config["freeze_step"] = self.freeze_step
        self._onebit_options = options
        if error_format not in (None, "fp32"):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.device.type != "cpu":
                        raise ValueError(f"error_format={error_format!r} takes CPU params only (a param is on "
                                         f"{p.device}); CUDA keeps the errors in fp32")
        self._comm = (communicator if communicator is not None
                      else process_group_communicator(process_group, error_format=error_format))
        self._process_group = process_group
        self._warmup_averaged_by_caller = False  # onebit_ddp_comm_hook: DDP averages the gradients
        self._generation = 0  # steps and loads so far: the cached status below is of one generation
        self._status_cache = None  # (generation, next_full_average)
        # The library checks the settings (freeze_step, the 1-bit options,
        # the hyper-parameters) now, on a handle made for that.
        try:
            self._new_handle("cpu").close()
        except LowbitError as e:
            settings = ", ".join(f"{k}={v!r}" for k, v in {freeze_name: freeze_step, **options}.items())
            where = f"{e.function}: " if e.function else ""
            raise type(e)(f"{type(self).__name__}({settings}): {where}{e.message}", e.status) from None

    def add_param_group(self, param_group: dict) -> None:
        # Refuse sharded DTensor params before torch (or lowbit) records the
        # group: nothing changes on a refused call. Every rank sees the same
        # placements and mesh sizes, so every rank refuses alike.
        if isinstance(param_group, dict) and "params" in param_group:
            params = param_group["params"]
            if isinstance(params, torch.Tensor):
                params = [params]
            elif not isinstance(params, set):  # a set: torch's own error
                params = list(params)
            param_group["params"] = params
            if not isinstance(params, set):
                _refuse_sharded(type(self).__name__, params, len(getattr(self, "param_groups", ())))
        super().add_param_group(param_group)

    @property
    def communicator(self):
        return self._comm

    @property
    def onebit_options(self) -> dict:
        """The lowbit_onebit_options_t values this optimizer gives the
        library (0/1 Adam's schedules, 1-bit LAMB's coefficients; empty for
        1-bit Adam), by DeepSpeed's names: those given, else the library's
        defaults."""
        defaults = onebit_options_defaults()
        return {name: self._onebit_options.get(name, defaults[name]) for name in self._option_names}

    def step(self, closure=None):
        self._comm._clear_transport_errors()
        try:
            return super().step(closure)
        except CommunicationError as e:
            # the torch.distributed transport raised: its exception, or the
            # reason of a rank that failed before its step (_failed_before_step)
            raise self._comm._transport_failure(e)
        finally:
            self._generation += 1

    def _failed_before_step(self, error: Exception) -> None:
        """This rank failed before the library's step (a hyper-parameter the
        library refused, a param whose memory moved, a bad grad): it still
        joins the step's agreement, failing it, so that every rank fails now,
        nothing changed, with this rank's reason (over a transport of Python
        functions such as the ProcessGroup's; over MPI the others' message
        names this rank), instead of waiting for it until a timeout."""
        try:
            handle = self._handle()
            stream = None
            if handle.device == Device.CUDA:
                stream = torch.cuda.current_stream(handle.device_index).cuda_stream
            with self._comm._failing(f"{type(error).__name__}: {error}"):
                handle._join_failed_step(stream)
        except Exception:  # noqa: BLE001 - the original error is what the caller gets
            pass

    def _device_state(self, device):
        key = _device_key(device)
        if key not in self._devices and self._devices:
            (old_key, old), = self._devices.items()
            if old.params:
                raise ValueError(f"{type(self).__name__} keeps all params on one device; a param is on {device}, "
                                 f"others on {old_key}")
            # Made before the params were registered, where they were then:
            # they are elsewhere now (the model moved), so is the handle.
            del self._devices[old_key]
            old.handle.close()
        fresh = key not in self._devices
        dev = super()._device_state(device)
        if fresh:
            try:
                dev.handle.set_comm(self._comm)
            except BaseException:
                del self._devices[key]
                dev.handle.close()
                raise
        return dev

    def _new_handle(self, key: str):
        handle = super()._new_handle(key)
        try:
            handle.set_onebit_warmup_average(not self._warmup_averaged_by_caller)
            if self._onebit_options:
                handle.set_onebit_options(**self._onebit_options)
        except BaseException:
            handle.close()
            raise
        return handle

    def _warmup_averaged_by(self, caller: bool) -> None:
        self._warmup_averaged_by_caller = bool(caller)
        for dev in self._devices.values():
            dev.handle.set_onebit_warmup_average(not caller)

    def _handle(self):
        """The lowbit handle, on the params' device: made when first asked
        (onebit_status(), the DDP comm hook during the first backward, the
        first step), so that the library answers before the first step too."""
        for dev in self._devices.values():
            return dev.handle
        return self._device_state(_local(self.param_groups[0]["params"][0]).device).handle

    def steps_taken(self) -> int:
        """Steps the library applied (skipped steps do not count)."""
        dev = next(iter(self._devices.values()), None)
        return dev.handle.param_info(0).step if dev is not None and dev.params else 0

    def onebit_status(self):
        """Where the optimizer stands (a :class:`lowbit.OneBitStatus`: step
        count, phase, whether the next step runs on averaged gradients, the
        next step's exchange, 0/1 Adam's schedules), as the library says,
        before the first step too."""
        return self._handle().onebit_status()

    def _next_full_average(self) -> bool:
        """Whether the next step runs on gradients averaged uncompressed
        (onebit_ddp_comm_hook asks it for every bucket: the library is asked
        once per step)."""
        cached = self._status_cache
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        value = self.onebit_status().next_full_average
        self._status_cache = (self._generation, value)
        return value

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["lowbit"]["comm_errors"] = torch.frombuffer(bytearray(self._comm.save_errors()), dtype=torch.uint8)
        sd["lowbit"]["rank"] = self._comm.rank
        sd["lowbit"]["world_size"] = self._comm.world_size
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        lowbit = state_dict.get("lowbit") or {}
        blob = lowbit.get("comm_errors")
        for key, mine in (("rank", self._comm.rank), ("world_size", self._comm.world_size)):
            if key in lowbit and lowbit[key] != mine:
                raise StateMismatchError(f"this state dict was saved by {key} {lowbit[key]}, this optimizer's "
                                         f"{key} is {mine}: {type(self).__name__}'s error buffers are per rank")
        old = self._comm.save_errors()
        if blob is not None:
            self._comm.load_errors(bytes(blob.cpu().numpy().tobytes()))
        try:
            super().load_state_dict(state_dict)
        except BaseException:
            self._comm.load_errors(old)
            raise
        finally:
            self._generation += 1


class OneBitAdam(_OneBitBase):
    """1-bit Adam (Tang et al. 2021) for data-parallel training under
    ``torchrun``: every rank steps the same model; the optimizer does the
    communication over a torch.distributed ProcessGroup (gloo on CPU, NCCL on
    GPU; default: the world group), or over a given :class:`lowbit.Communicator`.

    - Warm-up (steps 1 .. freeze_step - 1 of the library's count, i.e. while
      the step count is below ``freeze_step``): the gradients of all params,
      fused into one buffer, are averaged uncompressed over the ranks and an
      AdamW step runs on the average (as DDP + AdamW would).
    - Compressed stage: the variance is frozen; each rank's local momentum is
      averaged with the 1-bit compressed all-reduce (error feedback) and the
      update uses it: about 1/32 of the bytes of an fp32 all-reduce.

    ``freeze_step`` None: the library's default (lowbit_optimizer_config_init).
    Bias correction is AdamW's (both terms), also after the freeze (the
    frozen variance keeps the correction of its last warm-up step count).
    Use it with DDP through :func:`onebit_ddp_comm_hook`, which stops DDP's
    own gradient all-reduce (the optimizer does it). The communicator's error
    buffers are this rank's: ``state_dict()`` carries them (``"lowbit"``
    ``"comm_errors"``), so save one state dict per rank; loading it on the
    same rank of the same world size resumes bit for bit.
    All params must be on one device."""

    _algorithm = Algorithm.ONEBIT_ADAM

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, freeze_step=None,
                 process_group=None, communicator=None, **kwargs):
        super().__init__(params, lr, betas, eps, weight_decay, freeze_step=freeze_step, process_group=process_group,
                         communicator=communicator, **kwargs)


def _refuse_bias_correction(value, where="bias_correction"):
    """0/1 Adam and 1-bit LAMB have no bias correction (DeepSpeed's take the
    flag and ignore it); lowbit refuses bias_correction=True."""
    if value:
        raise ValueError(f"{where}=True is not supported: 0/1 Adam and 1-bit LAMB have no bias correction "
                         "(DeepSpeed's ZeroOneAdam and OnebitLamb ignore the flag)")


class _DeepSpeedOneBit(_OneBitBase):
    """0/1 Adam and 1-bit LAMB: no bias correction (DeepSpeed's take the flag
    and ignore it; lowbit refuses it), and state dicts only of their own."""

    _own_state = ""  # what their state holds that torch.optim has no counterpart for

    def _check_group(self, group):
        super()._check_group(group)
        _refuse_bias_correction(group.get("bias_correction"), "param group bias_correction")

    def _plan_torch_import(self, state, by_index, saved_groups):
        raise ValueError(f"{type(self).__name__} loads only its own state_dict() (per rank): its state "
                         f"({self._own_state}) has no torch.optim counterpart")


class ZeroOneAdam(_DeepSpeedOneBit):
    """0/1 Adam (Lu et al. 2022; DeepSpeed's ``ZeroOneAdam`` and its
    hyper-parameter names) for data-parallel training under ``torchrun``,
    over a torch.distributed ProcessGroup like :class:`OneBitAdam`.

    - Phase 1 (step t <= ``var_freeze_step``): on variance steps (t a
      multiple of the variance interval, which starts at 1 and doubles after
      every ``var_update_scaler`` variance steps) the gradients are averaged
      uncompressed and m and v take an Adam step; on the other steps the
      gradient goes through the 1-bit compressed all-reduce and only m moves.
    - Phase 2 (t > ``var_freeze_step``, v frozen): local steps on this rank's
      own gradient, no communication; every ``local_step_interval`` steps
      (1 at first, doubling every ``local_step_scaler`` phase-2 steps, at most
      ``local_step_clipper``) the ranks average their updates since the last
      synchronisation with the 1-bit all-reduce, and every rank ends with the
      same params. Between synchronisations the ranks' params differ.

    The three schedule options left None take the library's defaults
    (lowbit_onebit_options_init: DeepSpeed's 16, 32678, 16).
    No bias correction; the weight decay is AdamW's (decoupled) form.
    With DDP use :func:`onebit_ddp_comm_hook`: it lets DDP average the
    gradients of the variance steps (fp32, overlapped with backward) and
    leaves them local otherwise. State dicts are per rank (they carry the
    communicator's error buffers). All params must be on one device."""

    _algorithm = Algorithm.ZEROONE_ADAM
    _own_state = "schedules, the params at the last synchronisation"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, var_freeze_step=100000,
                 var_update_scaler=None, local_step_scaler=None, local_step_clipper=None, bias_correction=False,
                 process_group=None, communicator=None, **kwargs):
        _refuse_bias_correction(bias_correction)
        options = dict(var_update_scaler=var_update_scaler, local_step_scaler=local_step_scaler,
                       local_step_clipper=local_step_clipper)
        super().__init__(params, lr, betas, eps, weight_decay, freeze_step=var_freeze_step,
                         process_group=process_group, communicator=communicator, onebit_options=options,
                         freeze_name="var_freeze_step", bias_correction=False, **kwargs)

    @property
    def var_freeze_step(self) -> int:
        return self.freeze_step



class OneBitLamb(_DeepSpeedOneBit):
    """1-bit LAMB (Li et al. 2021; DeepSpeed's ``OnebitLamb`` and its
    hyper-parameter names) for data-parallel training under ``torchrun``,
    over a torch.distributed ProcessGroup like :class:`OneBitAdam`.

    - Warm-up (steps t <= ``freeze_step``): LAMB on the gradients averaged
      uncompressed: Adam's moments without bias correction, update u = m / D
      + weight_decay p, per-tensor trust ratio ||p|| / ||u|| clipped to
      [``min_coeff``, ``max_coeff``], whose EMA (``coeff_beta``) is recorded.
    - Compression (t > ``freeze_step``): v and the trust ratio's EMA are
      frozen; each rank's momentum, rescaled per tensor to a common RMS, is
      averaged by one 1-bit compressed all-reduce over all params; the
      coefficient is the frozen ratio times a factor (from a fresh variance
      of the reconstructed gradients) clipped to [``factor_min``,
      ``factor_max``] and to a relative change of ``factor_threshold`` per
      step.

    With DDP use :func:`onebit_ddp_comm_hook` (DDP averages the warm-up
    gradients; afterwards they stay local). State dicts are per rank (they
    carry the communicator's error buffers). All params must be on one device.
    The coefficient options left None take the library's defaults
    (lowbit_onebit_options_init: DeepSpeed's)."""

    _algorithm = Algorithm.ONEBIT_LAMB
    _own_state = "the frozen trust ratios, the fresh variance"

    def __init__(self, params, lr=1e-3, freeze_step=100000, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 max_coeff=None, min_coeff=None, coeff_beta=None, factor_max=None, factor_min=None,
                 factor_threshold=None, bias_correction=False, process_group=None, communicator=None, **kwargs):
        _refuse_bias_correction(bias_correction)
        options = dict(max_coeff=max_coeff, min_coeff=min_coeff, coeff_beta=coeff_beta, factor_max=factor_max,
                       factor_min=factor_min, factor_threshold=factor_threshold)
        super().__init__(params, lr, betas, eps, weight_decay, freeze_step=freeze_step,
                         process_group=process_group, communicator=communicator, onebit_options=options,
                         bias_correction=False, **kwargs)


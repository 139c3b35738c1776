"""1-bit Adam under FSDP2, design (b) of docs/ONEBIT_SHARDED.md (section 5):
FSDP2's gradient reduce-scatter compressed with worker error feedback after a
warm-up, the owned shards stepped by Adam with the variance frozen.

    model = ...; fully_shard(block) for each block; fully_shard(model)
    opt = lowbit.torch.FSDPOneBitAdam(model, lr=1e-3, freeze_step=100, error_format="int8")
    loss.backward(); opt.step(); opt.zero_grad()

It takes the FSDP2 module tree (not params): it installs a reduce-scatter on
every FSDP2 module of it (``FSDPModule.set_custom_reduce_scatter``), which is
what moves the bytes; the optimizer's step exchanges nothing."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from .._errors import NonFiniteError
from ._adam import AdamW
from ._dist import process_group_communicator
from ._tensors import _is_dtensor

_ERROR_FORMATS = ("fp32", "bf16", "int8")
_HYPER = ("lr", "betas", "eps", "weight_decay", "bias_correction")  # read from the param groups at every step


def _fsdp2():
    """FSDP2's pieces this module needs (torch >= 2.6), or an ImportError
    naming what is missing."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
        from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo
    except ImportError as e:  # pragma: no cover - older torch
        raise ImportError(f"lowbit.torch.FSDPOneBitAdam needs FSDP2 with set_custom_reduce_scatter "
                          f"(torch >= 2.6); torch {torch.__version__}: {e}") from None
    return FSDPModule, ReduceScatter, DefaultReduceScatter, HSDPMeshInfo


class _Schedule:
    """What the optimizer and its reduce-scatters share: the steps applied so
    far and freeze_step. The backward before step t (t = steps + 1) reduces
    with fp32 while t <= freeze_step, compressed afterwards."""

    def __init__(self, freeze_step: int):
        self.freeze_step = freeze_step
        self.steps = 0
        self.nonfinite = False  # a compressed reduce-scatter of this backward refused a NaN / Inf

    @property
    def compressed(self) -> bool:
        return self.steps >= self.freeze_step


def _make_reduce_scatter_class():
    _, ReduceScatter, _, _ = _fsdp2()

    class CompressedReduceScatter(ReduceScatter):
        """FSDP2's reduce-scatter of one param group: torch's
        ``reduce_scatter_tensor`` during the warm-up, lowbit's 1-bit
        compressed reduce-scatter (worker error feedback, no server error)
        afterwards, on a communicator of this group's own. FSDP2's input is W
        equal chunks of S elements (this group's padded shards); lowbit's
        chunks are those when S is a multiple of 8, otherwise each chunk is
        copied into a zero-padded chunk of the next multiple of 8 first (the
        pad elements are compressed as elements: they count in the scale and
        carry worker error; their output is dropped)."""

        def __init__(self, schedule: _Schedule, name: str, group, error_format: str):
            self.schedule = schedule
            self.name = name
            self.process_group = group
            self.comm = process_group_communicator(group, error_format=error_format)
            self.group_size = group.size()
            self.fp32_calls = 0
            self.compressed_calls = 0
            self.record = None  # tests: a list that gets (input, output) copies of every compressed call

        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            if not self.schedule.compressed:
                self.fp32_calls += 1
                return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                                  async_op=async_op)
            W = group.size()
            what = f"FSDPOneBitAdam: the reduce-scatter of {self.name}"
            if W != self.group_size:
                raise ValueError(f"{what} was given a group of {W} ranks; its communicator spans "
                                 f"{self.group_size}")
            if op != dist.ReduceOp.AVG:
                raise ValueError(f"{what} averages; FSDP2 asked for {op} (a gradient_divide_factor or a "
                                 f"reduce dtype other than fp32 / bf16 sets it)")
            for t, role in ((input_tensor, "input"), (output_tensor, "output")):
                if t.dtype != torch.float32 or t.device.type != "cpu":
                    raise ValueError(f"{what}: its {role} is {t.dtype} on {t.device}; the compressed "
                                     f"reduce-scatter takes fp32 host tensors")
            n = input_tensor.numel()
            S = n // W
            if S * W != n or output_tensor.numel() != S:
                raise ValueError(f"{what}: input numel {n} is not {W} x output numel {output_tensor.numel()}")
            Sp = -(-S // 8) * 8
            padded = Sp != S
            if not padded:
                src, dst = input_tensor.detach(), output_tensor.detach()
            else:
                src = torch.zeros(W, Sp, dtype=torch.float32)
                src[:, :S] = input_tensor.detach().view(W, S)
                dst = torch.empty(Sp, dtype=torch.float32)
            src = src.contiguous().view(-1)
            off, c = self.comm.reduce_scatter_chunk(src.numel())
            assert c == Sp and off == group.rank() * Sp, (off, c, Sp)
            try:
                self.comm.compressed_reduce_scatter(src.numpy(), dst.numpy())
            except NonFiniteError:
                # refused on every rank alike (the communicator's agreement),
                # nothing changed, its errors included: the step is skipped.
                # Raising here would leave FSDP2's backward half done.
                output_tensor.detach().fill_(float("nan"))
                self.schedule.nonfinite = True
                return None
            if padded:
                output_tensor.detach().copy_(dst[:S])
            self.compressed_calls += 1
            if self.record is not None:
                self.record.append((src.clone(), output_tensor.detach().clone()))
            return None

    return CompressedReduceScatter


def _fsdp_groups(module):
    """[(name, FSDPModule, its FSDP param group)] for every FSDP2 module of
    `module` (itself included) that manages params, or a clear error naming
    what it cannot take."""
    FSDPModule, _, DefaultReduceScatter, HSDPMeshInfo = _fsdp2()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"FSDPOneBitAdam takes the FSDP2 module (the model after fully_shard), not "
                        f"{type(module).__name__}: it installs its reduce-scatter on the modules")
    found = []
    for name, m in module.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        label = f"module {name!r}" if name else "the root module"
        groups = m._get_fsdp_state()._fsdp_param_groups
        if not groups:
            continue
        if len(groups) > 1:
            raise ValueError(f"FSDPOneBitAdam: {label} has {len(groups)} FSDP param groups (a per-param mesh, "
                             f"shard_placement_fn); one per module is supported; nothing was changed")
        pg = groups[0]
        info = pg.mesh_info
        if isinstance(info, HSDPMeshInfo) or info.mesh.ndim != 1:
            raise ValueError(f"FSDPOneBitAdam: {label} is on a {info.mesh.ndim}-D mesh {tuple(info.mesh.shape)} "
                             f"(HSDP or FSDP2 over a sub-mesh): only plain FSDP2 on a 1-D mesh is supported; "
                             f"nothing was changed")
        if pg.device.type != "cpu":
            raise ValueError(f"FSDPOneBitAdam: {label} is on {pg.device}: the compressed reduce-scatter is "
                             f"host-only today (gloo; no CUDA tensors / NCCL yet); nothing was changed")
        for fp in pg.fsdp_params:
            mp = fp.mp_policy
            for what, dtype in (("param_dtype", mp.param_dtype), ("reduce_dtype", mp.reduce_dtype)):
                if dtype not in (None, torch.float32):
                    raise ValueError(f"FSDPOneBitAdam: {label} has MixedPrecisionPolicy({what}={dtype}): the "
                                     f"compressed reduce-scatter takes fp32 gradients; nothing was changed")
            if fp.sharded_param.dtype != torch.float32:
                raise ValueError(f"FSDPOneBitAdam: {label}'s param {getattr(fp, '_param_fqn', '')!s} is "
                                 f"{fp.sharded_param.dtype}: fp32 params only; nothing was changed")
        if getattr(pg, "gradient_divide_factor", None) not in (None, float(info.shard_mesh_size)):
            raise ValueError(f"FSDPOneBitAdam: {label} has gradient_divide_factor {pg.gradient_divide_factor}: "
                             f"the compressed reduce-scatter averages; nothing was changed")
        if not isinstance(pg._reduce_scatter_comm, DefaultReduceScatter):
            raise ValueError(f"FSDPOneBitAdam: {label} already has a custom reduce-scatter "
                             f"({type(pg._reduce_scatter_comm).__name__}); nothing was changed")
        found.append((name, m, pg))
    if not found:
        raise ValueError(f"FSDPOneBitAdam: {type(module).__name__} holds no FSDP2 module with params (apply "
                         f"torch.distributed.fsdp.fully_shard first); nothing was changed")
    return found


def _f32(x) -> float:
    return float(np.float32(x))


class FSDPOneBitAdam(torch.optim.Optimizer):
    """1-bit Adam for FSDP2 (design (b), docs/ONEBIT_SHARDED.md section 5):
    the gradient reduce-scatter is the compressed one after the warm-up, and
    the owned shards take Adam's step with the variance frozen.

    ``module``: the model after ``fully_shard`` (its FSDP2 submodules and
    itself); every param of it must be managed by FSDP2 on one 1-D CPU mesh
    (gloo), fp32. On every FSDP2 module with params a reduce-scatter is
    installed (``set_custom_reduce_scatter``), each with its own lowbit
    communicator (its worker error is that group's).

    - Warm-up, steps ``t <= freeze_step``: FSDP2's fp32 reduce-scatter
      (torch's), and the step is :class:`lowbit.torch.AdamW`'s on the shards
      (``state=`` and the other keywords are its), bit for bit FSDP2 +
      lowbit AdamW.
    - At the end of step ``freeze_step`` the moments are read (dequantized)
      into fp32 shard state ``exp_avg`` / ``exp_avg_sq`` and the AdamW is
      dropped.
    - Compressed stage, ``t > freeze_step``: the reduce-scatter of each group
      is lowbit's 1-bit one (worker error feedback, ``error_format`` "fp32",
      "bf16" or "int8": 4, 2 or about 1 B per element of the group's input,
      on every rank), and the step is 1-bit Adam's compressed-stage rule
      (docs/ALGORITHMS.md 3.1) with the exchange left out, since FSDP2 has
      averaged already: ``m = b1 m + (1 - b1) g``, ``p = p (1 - lr wd) -
      (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^freeze_step) + eps)``
      (``bias_correction=False``: ``lr m / (sqrt(v) + eps)``), in
      fp32 in the library's order, written in torch (the C 1-bit Adam's step
      includes its exchange).

    Param groups (``params=`` a list of dicts of the module's params, e.g.
    no decay for norms) and lr schedulers work as with torch's optimizers;
    the hyper-parameters are read at every step. ``state_dict()`` is torch's
    AdamW layout (``step``, ``exp_avg``, ``exp_avg_sq`` as DTensors), which
    ``torch.distributed.checkpoint`` saves and loads at another world size;
    the worker errors are not in it (per rank and per group: they restart at
    zero after a load; ``error_state()`` / ``load_error_state()`` carry them
    per rank on the same layout)."""

    def __init__(self, module, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, freeze_step=100,
                 error_format="fp32", params=None, bias_correction=True, **adamw_kwargs):
        if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 1:
            raise ValueError(f"FSDPOneBitAdam: freeze_step={freeze_step!r} is not an int >= 1 (the warm-up "
                             f"steps, whose fp32 variance is then frozen)")
        if error_format not in _ERROR_FORMATS:
            raise ValueError(f"FSDPOneBitAdam: error_format={error_format!r} is not one of {_ERROR_FORMATS}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("FSDPOneBitAdam: torch.distributed is not initialized")
        found = _fsdp_groups(module)
        managed = {id(fp.sharded_param) for _, _, pg in found for fp in pg.fsdp_params}
        named = dict((id(p), n) for n, p in module.named_parameters())
        chosen = list(module.parameters() if params is None else params)
        if chosen and isinstance(chosen[0], dict):
            chosen = [dict(g, params=[g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"]))
                      for g in chosen]
            flat = [p for g in chosen for p in g["params"]]
        else:
            flat = chosen
        for p in flat:
            if id(p) not in managed:
                raise ValueError(f"FSDPOneBitAdam: param {named.get(id(p), '(not in the module)')!r} "
                                 f"(shape {tuple(p.shape)}) is not managed by an FSDP2 module of the module "
                                 f"given: its gradient would not be reduced; nothing was changed")
        # the AdamW gets copies of the groups (torch's add_param_group fills
        # and keeps the dicts it is given); _sync_groups copies the
        # hyper-parameters over at every warm-up step
        copies = [dict(g) for g in chosen] if chosen and isinstance(chosen[0], dict) else chosen
        self._adamw = AdamW(copies, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            bias_correction=bias_correction, **adamw_kwargs)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(chosen, defaults)
        self.freeze_step = freeze_step
        self.error_format = error_format
        self._schedule = _Schedule(freeze_step)
        self._skipped = False
        cls = _make_reduce_scatter_class()
        self.reduce_scatters = []
        for name, m, pg in found:
            rs = cls(self._schedule, f"module {name!r}" if name else "the root module",
                     pg.mesh_info.shard_process_group, error_format)
            self.reduce_scatters.append(rs)
        for (_, m, _), rs in zip(found, self.reduce_scatters):
            m.set_custom_reduce_scatter(rs)

    # -- the schedule
    @property
    def compressed(self) -> bool:
        """Whether the next backward reduces compressed (and the next step
        uses the frozen variance)."""
        return self._schedule.compressed

    def steps_taken(self) -> int:
        """Steps applied (skipped ones do not count)."""
        return self._schedule.steps

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last step was skipped, on every rank: a non-finite
        gradient (the warm-up AdamW's skip_nonfinite, or the compressed
        reduce-scatter's refusal of a NaN / Inf input on any rank)."""
        return self._skipped

    def _sync_groups(self):
        for mine, theirs in zip(self.param_groups, self._adamw.param_groups):
            for k in _HYPER:
                theirs[k] = mine[k]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._adamw is not None:
            self._sync_groups()
            self._adamw.step()
            self._skipped = bool(self._adamw.last_step_skipped)
            if not self._skipped:
                self._schedule.steps += 1
            if self._schedule.steps == self.freeze_step:
                self._freeze()
            return loss
        self._skipped = False
        if self._schedule.nonfinite:
            # a non-finite gradient on some rank: the reduce-scatter refused
            # it on every rank; skipped everywhere, the schedule not advanced
            self._schedule.nonfinite = False
            self._skipped = True
            return loss
        t = self._schedule.steps + 1
        for group in self.param_groups:  # checked before anything moves: a refused step changes nothing
            for p in group["params"]:
                if p.grad is None and p.to_local().numel():
                    raise ValueError(f"FSDPOneBitAdam: a param (shape {tuple(p.shape)}) has no gradient at step "
                                     f"{t}; after the freeze every param needs one; nothing was changed")
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            bc = bool(group.get("bias_correction", True))
            b1f = np.float32(b1)
            one_minus_b1 = float(np.float32(1.0) - b1f)
            decay = _f32(1.0 - float(np.float64(np.float32(lr))) * float(np.float64(np.float32(wd))))
            # make_frozen_scalars (core/step_scalars.hpp): without bias
            # correction step_size = lr and no variance correction
            step_size = _f32(float(np.float32(lr)) / (1.0 - float(np.float64(b1f)) ** t)) if bc else _f32(lr)
            inv_bc2 = (_f32(1.0 / math.sqrt(1.0 - float(np.float64(np.float32(b2))) ** self.freeze_step))
                       if bc else 1.0)
            for p in group["params"]:
                st = self.state[p]
                x = p.to_local()
                if x.numel() == 0:
                    st["step"] += 1
                    continue
                g = p.grad.to_local()
                m, v = st["exp_avg"].to_local(), st["exp_avg_sq"].to_local()
                m.mul_(float(b1f)).add_(g * one_minus_b1)
                denom = v.sqrt().mul_(inv_bc2).add_(_f32(eps))
                x.mul_(decay)
                x.sub_((m * step_size).div_(denom))
                st["step"] += 1
        self._schedule.steps += 1
        return loss

    def _freeze(self):
        """End of step freeze_step: the AdamW's moments (dequantized) become
        this optimizer's fp32 shard state; the AdamW is dropped."""
        for group in self._adamw.param_groups:
            for p in group["params"]:
                src = self._adamw.state[p]
                self.state[p] = {"step": torch.tensor(float(self.freeze_step)),
                                 "exp_avg": _fp32_like(src.get("exp_avg"), p),
                                 "exp_avg_sq": _fp32_like(src.get("exp_avg_sq"), p)}
        self._adamw = None

    # -- memory and bytes
    def error_bytes(self) -> int:
        """Bytes of error buffers this rank's communicators keep, over all
        groups, in their error_format (lowbit_comm_error_numel: the worker
        error, the group's reduce-scatter input, and the server error the
        communicator allocates beside it; 0 before the first compressed
        call)."""
        return sum(_error_bytes(w, self.error_format) + _error_bytes(s, self.error_format)
                   for w, s in (rs.comm.error_numel() for rs in self.reduce_scatters))

    def compressed_bytes_sent(self) -> int:
        return sum(rs.comm.stats()["compressed_bytes_sent"] for rs in self.reduce_scatters)

    # -- state
    def state_dict(self):
        """torch's AdamW layout: per param ``step``, ``exp_avg`` and
        ``exp_avg_sq`` (fp32 DTensors with the param's mesh and placements;
        during the warm-up the AdamW's moments, dequantized; before the first
        step zeros, so that a fresh optimizer's state dict is a template
        torch.distributed.checkpoint can load into)."""
        if self._adamw is None:
            return super().state_dict()
        sd = {"state": self._adamw.state_dict()["state"],  # the layout, not lowbit's blob
              "param_groups": super().state_dict()["param_groups"]}  # this optimizer's groups, in every stage
        if not sd["state"]:
            index = 0
            for group in self._adamw.param_groups:
                for p in group["params"]:
                    sd["state"][index] = {"step": torch.tensor(0.0), "exp_avg": _fp32_like(None, p),
                                          "exp_avg_sq": _fp32_like(None, p)}
                    index += 1
        return sd

    def load_state_dict(self, state_dict):
        """Loads a state dict of state_dict()'s layout (torch's AdamW layout;
        e.g. through torch.distributed.checkpoint, at any world size): its
        step count says the stage (a warm-up one goes to the AdamW, in its
        state format). The worker errors restart at zero (error_state() /
        load_error_state() carry them on the same ranks and layout)."""
        steps = {int(float(s["step"])) for s in state_dict["state"].values()}
        if len(steps) > 1:
            raise ValueError(f"FSDPOneBitAdam: the state dict's params have different step counts "
                             f"{sorted(steps)}; nothing was changed")
        t = steps.pop() if steps else 0
        if t < self.freeze_step and self._adamw is None:
            raise ValueError(f"FSDPOneBitAdam: this optimizer is past its freeze (step {self._schedule.steps}); "
                             f"a warm-up state dict (step {t}) needs a new one; nothing was changed")
        if t < self.freeze_step:
            saved = state_dict["param_groups"]
            if len(saved) != len(self.param_groups) or any(
                    len(a["params"]) != len(b["params"]) for a, b in zip(saved, self.param_groups)):
                raise ValueError("FSDPOneBitAdam: the state dict's param groups do not match this optimizer's; "
                                 "nothing was changed")
            if t > 0:
                self._adamw.load_state_dict({"state": state_dict["state"], "param_groups": saved})
            for mine, theirs in zip(self.param_groups, saved):
                for k in _HYPER:
                    if k in theirs:
                        mine[k] = theirs[k]
            self._schedule.steps = t
            self._reset_errors()
            return
        if self._adamw is not None:
            self._freeze()  # this optimizer's fp32 state entries, then loaded over
        super().load_state_dict(state_dict)
        self._schedule.steps = t
        self._reset_errors()

    def _reset_errors(self):
        for rs in self.reduce_scatters:
            rs.comm.reset_errors()

    def error_state(self) -> dict:
        """This rank's worker errors, one blob per group (per rank: save with
        torch.save beside the DCP checkpoint), for load_error_state on the
        same rank of the same world size and layout."""
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "errors": [torch.frombuffer(bytearray(rs.comm.save_errors()), dtype=torch.uint8)
                           for rs in self.reduce_scatters]}

    def load_error_state(self, state: dict) -> None:
        for key, mine in (("rank", dist.get_rank()), ("world_size", dist.get_world_size())):
            if state.get(key) != mine:
                raise ValueError(f"FSDPOneBitAdam: these errors were saved by {key} {state.get(key)}, this is "
                                 f"{key} {mine}: the worker errors are per rank; nothing was changed")
        if len(state["errors"]) != len(self.reduce_scatters):
            raise ValueError(f"FSDPOneBitAdam: {len(state['errors'])} error blobs for "
                             f"{len(self.reduce_scatters)} FSDP groups; nothing was changed")
        old = [rs.comm.save_errors() for rs in self.reduce_scatters]
        try:
            for rs, blob in zip(self.reduce_scatters, state["errors"]):
                rs.comm.load_errors(bytes(blob.numpy().tobytes()))
        except BaseException:
            for rs, blob in zip(self.reduce_scatters, old):
                rs.comm.load_errors(blob)
            raise


def _error_bytes(numel: int, fmt: str) -> int:
    if numel == 0:
        return 0
    if fmt == "fp32":
        return 4 * numel
    if fmt == "bf16":
        return 2 * numel
    return numel + 4 * (-(-numel // 256))


def _fp32_like(value, p):
    """An fp32 DTensor (p's mesh and placements) holding `value` (a
    DTensor moment from the AdamW's state, or None for an empty shard)."""
    out = torch.zeros_like(p, dtype=torch.float32)
    if value is not None:
        local = value.to_local() if _is_dtensor(value) else value
        if local.numel():
            out.to_local().copy_(local.reshape(out.to_local().shape))
    return out

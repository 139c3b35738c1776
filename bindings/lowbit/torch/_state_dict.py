"""The state dicts of the lowbit.torch optimizers (:class:`StateDicts`,
a base of LowbitOptimizer): compressed per-device lowbit checkpoints, or
torch's layout of materialised moments for DTensor params (FSDP2, DCP), and
the import of plain torch.optim state dicts; ``optimizer.state[p]``
(:class:`_StateView`)."""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Mapping

import torch

from .._ffi import Algorithm
from .._errors import StateMismatchError
from ._peer_state import bnb_param_groups, peer_kind, to_torch_layout
from ._tensors import _device_key, _is_dtensor, _local

_STATE_DICT_VERSION = 1
# Per-group options that say how this optimizer keeps its state: load_state_dict
# keeps the optimizer's own and converts the saved moments to them.
_OWN_GROUP_OPTIONS = ("state", "stochastic_rounding", "error_correction")


class StateDicts:
    """state_dict / load_state_dict of LowbitOptimizer (and what they need:
    step counts and dequantized moments by param)."""

    def _param_index(self) -> dict:
        index, i = {}, 0
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(p, i)
                i += 1
        return index

    def state_dict(self) -> dict:
        """Param groups as torch writes them, plus the lowbit state.

        Without DTensor params: one compressed checkpoint per device (a uint8
        tensor) with the indices of its params, under ``"lowbit"``; ``state``
        holds each registered param's step count.

        With DTensor params (FSDP2's ``fully_shard``, tensor parallelism) the
        state is materialised in torch's layout, so that
        ``torch.distributed.checkpoint`` can save it and load it on another
        number of ranks: ``state[i]`` holds ``"step"`` (a float32 scalar
        tensor, as torch's optimizers keep it) and the moments under torch's
        names (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) as float32
        tensors shaped like the param; for a DTensor param, a DTensor with
        the param's device mesh and placements whose local shard is this
        rank's dequantized moment. Every rank has the same entries (a rank
        whose shard of a param is empty has an empty local shard).
        :meth:`load_state_dict` re-quantizes each rank's shard into this
        optimizer's formats, whatever the sharding it was saved with."""
        index = self._param_index()
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index[p] for p in group["params"]]
            groups.append(packed)
        if self._meshes or any(_is_dtensor(p) for g in self.param_groups for p in g["params"]):
            state = {}
            for group in self.param_groups:
                for p in group["params"]:
                    if (p in self._where or p in self._empty_shards) and index[p] not in state:
                        state[index[p]] = self._materialized_state(p, group)
            return {
                "state": state,
                "param_groups": groups,
                "lowbit": {"version": _STATE_DICT_VERSION, "algorithm": self._algorithm.name.lower(),
                           "materialized": True},
            }
        state, handles = {}, []
        for key, dev in self._devices.items():
            blob = dev.handle.save("compressed")
            handles.append({
                "device": key,
                "params": [index[p] for p in dev.params],
                "checkpoint": torch.frombuffer(bytearray(blob), dtype=torch.uint8),
            })
            for pid, p in enumerate(dev.params):
                state[index[p]] = {"step": dev.handle.param_info(pid).step}
        return {
            "state": state,
            "param_groups": groups,
            "lowbit": {"version": _STATE_DICT_VERSION, "algorithm": self._algorithm.name.lower(), "handles": handles},
        }

    def torch_state_dict(self) -> dict:
        """This optimizer's state as the plain ``torch.optim`` optimizer of
        its algorithm keeps it (``torch.optim.AdamW`` / ``Adam`` / ``SGD``
        load it): moments dequantized to float32 tensors shaped like the
        params, ``step`` as a float32 scalar tensor (not for SGD), param
        groups without lowbit's own options. Lion has no torch counterpart."""
        if self._algorithm == Algorithm.LION:
            raise ValueError("torch has no Lion optimizer: there is no plain torch state dict to export to")
        index = self._param_index()
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params" and k not in _OWN_GROUP_OPTIONS}
            packed["params"] = [index[p] for p in group["params"]]
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self._where and index[p] not in state and self._num_moments(group):
                    s = self._materialized_state(p, group)
                    if self._algorithm == Algorithm.SGD:
                        s.pop("step")
                    state[index[p]] = s
        return {"state": state, "param_groups": groups}

    def _step_count(self, p) -> int:
        if p in self._empty_shards:
            return self._empty_shards[p]
        key, pid = self._lookup(p)
        return self._devices[key].handle.param_info(pid).step

    def _moment(self, p, k: int) -> torch.Tensor:
        """Moment k of a param, dequantized to float32, shaped like the param,
        on its device; a DTensor like the param for a DTensor param."""
        local = _local(p)
        if p in self._empty_shards:
            m = torch.zeros(local.shape, dtype=torch.float32, device=local.device)
        else:
            m = self.read_moment(p, k).reshape(local.shape).to(local.device)
        if local is p:
            return m
        return type(p).from_local(m, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())

    def _moment_names_for(self, group) -> tuple:
        """torch's names of the moments of a param of `group` (the first
        _num_moments(group) are kept). The class's own by default; Muon's
        hybrid groups (AdamW, Lion, SGD) name theirs as those optimizers do."""
        return self._moment_names

    def _materialized_state(self, p, group) -> dict:
        out = {"step": torch.tensor(float(self._step_count(p)), dtype=torch.float32)}
        names = self._moment_names_for(group)
        for k in range(self._num_moments(group)):
            out[names[k]] = self._moment(p, k)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict from :meth:`state_dict` (any device, any state
        format, any sharding of DTensor params: moments are converted to this
        optimizer's formats, which stay its own), a plain ``torch.optim``
        state dict of the same algorithm (fp32 moments; plain tensors or
        DTensors), or one of bitsandbytes' 8-bit optimizers (blockwise) or
        torchao's AdamW8bit / AdamW4bit / AdamWFp8 (_peer_state.py: each
        decoded by its own format's rules, then re-encoded). Into RMSprop and
        Adagrad: bitsandbytes' RMSprop8bit / Adagrad8bit (and their 32-bit
        forms), whose param groups are read in torch's names
        (_peer_state.bnb_param_groups)."""
        saved_groups = state_dict["param_groups"]
        lowbit = state_dict.get("lowbit")
        kind = None
        if lowbit is None or lowbit.get("materialized"):
            kind = peer_kind(state_dict.get("state", {}), saved_groups if lowbit is None else None)
        algorithm = self._algorithm.name.lower()
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for i, (g, sg) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError(f"param group {i}: the loaded state dict has {len(sg['params'])} params, "
                                 f"this optimizer {len(g['params'])}")
        by_index = {}
        for g, sg in zip(self.param_groups, saved_groups):
            for p, idx in zip(g["params"], sg["params"]):
                by_index[idx] = p
        state = state_dict.get("state", {})
        if kind == "torch_muon" and self._algorithm != getattr(Algorithm, "MUON", None):
            raise StateMismatchError(f"this is a torch.optim.Muon state dict; load it into lowbit.torch.Muon, "
                                     f"not {type(self).__name__}")
        if kind is not None:  # bitsandbytes, torchao, torch.optim.Muon: decoded into torch's layout
            state = to_torch_layout(state, {i: tuple(p.shape) for i, p in by_index.items()}, kind, algorithm)
        if kind == "bitsandbytes":  # its groups in torch's names (RMSprop's, Adagrad's)
            saved_groups = bnb_param_groups(algorithm, saved_groups)
        new_groups = []
        for g, sg in zip(self.param_groups, saved_groups):
            ng = dict(g)
            # Hyper-parameters come from the state dict, as with torch's
            # optimizers; how the state is kept stays this optimizer's own
            # (the library converts the saved moments into these formats).
            ng.update({k: v for k, v in sg.items() if k != "params" and k not in _OWN_GROUP_OPTIONS})
            ng["params"] = g["params"]
            self._check_group(ng)
            self._hparams(ng)  # validates
            new_groups.append(ng)

        empty = {}
        if lowbit is not None:
            if lowbit.get("version") != _STATE_DICT_VERSION:
                raise ValueError(f"lowbit state dict version {lowbit.get('version')} is not supported")
            if lowbit.get("algorithm") != self._algorithm.name.lower():
                raise StateMismatchError(f"the state dict is for {lowbit.get('algorithm')}, this optimizer is "
                                         f"{self._algorithm.name.lower()}")
        if lowbit is not None and not lowbit.get("materialized"):
            if any(_is_dtensor(p) for p in by_index.values()):
                raise ValueError("this state dict holds compressed per-device lowbit checkpoints, saved without "
                                 "DTensor params; it cannot be loaded into DTensor (sharded) params")
            plan = [([by_index[i] for i in h["params"]], _loader(bytes(h["checkpoint"].cpu().numpy().tobytes())))
                    for h in lowbit["handles"]]
        else:
            plan, empty = self._plan_torch_import(state, by_index, new_groups)

        # Build the new handles aside; swap them in only when all loaded.
        old = (self._devices, self._where, self.param_groups, self.state, self._empty_shards)
        self._devices, self._where, self._registered_params = {}, {}, None
        self.param_groups = new_groups
        self.state = LowbitState()
        self._empty_shards = {}
        try:
            for params, blob in plan:
                devices = {_device_key(_local(p).device) for p in params}
                if len(devices) > 1:
                    raise ValueError(f"params saved together on one device are now on {sorted(devices)}")
                if params and _device_key(_local(params[0]).device) in self._devices:
                    raise ValueError(f"two saved devices map onto {_device_key(_local(params[0]).device)}")
                group_of = {p: gi for gi, g in enumerate(new_groups) for p in g["params"]}
                for p in params:
                    self._register(p, group_of[p], new_groups[group_of[p]])
                if params:
                    blob(self._devices[_device_key(_local(params[0]).device)])
            for p, step in empty.items():
                self._empty_shards[p] = step
                self.state[p] = _StateView(self, p)
        except BaseException:
            for dev in self._devices.values():
                dev.handle.close()
            self._devices, self._where, self.param_groups, self.state, self._empty_shards = old
            self._registered_params = None
            raise
        for dev in old[0].values():
            dev.handle.close()
        self._meshes = self._device_meshes()
        # a loaded checkpoint replaced the handles' hyper-parameters: push ours at the next step
        for dev in self._devices.values():
            dev.pushed = [None] * len(self.param_groups)

    def _plan_torch_import(self, state: dict, by_index: dict, new_groups) -> tuple:
        """Plan for a torch-layout state dict (a plain torch.optim one, or
        lowbit's materialised one): register the params that have state, then
        hand each moment (fp32; for a DTensor param, this rank's shard) and
        step count to the library, which encodes them into this optimizer's
        formats and checks them. A param keeps the moments its group (of
        `new_groups`: this optimizer's groups with the loaded
        hyper-parameters) uses: RMSprop without momentum and not centred its
        square average alone. Returns the plan and the step counts of the
        DTensor params whose shard on this rank is empty."""
        per_device: dict = {}
        empty: dict = {}
        group_of = {}
        for g in new_groups:
            for p in g["params"]:
                group_of.setdefault(p, g)
        for idx, s in sorted(state.items(), key=lambda kv: kv[0]):
            if idx not in by_index:
                raise ValueError(f"the state dict has state for param index {idx}, which no group holds")
            if not s:
                continue
            if "max_exp_avg_sq" in s:
                raise ValueError("amsgrad state (max_exp_avg_sq) cannot be imported: lowbit has no amsgrad")
            group = group_of[by_index[idx]]
            names = self._moment_names_for(group)[:self._num_moments(group)]
            moments = [s.get(n) for n in names]
            if not names or (self._algorithm == Algorithm.SGD and moments[0] is None):
                continue  # SGD without momentum keeps no state
            missing = [n for n, m in zip(names, moments) if m is None]
            if missing:
                raise ValueError(f"state of param {idx} lacks {missing} (has {sorted(s)})")
            p = by_index[idx]
            for n, m in zip(names, moments):
                if m.numel() != p.numel():
                    raise ValueError(f"state {n} of param {idx} has {m.numel()} elements, the param {p.numel()}")
            local = _local(p)
            moments = [_local_moment(m, p, local) for m in moments]
            step = s.get("step", 1)
            step = int(step.item()) if isinstance(step, torch.Tensor) else int(step)
            if local is not p and local.numel() == 0:
                empty[p] = step
                continue
            per_device.setdefault(_device_key(local.device), []).append((p, step, moments))

        plan = []
        for entries in per_device.values():
            params = [e[0] for e in entries]

            def import_moments(dev, entries=entries):
                # The library checks each moment (its parameter, size, finite
                # values, a non-negative variance) and encodes it.
                for pid, (p, step, moments) in enumerate(entries):
                    for k, m in enumerate(moments):
                        dev.handle.write_moment(pid, k, m.detach().float().cpu().numpy())
                    dev.handle.set_step(step, pid)

            plan.append((params, import_moments))
        return plan, empty


def _local_moment(m: torch.Tensor, p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """The part of a saved moment that this rank keeps for param p: for a
    DTensor param, the moment laid out like the param (a DTensor with other
    placements or mesh is redistributed; a plain tensor is the full moment),
    then its local shard; for a plain param, the full moment."""
    if _is_dtensor(m):
        if local is p:
            return m.full_tensor()
        if m.device_mesh != p.device_mesh or tuple(m.placements) != tuple(p.placements):
            m = m.redistribute(p.device_mesh, p.placements)
        m = m.to_local()
    elif local is not p:
        from torch.distributed.tensor import Replicate

        full = m.detach().reshape(p.shape).to(device=local.device, dtype=torch.float32)
        m = type(p).from_local(full, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
        m = m.redistribute(p.device_mesh, p.placements).to_local()
    if m.numel() != local.numel():
        raise ValueError(f"a saved moment's shard has {m.numel()} elements, this rank's shard of the param "
                         f"{local.numel()}")
    return m


class LowbitState(defaultdict):
    """``optimizer.state``: a param with lowbit state keeps its view; code
    that writes another value for it (Lightning moves every optimizer's
    state to the device by rebuilding each entry) changes nothing, as the
    state lives in the library."""

    def __init__(self, *args):
        super().__init__(dict, *args)

    def __setitem__(self, p, value):
        if isinstance(self.get(p), _StateView) and not isinstance(value, _StateView):
            return
        super().__setitem__(p, value)


class _StateView(Mapping):
    """``optimizer.state[p]``: the param's step count and dequantized
    moments under torch's names, read from the library when asked (nothing
    is cached). Present for every param with lowbit state, so that code that
    tests ``optimizer.state`` (torch.distributed.checkpoint) sees it."""

    def __new__(cls, *args):
        if len(args) == 1 and isinstance(args[0], Mapping):
            # rebuilt from its items (a collection walker such as Lightning's
            # apply_to_collection): a plain snapshot, which LowbitState ignores
            return dict(args[0])
        return super().__new__(cls)

    def __init__(self, opt, p):
        self._opt = weakref.ref(opt)
        self._p = p

    def _keys(self):
        opt = self._opt()
        if opt is None:
            return ()
        group = next((g for g in opt.param_groups if any(q is self._p for q in g["params"])), None)
        if group is None:
            return ("step",)
        return ("step",) + tuple(opt._moment_names_for(group)[:opt._num_moments(group)])

    def __getitem__(self, key):
        keys = self._keys()
        if key not in keys:
            raise KeyError(key)
        opt = self._opt()
        if key == "step":
            return torch.tensor(float(opt._step_count(self._p)), dtype=torch.float32)
        return opt._moment(self._p, keys.index(key) - 1)

    def __iter__(self):
        return iter(self._keys())

    def __len__(self):
        return len(self._keys())

    def __repr__(self):
        return f"<lowbit state of a param: {', '.join(self._keys())}>"


def _loader(blob: bytes):
    """Loads a lowbit checkpoint into a device's handle."""
    return lambda dev: dev.handle.load(blob)



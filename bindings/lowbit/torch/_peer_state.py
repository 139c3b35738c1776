"""Other libraries' optimizer state dicts in torch's layout, so that a
lowbit.torch optimizer loads them (load_state_dict re-encodes the fp32
moments into its own formats). Each format is decoded by its own published
rules, without importing the library that wrote it:

* bitsandbytes' 8-bit optimizers (``Adam8bit``, ``AdamW8bit``, ``Lion8bit``,
  paged or not), blockwise: per moment k, ``statek`` holds uint8 codes on the
  map ``qmapk`` (256 values) and ``absmaxk`` one scale per block of 256
  elements, the last block partial: ceil(numel / 256) scales, whatever the
  param's size (``Optimizer1State`` / ``Optimizer2State.init_state``);
  value = qmap[code] * absmax[i // 256]. Another count of scales is refused.
  A param under bitsandbytes' ``min_8bit_size`` (default 4096) keeps float32
  ``statek`` (told by its dtype: the threshold is the peer optimizer's option).
  Since bitsandbytes 0.45 the entries sit under
  ``"__bnb_optimizer_quant_state__"``. Non-blockwise 8-bit state (a
  per-tensor ``maxk``) is refused.
* torchao's ``AdamW8bit``, ``AdamW4bit`` and ``AdamWFp8``: each moment is a
  tensor subclass with ``codes`` and one ``scale`` per block (8-bit and FP8:
  256 elements, 4-bit: 128): 8-bit: value = qmap[code] * scale; 4-bit: two
  codes per byte, the first element of a pair in the high nibble, on a
  16-value ``qmap``; FP8: codes are float8_e4m3fn, value = code * scale.
  Small params keep plain float32 tensors.

* torch's own ``torch.optim.Muon`` (kind ``"torch_muon"``, told by its
  param groups, which hold ``ns_coefficients`` and ``ns_steps``): per param a
  float32 ``momentum_buffer`` and no step count (taken as 0). Only
  lowbit.torch.Muon loads it.

Moments map to torch's names: a first moment (bitsandbytes' ``state1``,
torchao's ``exp_avg``) to ``exp_avg``, a second to ``exp_avg_sq``; for
Lion the first is lowbit's ``exp_avg`` too.

bitsandbytes' one-state RMSprop and Adagrad (``RMSprop8bit`` /
``RMSprop32bit`` / ``RMSprop``, ``Adagrad8bit`` / ``Adagrad32bit`` /
``Adagrad``; 8-bit state is always blockwise in the versions that write
``__bnb_optimizer_quant_state__``) load into lowbit.torch.RMSprop /
Adagrad: their state dict does not say which optimizer wrote it, so the
loading optimizer's algorithm tells (:func:`to_torch_layout`'s
`algorithm`). Their rules (bitsandbytes 0.50's CPU backend,
``optimizer_update_32bit`` / ``optimizer_update_8bit_blockwise``), with
``g = grad + weight_decay * p`` (L2, as torch's):

* RMSprop: ``state1 = alpha state1 + (1 - alpha) g^2``, ``p -= lr g /
  (sqrt(state1) + eps)``: torch.optim.RMSprop's without momentum and not
  centred, eps outside the sqrt as torch's. ``state1`` is torch's
  ``square_avg``; the param groups keep ``betas = (alpha, momentum)``.
  bitsandbytes refuses ``centered=True`` and ``alpha=0``, and takes a
  ``momentum`` that its rule ignores (no buffer is kept): a state dict saved
  with ``momentum != 0`` is refused here, since lowbit's RMSprop with
  momentum needs the buffer bitsandbytes never had (:func:`bnb_param_groups`).
* Adagrad: ``state1 += g^2``, ``p -= lr g / (sqrt(state1) + eps)``:
  torch.optim.Adagrad's with ``lr_decay = 0`` and
  ``initial_accumulator_value = 0``, the only values bitsandbytes takes
  (its constructor refuses others). ``state1`` is torch's ``sum``; the
  groups keep ``betas = (0, 0)``, and a group with other betas is another
  optimizer's state (Lion's, SGD's, RMSprop's) and refused.

Either keeps one state: a ``state2`` is refused, as is a ``unorm_vec``
(saved with ``max_unorm > 0``, an update-norm clip lowbit's RMSprop and
Adagrad do not have). bitsandbytes quantizes this one state on its signed
dynamic map (``qmap1``) though it is never negative; decoding is the same
``qmap[code] * absmax`` and lowbit re-encodes it on its unsigned map."""

from __future__ import annotations

import torch

_BNB_KEY = "__bnb_optimizer_quant_state__"
_BNB_BLOCK = 256  # elements per absmax of bitsandbytes' blockwise 8-bit optimizer state
_TORCHAO_TYPES = {"OptimState8bit": 8, "OptimState4bit": 4, "OptimStateFp8": "fp8"}
# torch's names of bitsandbytes' state1 (and state2), by the lowbit algorithm
# that loads them (the others: a first and a second moment, Adam's names).
_BNB_NAMES = {"rmsprop": ("square_avg",), "adagrad": ("sum",)}
_BNB_ADAM_NAMES = ("exp_avg", "exp_avg_sq")


def _blocks(scale: torch.Tensor, numel: int, block: int | None = None) -> torch.Tensor:
    """The scale of each element: one per block of `block` elements (None:
    numel / len(scale), torchao's rule: its blocks divide the param)."""
    if block is None:
        block = -(-numel // scale.numel())
    return scale.float().reshape(-1).repeat_interleave(block)[:numel]


def _shaped(values: torch.Tensor, shape) -> torch.Tensor:
    """values shaped like the loading param, or flat when their sizes differ
    (the import then names both sizes)."""
    numel = 1
    for d in shape:
        numel *= d
    return values.reshape(shape) if values.numel() == numel else values.reshape(-1)


def _bnb_moment(s: dict, k: int, idx: int, shape) -> torch.Tensor | None:
    codes = s.get(f"state{k}")
    if codes is None:
        return None
    numel = codes.numel()
    if codes.dtype == torch.float32:
        return _shaped(codes, shape)
    if codes.dtype != torch.uint8:
        raise ValueError(f"bitsandbytes state{k} of param {idx} has dtype {codes.dtype}: not a format lowbit reads")
    if f"absmax{k}" not in s:
        if f"max{k}" in s:
            raise ValueError(f"param {idx}: bitsandbytes 8-bit state without blocks (block_wise=False, a per-tensor "
                             f"max{k}) is not supported; save it from a blockwise optimizer (the default)")
        raise ValueError(f"param {idx}: bitsandbytes state{k} has codes but no absmax{k}")
    absmax = s[f"absmax{k}"]
    blocks = -(-numel // _BNB_BLOCK)
    if absmax.numel() != blocks:
        raise ValueError(f"param {idx}: bitsandbytes absmax{k} has {absmax.numel()} scales for {numel} codes; "
                         f"its 8-bit optimizers keep one per block of {_BNB_BLOCK} elements, {blocks} here (a state "
                         "dict from another writer, or truncated?)")
    qmap = s.get(f"qmap{k}")
    if qmap is None or qmap.numel() != 256:
        raise ValueError(f"param {idx}: bitsandbytes state{k} needs qmap{k}, a map of 256 values (got "
                         f"{'none' if qmap is None else qmap.numel()})")
    values = qmap.float()[codes.reshape(-1).long()] * _blocks(absmax, numel, _BNB_BLOCK)
    return _shaped(values, shape)


def _torchao_moment(v, idx: int, name: str) -> torch.Tensor:
    kind = _TORCHAO_TYPES.get(type(v).__name__)
    if kind is None:
        return v.float() if isinstance(v, torch.Tensor) else v
    codes, scale, shape = v.codes, v.scale, tuple(v.shape)
    numel = 1
    for d in shape:
        numel *= d
    if kind == "fp8":
        flat = codes.reshape(-1).float()
    elif kind == 8:
        flat = v.qmap.float()[codes.reshape(-1).long()]
    else:
        packed = codes.reshape(-1)
        pairs = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1)[:numel]
        flat = v.qmap.float()[pairs.long()]
    if flat.numel() != numel:
        raise ValueError(f"torchao {type(v).__name__} {name} of param {idx}: {flat.numel()} codes for {numel} "
                         "elements")
    return (flat * _blocks(scale, numel)).reshape(shape)


#: The param-group keys of torch.optim.Muon (none of torch's other optimizers has them).
_TORCH_MUON_GROUP_KEYS = ("ns_coefficients", "ns_steps", "adjust_lr_fn")


def is_torch_muon(param_groups) -> bool:
    """Whether param groups are torch.optim.Muon's (its own keys in every group)."""
    groups = list(param_groups or ())
    return bool(groups) and all(isinstance(g, dict) and all(k in g for k in _TORCH_MUON_GROUP_KEYS)
                                for g in groups)


def peer_kind(state: dict, param_groups=None) -> str | None:
    """Which library wrote an optimizer state (the "state" of a state dict):
    "bitsandbytes", "torchao", "torch_muon" (torch.optim.Muon, told by
    `param_groups` when given: those of a state dict without lowbit's own
    entry) or None (torch's layout, or lowbit's)."""
    if param_groups is not None and is_torch_muon(param_groups):
        return "torch_muon"
    for s in state.values():
        if not isinstance(s, dict):
            continue
        if _BNB_KEY in s or "state1" in s:
            return "bitsandbytes"
        if any(type(v).__name__ in _TORCHAO_TYPES for v in s.values()):
            return "torchao"
    return None


def _bnb_one_state_check(q: dict, idx: int, algorithm: str) -> None:
    """Refuse what bitsandbytes' RMSprop / Adagrad state of one param holds
    beyond their one state (see the module's notes)."""
    title = {"rmsprop": "RMSprop", "adagrad": "Adagrad"}[algorithm]
    if "state2" in q:
        raise ValueError(f"param {idx}: this bitsandbytes state has two moments (state1 and state2), bitsandbytes' "
                         f"{title} keeps one (state1): a state dict of another optimizer (Adam's?), not loadable "
                         f"into lowbit.torch.{title}")
    if "unorm_vec" in q:
        raise ValueError(f"param {idx}: this bitsandbytes {title} state was saved with max_unorm > 0 (it holds "
                         f"unorm_vec); lowbit's {title} has no update-norm clipping, so it cannot go on as saved")


def bnb_param_groups(algorithm: str, groups) -> list:
    """bitsandbytes' param groups in torch.optim's names for the lowbit
    algorithm that loads them (its name: "rmsprop", "adagrad"; the others'
    groups are returned as they are): RMSprop's ``betas = (alpha,
    momentum)`` become ``alpha`` (and ``momentum = 0``, ``centered =
    False``), Adagrad's ``betas = (0, 0)`` become ``lr_decay = 0`` and
    ``initial_accumulator_value = 0`` (bitsandbytes' rules: the module's
    notes). ValueError naming the group for what they cannot mean."""
    if algorithm not in _BNB_NAMES:
        return list(groups)
    out = []
    for i, g in enumerate(groups):
        betas = g.get("betas")
        if betas is None or len(betas) != 2:
            pair = "RMSprop keeps (alpha, momentum)" if algorithm == "rmsprop" else "Adagrad keeps (0, 0)"
            raise ValueError(f"param group {i} of this bitsandbytes state dict has betas={betas!r}; bitsandbytes' "
                             f"{pair} there")
        b0, b1 = (float(b) for b in betas)
        ng = {k: v for k, v in g.items() if k != "betas"}
        if algorithm == "rmsprop":
            if b0 == 0.0:
                raise ValueError(f"param group {i} has betas={tuple(betas)}: alpha = betas[0] = 0, which "
                                 "bitsandbytes' RMSprop refuses; a state dict of another optimizer (Adagrad's?)")
            if b1 != 0.0:
                raise ValueError(f"param group {i} of this bitsandbytes RMSprop state dict has momentum={b1} "
                                 "(betas[1]), which bitsandbytes' rule ignores (it keeps no momentum buffer: state1 "
                                 "is the square average alone); lowbit's RMSprop would apply it and needs that buffer. "
                                 "Set the saved groups' betas[1] to 0 to load it as the RMSprop bitsandbytes ran")
            ng.update(alpha=b0, momentum=0.0, centered=False)
        else:
            if (b0, b1) != (0.0, 0.0):
                raise ValueError(f"param group {i} has betas={tuple(betas)}; bitsandbytes' Adagrad keeps (0, 0): "
                                 "a state dict of another bitsandbytes optimizer (Lion, SGD, RMSprop?), not "
                                 "Adagrad's")
            ng.update(lr_decay=0.0, initial_accumulator_value=0.0)
        out.append(ng)
    return out


def to_torch_layout(state: dict, shapes: dict, kind: str | None = None, algorithm: str | None = None) -> dict:
    """A bitsandbytes, torchao or torch.optim.Muon optimizer state in the
    layout the lowbit.torch optimizers import: per param index, ``step`` and
    float32 ``exp_avg`` (and ``exp_avg_sq``), or Muon's ``momentum_buffer``,
    shaped like the param (``shapes[idx]``). `kind`: peer_kind's answer
    (found from `state` when not given). `algorithm`: the name of the lowbit
    algorithm that loads it (bitsandbytes' state does not say whose it is):
    "rmsprop" names bitsandbytes' state1 ``square_avg``, "adagrad" ``sum``
    (one state only); any other, or None, Adam's names."""
    kind = kind or peer_kind(state)
    bnb_names = _BNB_NAMES.get(algorithm, _BNB_ADAM_NAMES)
    out = {}
    for idx, s in state.items():
        if not s:
            out[idx] = s
            continue
        shape = shapes.get(idx)
        if kind == "torch_muon":
            buf = s.get("momentum_buffer")
            if buf is None:
                raise ValueError(f"torch.optim.Muon state of param {idx} lacks momentum_buffer (has {sorted(s)})")
            out[idx] = {"step": s.get("step", 0), "momentum_buffer": buf.float()}
        elif kind == "bitsandbytes":
            q = s.get(_BNB_KEY, s)
            if shape is None:
                raise ValueError(f"the state dict has state for param index {idx}, which no group holds")
            if algorithm in _BNB_NAMES:
                _bnb_one_state_check(q, idx, algorithm)
                if "state1" not in q:
                    raise ValueError(f"param {idx}: this bitsandbytes state lacks state1 (has {sorted(q)})")
            entry = {"step": s.get("step", q.get("step", 1))}
            for k, name in enumerate(bnb_names, start=1):
                m = _bnb_moment(q, k, idx, shape)
                if m is not None:
                    entry[name] = m
            out[idx] = entry
        else:
            out[idx] = {name: (_torchao_moment(v, idx, name) if name != "step" else v) for name, v in s.items()}
    return out

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
Lion the first is lowbit's ``exp_avg`` too."""

from __future__ import annotations

import torch

_BNB_KEY = "__bnb_optimizer_quant_state__"
_BNB_BLOCK = 256  # elements per absmax of bitsandbytes' blockwise 8-bit optimizer state
_TORCHAO_TYPES = {"OptimState8bit": 8, "OptimState4bit": 4, "OptimStateFp8": "fp8"}


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


def to_torch_layout(state: dict, shapes: dict, kind: str | None = None) -> dict:
    """A bitsandbytes, torchao or torch.optim.Muon optimizer state in the
    layout the lowbit.torch optimizers import: per param index, ``step`` and
    float32 ``exp_avg`` (and ``exp_avg_sq``), or Muon's ``momentum_buffer``,
    shaped like the param (``shapes[idx]``). `kind`: peer_kind's answer
    (found from `state` when not given)."""
    kind = kind or peer_kind(state)
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
            entry = {"step": s.get("step", q.get("step", 1))}
            for k, name in ((1, "exp_avg"), (2, "exp_avg_sq")):
                m = _bnb_moment(q, k, idx, shape)
                if m is not None:
                    entry[name] = m
            out[idx] = entry
        else:
            out[idx] = {name: (_torchao_moment(v, idx, name) if name != "step" else v) for name, v in s.items()}
    return out

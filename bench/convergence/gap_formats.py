"""The optimizers run_gap.py compares: name -> function(model) -> optimizer.
All are AdamW with the task's hyper-parameters (LR, BETAS, WEIGHT_DECAY of
the task module given as `task=`, char_lm's when none is); only the state
differs.

  fp32          torch.optim.AdamW, the reference
  bf16, 8bit, fp8   lowbit's formats, both moments
  4bit          lowbit 4-bit blocks (m signed dynamic map, v linear map without zero)
  4bit-rank1    lowbit's lpmm preset (v rank-1 normalised)
  4bit-factor   lowbit's 4-bit Factor preset (v factored)
  4bit-m        diagnosis: m 4-bit, v fp32
  4bit-v        diagnosis: m fp32, v 4-bit
  4bit-m8bit-v  m 4-bit, v 8-bit (about 1.6 B/param)
  4bit-sr       m 4BIT_SR (4-bit codes rounded stochastically), v 4-bit: the preset of issue 37
  4bit-sr-mv    both moments 4BIT_SR
  4bit-dyn      m 4-bit, v 4BIT_DYN (the unsigned dynamic 4-bit map: issue 50)
  4bit-sr-dyn   m 4BIT_SR, v 4BIT_DYN
  4bit-rank1-dyn  the lpmm preset with v's rank-1 codes on the dynamic map
  4bit-rank1-sr-dyn  m 4BIT_SR, v rank-1 on the dynamic map
  4bit-factor-sr  m 4BIT_SR, v factored (lpmm's Factor with stochastic m codes)
"""

from __future__ import annotations

import torch

import char_lm


def _torch_adamw(model, task=char_lm):
    return torch.optim.AdamW(model.parameters(), lr=task.LR, betas=task.BETAS, weight_decay=task.WEIGHT_DECAY)


def _lowbit(state, **options):
    def make(model, task=char_lm):
        import lowbit.torch as lbt
        return lbt.AdamW(model.parameters(), lr=task.LR, betas=task.BETAS, weight_decay=task.WEIGHT_DECAY,
                         state=state, num_threads=1, **options)
    return make


FORMATS = {
    "fp32": _torch_adamw,
    "bf16": _lowbit("bf16"),
    "8bit": _lowbit("8bit"),
    "fp8": _lowbit("fp8"),
    "4bit": _lowbit("4bit"),
    "4bit-rank1": _lowbit("4bit-rank1"),
    "4bit-factor": _lowbit("4bit-factor"),
    "4bit-m": _lowbit("4bit", second_state="fp32"),
    "4bit-v": _lowbit("fp32", second_state="4bit"),
    "4bit-m8bit-v": _lowbit("4bit", second_state="8bit"),
    "4bit-sr": _lowbit("4bit-sr", second_state="4bit"),
    "4bit-sr-mv": _lowbit("4bit-sr"),
    "4bit-dyn": _lowbit("4bit", second_state="4bit-dyn"),
    "4bit-sr-dyn": _lowbit("4bit-sr-dyn"),  # the preset: m 4BIT_SR, v 4BIT_DYN
    "4bit-rank1-dyn": _lowbit("4bit-rank1", second_state="4bit-dyn"),
    "4bit-rank1-sr-dyn": _lowbit("4bit-sr", second_state="4bit-dyn", second_normalization="rank1"),
    "4bit-factor-sr": _lowbit("4bit-sr", second_state="4bit", second_normalization="factored"),
}


def _sim(m_store, v_store):
    def make(model, task=char_lm):
        import sim_state
        return sim_state.SimAdamW(model.parameters(), lr=task.LR, betas=task.BETAS,
                                  weight_decay=task.WEIGHT_DECAY, m_store=m_store, v_store=v_store)
    return make


def _candidates():
    """Simulated candidates (sim_state.py): sim-v-*: m stays lowbit's 4-bit
    blocks, v is stored as named; sim-m-*: v stays lowbit's, m as named."""
    from dataclasses import replace
    import sim_state as s
    m4, v4 = s.M4, s.V4
    return {
        "sim-4bit": (m4, v4),  # the simulation of lowbit's 4bit: should land where 4bit does
        "sim-v-block32": (m4, replace(v4, block=32)),
        "sim-v-sr": (m4, replace(v4, stochastic=True)),
        "sim-v-sqrt": (m4, replace(v4, transform="sqrt")),
        "sim-v-dyn": (m4, s.Store(s.dynamic_map(3, unsigned=True), keep_positive=True)),
        # 4bit-sr's m (stochastic codes) with v on the unsigned dynamic map (issue 50, item 3)
        "sim-sr-v-dyn": (replace(m4, stochastic=True), s.Store(s.dynamic_map(3, unsigned=True), keep_positive=True)),
        "sim-v-sqrt-dyn": (m4, s.Store(s.dynamic_map(3, unsigned=True), transform="sqrt", keep_positive=True)),
        "sim-v-pow2": (m4, s.Store(s.power_map(0.5))),
        "sim-v-sqrt-pow": (m4, s.Store(s.power_map(0.7), transform="sqrt")),
        "sim-m-only": (m4, None),
        "sim-m-sr": (replace(m4, stochastic=True), v4),
        "sim-m-block64": (replace(m4, block=64), v4),
        "sim-m-block32": (replace(m4, block=32), v4),
        "sim-m-pow": (s.Store(s.signed_power_map(0.5)), v4),
        "sim-m-sr-block64": (replace(m4, stochastic=True, block=64), v4),
        "sim-mv-sr": (replace(m4, stochastic=True), replace(v4, stochastic=True)),
    }


for _name, (_m, _v) in _candidates().items():
    FORMATS[_name] = _sim(_m, _v)

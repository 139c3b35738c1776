"""The Adam family of lowbit.torch: AdamW and Adam (and their base, which
the 1-bit optimizers share)."""

from __future__ import annotations

from .._ffi import Algorithm
from ._base import LowbitOptimizer, refuse


def _betas(group):
    b1, b2 = group["betas"]
    return LowbitOptimizer._f(b1), LowbitOptimizer._f(b2)


class _AdamBase(LowbitOptimizer):
    _moment_names = ("exp_avg", "exp_avg_sq")

    _refused = ("amsgrad", "maximize")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, amsgrad=False,
                 maximize=False, bias_correction=True, **lowbit_options):
        refuse(amsgrad=amsgrad, maximize=maximize)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults, **lowbit_options)

    def _hparams(self, group):
        b1, b2 = _betas(group)
        return dict(lr=self._f(group["lr"]), beta1=b1, beta2=b2, eps=self._f(group["eps"]),
                    weight_decay=self._f(group["weight_decay"]),
                    bias_correction=bool(group.get("bias_correction", True)))


class AdamW(_AdamBase):
    """AdamW (decoupled weight decay), like torch.optim.AdamW, with lowbit state."""

    _algorithm = Algorithm.ADAMW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


class Adam(_AdamBase):
    """Adam (L2 weight decay added to the gradient), like torch.optim.Adam."""

    _algorithm = Algorithm.ADAM

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)



"""Lion and SGD of lowbit.torch."""

from __future__ import annotations

from .._ffi import Algorithm
from ._adam import _betas
from ._base import LowbitOptimizer, refuse


class Lion(LowbitOptimizer):
    """Lion (Chen et al. 2023) with decoupled weight decay: update
    sign(beta1*m + (1-beta1)*g), then m = beta2*m + (1-beta2)*g."""

    _algorithm = Algorithm.LION
    _moment_names = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **lowbit_options):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay), **lowbit_options)

    def _hparams(self, group):
        b1, b2 = _betas(group)
        return dict(lr=self._f(group["lr"]), beta1=b1, beta2=b2, weight_decay=self._f(group["weight_decay"]))


class SGD(LowbitOptimizer):
    """SGD with momentum / dampening / Nesterov and L2 weight decay, like
    torch.optim.SGD. Without momentum it keeps no state."""

    _algorithm = Algorithm.SGD
    _moment_names = ("momentum_buffer",)

    _refused = ("maximize",)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, **lowbit_options):
        refuse(maximize=maximize)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults, **lowbit_options)

    def _num_moments(self, group) -> int:
        return 1 if self._f(group["momentum"]) != 0 else 0

    def _hparams(self, group):
        return dict(lr=self._f(group["lr"]), momentum=self._f(group["momentum"]),
                    dampening=self._f(group["dampening"]), weight_decay=self._f(group["weight_decay"]),
                    nesterov=bool(group["nesterov"]))

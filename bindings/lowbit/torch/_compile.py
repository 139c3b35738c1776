"""The step of the lowbit.torch optimizers as a ``torch.library`` custom op,
``lowbit::step``, so that ``torch.compile`` traces ``opt.step()`` without a
graph break.

Inside a compiled region :meth:`LowbitOptimizer.step` only gathers the
params, their grads and the param groups' learning rates (as tensors) and
calls the op; the op is opaque to the compiler (its fake implementation does
nothing: the step writes the params in place and returns nothing) and its real
implementation, run when the compiled code runs, finds the optimizer by a key
and takes the eager step's path (registration at the first step, the
hyper-parameters, the library's step), with each group's lr read from the
tensors it was given. The bits are those of the eager step.

The op steps with the grads it is given, not the params' ``.grad``: with the
backward traced into the same graph the grads are values of the graph, and
``.grad`` is written after it. The other hyper-parameters (betas, eps, weight
decay, ...) are read from the param groups when the op runs. A backend that
functionalizes the op without putting it back in place (aot_eager) hands it
copies of the params and copies them back afterwards; inductor gives it the
params themselves (see LowbitOptimizer._step_from_op). Every argument is
checked before anything is written: a param that is neither the optimizer's
nor a copy of it (same shape, dtype, device and bits), a grad of another
shape, dtype or device, an lr that is not a finite number >= 0 raise and
change nothing (_base._op_copies, _check_op_grad, _op_lr).

Inside a CUDA graph capture the op does not read the lrs on the host: it
copies each lr tensor (on the params' device) into the library's own copy of
the group's hyper-parameters (``lowbit_optimizer_device_hparams``) on the
stream and steps with those, the step counts being on the device already, so
a captured op replays with the lr tensors' values of each replay
(LowbitOptimizer._step_captured; ``test_op_captured_in_a_cuda_graph_replays_
with_new_lrs`` captures it with ``torch.cuda.graph``). Until a GPU round has
run that test, the op keeps the ``cudagraph_unsafe`` tag: inductor's
``mode="reduce-overhead"`` runs it outside the captured partitions of its
graph (graph partition) instead of capturing it.
"""

import itertools
import weakref
from typing import Optional

import torch

# key -> the optimizer (weakly: the op's graphs must not keep it alive)
_OPTIMIZERS = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)


def register_optimizer(opt) -> int:
    """A key under which the op finds `opt` (for as long as it lives)."""
    key = next(_KEYS)
    _OPTIMIZERS[key] = opt
    return key


def _step_impl(key: int, params: list[torch.Tensor], grads: list[Optional[torch.Tensor]],
               lrs: list[torch.Tensor]) -> None:
    """One step of the lowbit.torch optimizer registered under `key`: params
    are the groups' params in order (written in place), grads theirs (None:
    the param sits this step out), lrs one 0-dim tensor per group."""
    opt = _OPTIMIZERS.get(key)
    if opt is None:
        raise RuntimeError("lowbit::step: the optimizer this compiled step was traced for no longer exists")
    with torch.no_grad():
        opt._step_from_op(params, grads, lrs)


def _define_op():
    custom_op = getattr(torch.library, "custom_op", None)  # torch >= 2.4
    if custom_op is None or not hasattr(getattr(torch, "compiler", None), "is_compiling"):
        return None
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    try:
        op = custom_op("lowbit::step", _step_impl, mutates_args=("params",), tags=(tag,) if tag else ())
    except TypeError:  # a torch without tags= here
        op = custom_op("lowbit::step", _step_impl, mutates_args=("params",))

    @op.register_fake
    def _step_fake(key, params, grads, lrs) -> None:
        return None

    return op


step_op = _define_op()

# what step() calls for the DTensor params, which the op has no sharding rule for
eager_in_compile = torch.compiler.disable if step_op is not None else (lambda f: f)

if step_op is not None:
    is_compiling = torch.compiler.is_compiling
else:
    def is_compiling() -> bool:
        """Without the op (an older torch) step() always takes the eager path."""
        return False

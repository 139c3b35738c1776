"""Drop-in ``torch.optim.Optimizer`` classes backed by lowbit.

    from lowbit.torch import AdamW
    opt = AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, state="8bit")
    for x, y in data:
        loss = loss_fn(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()

Classes: :class:`AdamW`, :class:`Adam`, :class:`Lion`, :class:`SGD`, :class:`RMSprop`,
:class:`Adagrad` (made from the library's algorithm descriptors), :class:`Muon`
(torch.optim.Muon's arguments; param groups may say ``"algorithm": "adamw"``
for the 1-D params: the usual Muon + AdamW hybrid in one optimizer; its
``ns_precision`` says how the Newton-Schulz products are rounded). Besides the
usual hyper-parameters each takes

* ``state``: how the moments are kept: ``"fp32"``, ``"bf16"``, ``"8bit"``,
  ``"4bit"`` or ``"fp8"`` (``second_state`` sets the second moment apart);
  tensors under ``min_quantized_numel`` elements (the library's default, 4096) keep fp32
  state with the quantized formats;
* ``stochastic_rounding`` / ``error_correction``: for bf16 / fp16 params,
  how the fp32 result is written back (error correction keeps one extra byte
  per element and wins if both are set);
* ``seed``, ``skip_nonfinite`` (skip the whole step if any grad holds NaN/Inf,
  default True), ``num_threads``: threads of the CPU engine (0: all OpenMP
  threads); by default the environment variable ``LOWBIT_NUM_THREADS`` when
  set, else ``torch.get_num_threads()`` read when the CPU handle is created
  (at the first step), so ``torch.set_num_threads`` before training governs
  lowbit too.

``state``, ``stochastic_rounding`` and ``error_correction`` may also be set per
param group. Param groups, ``add_param_group``, lr schedulers (``group["lr"]``
and every other hyper-parameter are read at each step), ``zero_grad``, hooks
and closures work as with torch's optimizers. ``state_dict()`` holds the
compressed lowbit state (one checkpoint blob per device, as a uint8 tensor)
and round-trips through ``torch.save``; ``load_state_dict()`` also imports a
plain ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` state dict (its fp32 moments
are converted to this optimizer's formats).

DTensor params (FSDP2's ``fully_shard``, tensor parallelism): each rank's
lowbit state is that of its local shards (``param.to_local()``, the grads'
likewise), quantized per block of the flattened local shard; a rank whose
shard of a param is empty keeps no state for it. With ``skip_nonfinite`` the
NaN/Inf check is agreed over the params' device meshes (one all_reduce per
mesh dimension and step), so every rank skips the same steps. ``state_dict()``
then holds materialised fp32 moments as DTensors with the param's mesh and
placements (torch's layout: ``step``, ``exp_avg``, ...), which
``torch.distributed.checkpoint`` saves and loads on another number of ranks;
``load_state_dict()`` re-quantizes each rank's shard into this optimizer's
formats. ``optimizer.state[p]`` reads a param's step and moments (dequantized,
on demand) in the same layout.

The step inside backward: ``lowbit.torch.step_in_backward(opt)`` steps each
param as soon as its gradient is accumulated and frees the gradient (buckets
of ``bucket_numel`` elements; ``ddp_model=`` steps each DDP bucket after its
all-reduce; FSDP2's sharded params when their reduced shard arrives), with
the bits ``opt.step()`` would give. ``opt.step()`` then raises: gradient
clipping by global norm and GradScaler cannot work in this mode.
``lowbit.jax`` has no backward hooks (JAX computes gradients as values, not
by callbacks): step after ``jax.grad`` as usual.

1-bit Adam under FSDP2: ``lowbit.torch.FSDPOneBitAdam(model, lr=...,
freeze_step=..., error_format="int8")`` takes the model after ``fully_shard``
and installs a reduce-scatter on each of its FSDP2 modules: torch's fp32 one
during the warm-up (the step: lowbit AdamW on the shards), then lowbit's
1-bit compressed reduce-scatter with worker error feedback (the step: 1-bit
Adam's frozen-variance rule on the shards). CPU / gloo, fp32, a 1-D mesh
(docs/ONEBIT_SHARDED.md section 5).

Offloaded state: ``lowbit.torch.CPUOffload(AdamW, params, state="8bit", ...)``
keeps the params on their device and the state in host memory beside a host
copy of each param; each gradient is copied to the host as it is accumulated
and its bucket is stepped there on a worker thread while backward goes on,
then copied back (``clip_grad_norm=`` clips by global norm as
``torch.nn.utils.clip_grad_norm_``; the host steps then wait for ``step()``).
The params get the bits of the plain optimizer's step and ``state_dict()`` is
the plain optimizer's. ``lowbit.torch.memory_report(opt)`` gives the bytes of
state, host copies and pinned buffers per device.

``torch.compile``: inside a compiled function ``opt.step()`` (without a
closure) is the custom op ``torch.ops.lowbit.step`` (params, their grads and
one lr tensor per group; a fake implementation for tracing), so the function
compiles as one graph with no graph break, with ``fullgraph=True`` too, and
an attached lr scheduler adds none. As with torch's compiled optimizers, give
the lr as a tensor (``lr=torch.tensor(1e-3)``): schedulers write it in place
and nothing recompiles (a float lr is specialised on: each new value
recompiles); the step counts live in the library. The compiled step gives
the eager step's bits (registration at the first step happens inside the
op). The op is tagged ``cudagraph_unsafe``: the library reads the
hyper-parameters and step counts on the host, so ``mode="reduce-overhead"``
runs it between the captured CUDA graphs. DTensor params, a step with a
closure and the 1-bit optimizers take the eager step (one graph break).

Params may live on the CPU and on CUDA devices (one lowbit handle per
device); each step runs on the current CUDA stream of its device. Params and
grads are used in place, never copied: params must be contiguous float32,
bfloat16 or float16 tensors; grads contiguous, of the same size (any of those
dtypes, e.g. bf16 grads for fp32 params). The exception: sparse
(``torch.sparse_coo``) grads, as ``nn.Embedding(sparse=True)`` gives, are
densified for the step of their param (``opt.step()``: for the step's one
library call; step_in_backward: for their bucket's) and the dense copy freed
right after; the step is the optimizer's usual step on that dense gradient
(zeros in the rows absent; decay and moments move every row), bit for bit
the dense embedding's, not ``torch.optim.SparseAdam``. ``CPUOffload`` refuses
sparse grads; under ``torch.compile`` a step with one falls back to eager
(dynamo does not take sparse tensors; ``fullgraph=True`` raises there).
"""

from __future__ import annotations

from ._adam import Adam, AdamW
from ._base import LowbitOptimizer
from ._described import DESCRIBED_CLASSES, DescribedOptimizer
from ._dist import ProcessGroupTransport, onebit_ddp_comm_hook, process_group_communicator
from ._fsdp_onebit import FSDPOneBitAdam
from ._in_backward import StepInBackward, step_in_backward
from ._lion_sgd import SGD, Lion
from ._muon import Muon
from ._offload import CPUOffload, default_host_threads, memory_report
from ._onebit import OneBitAdam, OneBitLamb, ZeroOneAdam
from ._tensors import _DeviceState  # noqa: F401  (the per-device state, for tests that watch its paths)

__all__ = ["AdamW", "Adam", "Lion", "SGD", "Muon", "DescribedOptimizer", "OneBitAdam", "ZeroOneAdam", "OneBitLamb",
           "FSDPOneBitAdam", "LowbitOptimizer",
           "process_group_communicator", "onebit_ddp_comm_hook", "ProcessGroupTransport", "step_in_backward",
           "StepInBackward", "CPUOffload", "memory_report", "default_host_threads"]

# The classes made from the library's descriptors (RMSprop, Adagrad, ...): _described.py.
globals().update(DESCRIBED_CLASSES)
__all__ += list(DESCRIBED_CLASSES)

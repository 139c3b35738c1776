"""The 1-bit scheme over torch.distributed: a lowbit Communicator whose
transport is a ProcessGroup (``all_to_all_single``, ``all_gather_into_tensor``
and ``all_reduce``), so the 1-bit optimizers run under ``torchrun`` without MPI, and
the DDP comm hook that pairs with :class:`lowbit.torch.OneBitAdam`,
:class:`lowbit.torch.ZeroOneAdam` and :class:`lowbit.torch.OneBitLamb`.

Backends: gloo moves host memory (CPU tensors); NCCL moves CUDA memory,
enqueued on the stream lowbit passes (stream-ordered). Other backends are
refused when the communicator is made, on every rank alike (every rank of a
group has the same backend), so no rank is left waiting.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._comm import Communicator
from .._ffi import ffi
from .._errors import InvalidArgumentError, InvalidStateError, UnsupportedError

_HOST_BACKENDS = ("gloo",)
_DEVICE_BACKENDS = ("nccl",)


class _CudaBytes:
    """Device memory at an address, as a uint8 array torch can wrap."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


class ProcessGroupTransport:
    """The four transport functions of :meth:`lowbit.Communicator.from_transport`
    over one ProcessGroup, and the bytes this rank sent through them
    (``bytes_sent``, by function; the counters are the transport's own:
    all-to-all and all-gather send (W-1) messages, an all-reduce is counted
    as a ring's 2 (W-1)/W of its bytes)."""

    def __init__(self, process_group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise InvalidStateError("torch.distributed is not initialized: call "
                                    "torch.distributed.init_process_group() first (torchrun sets up the rest)")
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.backend = str(dist.get_backend(self.group)).lower()
        if self.backend not in _HOST_BACKENDS + _DEVICE_BACKENDS:
            raise UnsupportedError(
                f"process_group: backend {self.backend!r} is not supported by lowbit's 1-bit transport (it needs "
                f"all_to_all_single, all_gather_into_tensor and all_reduce on host memory (gloo) or CUDA memory "
                f"(nccl)); create a gloo or nccl group with torch.distributed.new_group(backend=...)")
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.device = torch.device("cpu")
        if self.backend in _DEVICE_BACKENDS:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.bytes_sent = {"alltoall": 0, "allgather": 0, "allreduce_sum": 0, "agreement": 0}
        self.calls = {k: 0 for k in self.bytes_sent}
        # onebit_ddp_comm_hook's fp32 all-reduces of DDP buckets (counted as a ring's)
        self.hook_bytes_sent = 0
        self.hook_calls = 0

    # -- raw memory as tensors

    def _bytes(self, address: int, nbytes: int) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.frombuffer(ffi.buffer(ffi.cast("char *", address), nbytes), dtype=torch.uint8)
        return torch.as_tensor(_CudaBytes(address, nbytes), device=self.device)

    def _floats(self, address: int, n: int) -> torch.Tensor:
        return self._bytes(address, 4 * n).view(torch.float32)

    def _on(self, stream: int):
        if self.device.type == "cuda" and stream:
            return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=self.device))
        return _Nothing()

    # -- the transport functions

    def alltoall(self, send: int, recv: int, m: int, stream: int) -> None:
        W = self.world_size
        with self._on(stream):
            dist.all_to_all_single(self._bytes(recv, W * m), self._bytes(send, W * m), group=self.group)
        self.calls["alltoall"] += 1
        self.bytes_sent["alltoall"] += (W - 1) * m

    def allgather(self, send: int, recv: int, m: int, stream: int) -> None:
        W = self.world_size
        with self._on(stream):
            dist.all_gather_into_tensor(self._bytes(recv, W * m), self._bytes(send, m), group=self.group)
        self.calls["allgather"] += 1
        self.bytes_sent["allgather"] += (W - 1) * m

    def allreduce_sum(self, data: int, n: int, stream: int) -> None:
        with self._on(stream):
            dist.all_reduce(self._floats(data, n), op=dist.ReduceOp.SUM, group=self.group)
        self.calls["allreduce_sum"] += 1
        self.bytes_sent["allreduce_sum"] += 2 * (self.world_size - 1) * 4 * n // self.world_size

    def allreduce_max(self, values: int, k: int) -> None:
        # The argument agreement: host int64s; NCCL reduces them on the device.
        host = torch.frombuffer(ffi.buffer(ffi.cast("char *", values), 8 * k), dtype=torch.int64)
        if self.device.type == "cpu":
            dist.all_reduce(host, op=dist.ReduceOp.MAX, group=self.group)
        else:
            d = host.to(self.device)
            dist.all_reduce(d, op=dist.ReduceOp.MAX, group=self.group)
            host.copy_(d.cpu())
        self.calls["agreement"] += 1
        self.bytes_sent["agreement"] += 2 * (self.world_size - 1) * 8 * k // self.world_size

    def count_hook_allreduce(self, nbytes: int) -> None:
        """Counts an all-reduce of `nbytes` made beside the transport (the DDP
        comm hook's), as a ring's 2 (W-1)/W of its bytes."""
        self.hook_calls += 1
        self.hook_bytes_sent += 2 * (self.world_size - 1) * int(nbytes) // self.world_size

    def total_bytes_sent(self) -> int:
        """The bytes this rank sent through the transport functions (the
        optimizer's own exchanges and agreements)."""
        return sum(self.bytes_sent.values())

    def wire_bytes_sent(self) -> int:
        """All the bytes this rank sent for the optimizer: the transport's and
        the DDP comm hook's all-reduces."""
        return self.total_bytes_sent() + self.hook_bytes_sent

    def reset_counters(self) -> None:
        for k in self.bytes_sent:
            self.bytes_sent[k] = 0
            self.calls[k] = 0
        self.hook_bytes_sent = 0
        self.hook_calls = 0


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def process_group_communicator(process_group=None, error_format=None) -> Communicator:
    """A lowbit Communicator over a torch.distributed ProcessGroup (default:
    the world group). Not collective. Its transport, with its byte counters,
    is ``comm.transport``. ``error_format``: how it keeps its worker and
    server errors, ``"fp32"`` (default), ``"bf16"`` or ``"int8"`` (CPU
    tensors only)."""
    t = ProcessGroupTransport(process_group)
    cuda = t.device.type == "cuda"
    comm = Communicator.from_transport(
        rank=t.rank, world_size=t.world_size, alltoall=t.alltoall, allgather=t.allgather,
        allreduce_sum=t.allreduce_sum, allreduce_max=t.allreduce_max, host_buffers=not cuda,
        device_buffers=cuda, stream_ordered=cuda, device_index=t.device.index if cuda else -1,
        error_format=error_format)
    comm.transport = t
    return comm


def onebit_ddp_comm_hook(optimizer):
    """The DDP comm hook that pairs with the 1-bit optimizers of
    :mod:`lowbit.torch` (:class:`~lowbit.torch.OneBitAdam`,
    :class:`~lowbit.torch.ZeroOneAdam`, :class:`~lowbit.torch.OneBitLamb`):
    ``model.register_comm_hook(None, lowbit.torch.onebit_ddp_comm_hook(opt))``.

    For each bucket it asks the optimizer whether its next step runs on
    gradients averaged uncompressed (``onebit_status().next_full_average``;
    the library is asked once per step): 1-bit Adam's and 1-bit LAMB's
    warm-up, 0/1 Adam's variance steps. Then DDP averages the bucket with its
    usual fp32 all-reduce, overlapped with backward, and the optimizer's step
    runs on it without averaging it again (only a 128-byte argument
    agreement). Otherwise the hook leaves the gradients local, with no
    communication: the optimizer's own exchange (1-bit compressed momentum,
    gradient or update, or none on 0/1 Adam's local steps) replaces DDP's
    all-reduce. The bytes of the hook's all-reduces are counted on the
    optimizer's transport (``hook_bytes_sent``). Use the optimizer's process
    group for DDP too (every rank of it must run the hook)."""
    if not callable(getattr(optimizer, "_next_full_average", None)) or \
            not callable(getattr(optimizer, "_warmup_averaged_by", None)):
        raise InvalidArgumentError(f"optimizer {type(optimizer).__name__} is not a lowbit.torch OneBitAdam, "
                                   "ZeroOneAdam or OneBitLamb")
    optimizer._warmup_averaged_by(True)
    group = optimizer._process_group
    transport = getattr(optimizer.communicator, "transport", None)
    world = dist.get_world_size(group)

    def hook(state, bucket):
        buf = bucket.buffer()
        if optimizer._next_full_average():
            if isinstance(transport, ProcessGroupTransport):
                transport.count_hook_allreduce(buf.numel() * buf.element_size())
            work = dist.all_reduce(buf.div_(world), group=group, async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return hook


def average_bucket_then(bucket, consume):
    """The body of a DDP comm hook that steps after the reduction: averages
    the bucket over the ranks (all_reduce of its flat buffer divided by the
    world size, as DDP's default hook), then calls consume(params, grads)
    with the bucket's params and their reduced gradients (views into the
    buffer). Returns the future DDP waits for (step_in_backward, CPUOffload)."""
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    params, grads = bucket.parameters(), bucket.gradients()

    def then(f):
        out = f.value()[0]
        consume(params, grads)
        return out

    return dist.all_reduce(buf, async_op=True).get_future().then(then)

"""The 1-bit scheme over torch.distributed: a lowbit Communicator whose
transport is a ProcessGroup (``all_to_all_single``, ``all_gather_into_tensor``
and ``all_reduce``), so 1-bit Adam runs under ``torchrun`` without MPI, and
the DDP comm hook that pairs with :class:`lowbit.torch.OneBitAdam`.

Backends: gloo moves host memory (CPU tensors); NCCL moves CUDA memory,
enqueued on the stream lowbit passes (stream-ordered). Other backends are
refused when the communicator is made, on every rank alike (every rank of a
group has the same backend), so no rank is left waiting.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._comm import Communicator
from ._ffi import ffi
from ._lib import InvalidArgumentError, InvalidStateError, UnsupportedError

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

    def total_bytes_sent(self) -> int:
        return sum(self.bytes_sent.values())

    def reset_counters(self) -> None:
        for k in self.bytes_sent:
            self.bytes_sent[k] = 0
            self.calls[k] = 0


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def process_group_communicator(process_group=None) -> Communicator:
    """A lowbit Communicator over a torch.distributed ProcessGroup (default:
    the world group). Not collective. Its transport, with its byte counters,
    is ``comm.transport``."""
    t = ProcessGroupTransport(process_group)
    cuda = t.device.type == "cuda"
    comm = Communicator.from_transport(
        rank=t.rank, world_size=t.world_size, alltoall=t.alltoall, allgather=t.allgather,
        allreduce_sum=t.allreduce_sum, allreduce_max=t.allreduce_max, host_buffers=not cuda,
        device_buffers=cuda, stream_ordered=cuda, device_index=t.device.index if cuda else -1)
    comm.transport = t
    return comm


def onebit_ddp_comm_hook(optimizer):
    """The DDP comm hook that pairs with :class:`lowbit.torch.OneBitAdam`:
    ``model.register_comm_hook(None, lowbit.torch.onebit_ddp_comm_hook(opt))``.

    During warm-up (the optimizer has taken fewer than freeze_step steps) DDP
    averages the gradients with its usual fp32 all-reduce, overlapped with
    backward, and the optimizer's warm-up steps run on them without
    communicating (only a 128-byte argument agreement). After the freeze the
    hook leaves the gradients local: the optimizer's 1-bit compressed
    momentum exchange replaces DDP's all-reduce. Use the optimizer's process
    group for DDP too (every rank of it must run the hook)."""
    if not hasattr(optimizer, "freeze_step") or not hasattr(optimizer, "_warmup_averaged_by"):
        raise InvalidArgumentError(f"optimizer {type(optimizer).__name__} is not a lowbit.torch.OneBitAdam")
    optimizer._warmup_averaged_by(True)
    group = optimizer._process_group

    def hook(state, bucket):
        buf = bucket.buffer()
        if optimizer.steps_taken() < optimizer.freeze_step:
            world = dist.get_world_size(group)
            work = dist.all_reduce(buf.div_(world), group=group, async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return hook

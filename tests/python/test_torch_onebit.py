"""lowbit.torch.OneBitAdam over torch.distributed (gloo, CPU) under torchrun,
with DDP and lowbit.torch.onebit_ddp_comm_hook: training against DDP +
torch.optim.Adam, parameters identical on every rank, resume, bad sizes and
non-finite gradients on one rank (torch_onebit_worker.py does the work;
every launch is bounded by a timeout). Where a GPU is, the training and the
resume also on CUDA params over NCCL (bench/gpu/device_checks.sh runs it).

The training comparisons and the 3-rank variants are marked exhaustive
(scripts/test.sh runs them with --all; its fast set has every case at 2 ranks
but the training run)."""
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
from torchrun_launch import launch as _launch  # noqa: E402

WORKER = Path(__file__).with_name("torch_onebit_worker.py")
TIMEOUT = 180
# 2 ranks, and 3 under the exhaustive marker
RANKS = [2, pytest.param(3, marks=pytest.mark.exhaustive)]


def launch(nproc, case, seed):
    return _launch(WORKER, nproc, case, seed, TIMEOUT)


# The short cases share one launch per world size (each launch costs about 6 s
# of torchrun and torch imports); the training comparison has its own.
SHARED_CASES = {2: "resume,nonfinite,bad_sizes,local_error,error_formats", 3: "bad_sizes,local_error"}
_shared = {}


def result(nproc, case, seed):
    """`case`'s results from the shared launch at `nproc` ranks (run once, by
    the first test that asks; a failed launch fails the others without
    running again)."""
    key = (nproc, seed)
    if key not in _shared:
        try:
            _shared[key] = launch(nproc, SHARED_CASES[nproc], seed)
        except BaseException as e:  # pytest.fail() included
            _shared[key] = e
            raise
    if isinstance(_shared[key], BaseException):
        pytest.fail(f"the launch of {SHARED_CASES[nproc]} on {nproc} ranks failed (see the first of its tests)")
    return _shared[key][case]


@pytest.mark.exhaustive
@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_onebit_adam_trains_like_adam(nproc, seed):
    out = launch(nproc, "train", seed)
    print(json.dumps(out, indent=1))
    assert out["adam_same"] and out["onebit_same"], "params differ between ranks"
    # within 2% of DDP + Adam's final loss (1-bit Adam: warm-up is AdamW on the
    # averaged gradient with both bias corrections; after the freeze the
    # variance stays frozen and the momentum is 1-bit compressed with error
    # feedback)
    assert abs(out["onebit_loss"] - out["adam_loss"]) <= 0.02 * out["adam_loss"], out
    # bytes on the wire per step, from the transport's own counters
    # warm-up: DDP's own fp32 all-reduce (the hook) moves the gradients; the
    # optimizer's transport carries only its 128-byte argument agreement
    assert out["warmup_bytes_per_step"] <= 2 * 128, out
    assert out["compressed_bytes_per_step"] * 10 < out["ddp_fp32_bytes_per_step"], out


@pytest.mark.parametrize("nproc", [2])
def test_onebit_adam_resume_is_bit_identical(nproc, seed):
    out = result(nproc, "resume", seed)
    assert all(v for k, v in out.items() if k.startswith("resume_equal")), out


@pytest.mark.parametrize("nproc", [2])
def test_error_formats_train_resume_and_refuse(nproc, seed):
    """error_format="bf16" / "int8" (issue 48, item 3) on OneBitAdam,
    ZeroOneAdam and OneBitLamb: the same params on every rank, the blob in
    the format's bytes, resume bit for bit, another format's state dict and
    bad formats refused with nothing changed."""
    out = result(nproc, "error_formats", seed)
    for key, row in out.items():
        if key == "refusals":
            assert all(row.values()), row
            continue
        assert row["same"] and row["loss_finite"] and row["blob_bytes_ok"], (key, row)
        assert row["format"] == key.split("/")[0], (key, row)
        assert row["resume_equal"], (key, row)
        assert row["other_format_refused"] and row["other_unchanged"], (key, row)


@pytest.mark.parametrize("nproc", RANKS)
def test_mismatched_sizes_fail_on_every_rank(nproc, seed):
    out = result(nproc, "bad_sizes", seed)
    assert all(e is not None and "numel" in e for e in out["errors"]), out["errors"]
    assert all(out["unchanged"]), out


@pytest.mark.parametrize("nproc", [2])
def test_nan_on_one_rank_skips_on_every_rank(nproc, seed):
    out = result(nproc, "nonfinite", seed)
    assert out["same"] and out["finite"], out
    assert all(all(f) and len(f) == 2 for f in out["skipped_unchanged"]), out
    steps = set(out["steps"])
    assert steps == {out["freeze_step"] + 5 - 2}, out  # freeze_step + 5 steps, two of them skipped


@pytest.mark.parametrize("nproc", RANKS)
def test_local_error_on_one_rank_fails_every_rank_at_once(nproc, seed):
    """OneBitAdam, ZeroOneAdam, OneBitLamb: an error raised by lowbit.torch
    on the last rank before the library's step (a NaN lr, a param whose
    .data was replaced) makes every rank fail that step at once, with that
    rank's reason, nothing changed, instead of leaving the others waiting
    for the process group's timeout (60 s in the worker, 30 min by default)."""
    out = {k: v for k, v in result(nproc, "local_error", seed).items() if "/" in k}
    reasons = {"nan_lr": "lr = nan", "moved_param": "moved in memory"}
    assert len(out) == 6, out
    for key, rows in out.items():
        reason = reasons[key.split("/")[1]]
        assert len(rows) == nproc, (key, rows)
        for rank, row in enumerate(rows):
            err = row["error"]
            assert err is not None and reason in err, (key, rank, row)
            if rank != nproc - 1:
                assert f"rank {nproc - 1} failed before its step" in err, (key, rank, row)
            assert row["seconds"] < 20, (key, rank, row)  # at once: no waiting for a timeout
            assert row["unchanged"], (key, rank, row)
            assert row["recovered"] in (None, True), (key, rank, row)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
def test_ddp_onebit_adam_on_cuda_over_nccl(seed):
    """The training comparison and the resume on CUDA params over NCCL, one
    rank per GPU (at most 2; one on a single-GPU machine, where only the
    transport's and the engine's CUDA paths are exercised: NCCL takes one rank
    per device)."""
    nproc = min(2, torch.cuda.device_count())
    out = _launch(WORKER, nproc, "train,resume", seed, TIMEOUT, env={"LOWBIT_TORCHRUN_DEVICE": "cuda"})
    train, resume = out["train"], out["resume"]
    print(json.dumps(out, indent=1))
    assert train["adam_same"] and train["onebit_same"], "params differ between ranks"
    assert abs(train["onebit_loss"] - train["adam_loss"]) <= 0.02 * train["adam_loss"], train
    if nproc > 1:
        assert train["compressed_bytes_per_step"] * 10 < train["ddp_fp32_bytes_per_step"], train
    assert all(v for k, v in resume.items() if k.startswith("resume_equal")), resume


def test_transport_refuses_other_backends(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "ucc")
    monkeypatch.setattr(dist, "group", type("G", (), {"WORLD": object()}))
    with pytest.raises(lowbit.UnsupportedError, match="backend 'ucc'"):
        lt.ProcessGroupTransport()


def test_transport_needs_an_initialized_group(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(lowbit.InvalidStateError, match="init_process_group"):
        lt.OneBitAdam([torch.nn.Parameter(torch.zeros(3))])


def test_stages_from_python_match_the_built_in_scheme():
    """One rank: the stages with the messages passed by hand give the bits of
    a callback communicator's compressed allreduce."""
    import numpy as np

    def copy(send, recv, m, stream):
        lowbit._ffi.ffi.memmove(lowbit._ffi.ffi.cast("char*", recv), lowbit._ffi.ffi.cast("char*", send), m)

    def noop_sum(data, n, stream):
        pass

    a = lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=copy, allgather=copy,
                                           allreduce_sum=noop_sum)
    b = lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=copy, allgather=copy,
                                           allreduce_sum=noop_sum)
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.standard_normal(1001).astype(np.float32)
        y = x.copy()
        a.compressed_allreduce(x)
        m = b.stage_message_bytes(y.size)
        send, gsend = np.zeros(m, np.uint8), np.zeros(m, np.uint8)
        b.stage_compress(y, send)
        b.stage_reduce(send, gsend)  # world 1: the all-to-all and all-gather are copies
        b.stage_decode(gsend, y)
        assert np.array_equal(x, y)
        assert a.save_errors() == b.save_errors()
    with pytest.raises(lowbit.InvalidStateError, match="stage_compress"):
        b.stage_reduce(send, gsend)

    def broken(send, recv, m, stream):
        raise ConnectionError("link down")

    c = lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=broken, allgather=copy,
                                           allreduce_sum=noop_sum)
    x = np.ones(64, np.float32)
    with pytest.raises(lowbit.LowbitError, match="transport.alltoall") as info:
        c.compressed_allreduce(x)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert np.all(x == 1)
    for comm in (a, b, c):
        comm.close()

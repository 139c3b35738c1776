"""The Python handles (lowbit.Optimizer, lowbit.Communicator) against hostile
use (issue 32): arrays whose memory moves after registration, threads
sharing one handle, closed handles, integers beyond the C types, and the
agreement that lets a rank that failed before its 1-bit step fail the others.
scripts/test_asan.sh runs these under the sanitizer build too."""
import ctypes
import threading

import numpy as np
import pytest

import lowbit

# ----------------------------------------------------------------- memory that moves (defect 1)


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("move", ["data", "resize_grow", "resize_shrink"])
def test_a_param_whose_torch_storage_moved_is_refused(move):
    torch = _torch()
    p = torch.ones(5000)
    g = torch.full((5000,), 0.5)
    opt = lowbit.Optimizer("adamw", lr=0.1)
    opt.add_param(p, g)  # through DLPack
    assert opt.step()
    if move == "data":
        p.data = torch.full((5000,), 2.0)  # new storage; the registered one would be freed
    elif move == "resize_grow":
        p.resize_(50000)  # reallocated
    else:
        p.resize_(100)  # same memory, fewer elements than registered
    after = p.clone()
    with pytest.raises(lowbit.InvalidStateError, match=r"param 0 no longer holds the memory registered"):
        opt.step()
    # nothing written: the bits (resize_grow's new elements are uninitialised
    # memory, which may hold NaNs, so a float compare would fail on them)
    assert torch.equal(p.view(torch.int32), after.view(torch.int32))
    assert opt.param_info(0).step == 1
    opt.close()


def test_a_grad_whose_torch_storage_moved_is_refused():
    torch = _torch()
    p = torch.ones(3000)
    g = torch.full((3000,), 0.5)
    opt = lowbit.Optimizer("sgd", lr=0.1)
    opt.add_param(p, g)
    g.data = torch.zeros(3000)
    with pytest.raises(lowbit.InvalidStateError, match=r"grad of param 0 no longer holds the memory"):
        opt.step()
    assert torch.equal(p, torch.ones(3000))
    opt.set_grad(0, g)  # registered again: steps
    assert opt.step() and torch.equal(p, torch.ones(3000))  # a zero grad, SGD without decay
    opt.close()


def test_the_registered_torch_storage_stays_alive():
    torch = _torch()
    p = torch.ones(4096)
    opt = lowbit.Optimizer("sgd", lr=1.0)
    opt.add_param(p, torch.ones(4096))
    storage = p.untyped_storage()
    address = storage.data_ptr()
    p.data = torch.zeros(10)
    del storage
    import gc

    gc.collect()
    # the optimizer holds the registered storage: still the same memory, still ones
    held = [x for x in opt._params[0].owner if isinstance(x, torch.UntypedStorage)]
    assert held and held[0].data_ptr() == address
    assert torch.equal(torch.empty(0).set_(held[0], 0, (4096,)), torch.ones(4096))
    opt.close()


# ----------------------------------------------------------------- threads (defect 5)


def _optimizer(seed, n=300_000):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    opt = lowbit.Optimizer("adamw", lr=1e-3, state="8bit", num_threads=1)
    opt.add_param(w, g)
    return opt, w


def test_threads_stepping_one_optimizer_are_serialised(seed):
    ref, w_ref = _optimizer(seed)
    for _ in range(40):
        ref.step()
    opt, w = _optimizer(seed)
    start = threading.Barrier(4)
    errors = []

    def work():
        try:
            start.wait()
            for _ in range(10):
                opt.step()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert opt.param_info(0).step == 40
    assert np.array_equal(w, w_ref)
    assert np.array_equal(opt.read_moment(0, 0), ref.read_moment(0, 0))
    assert np.array_equal(opt.read_moment(0, 1), ref.read_moment(0, 1))
    ref.close()
    opt.close()


def test_threads_stepping_one_torch_optimizer_are_serialised(seed):
    torch = _torch()
    import lowbit.torch as lt

    def make():
        gen = torch.Generator().manual_seed(seed)
        params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (400_000, 5000, 300)]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        return params, lt.AdamW(params, lr=1e-3, state="8bit", num_threads=1)

    ref_params, ref = make()
    for _ in range(40):
        ref.step()
    params, opt = make()
    start = threading.Barrier(4)

    def work():
        start.wait()
        for _ in range(10):
            opt.step()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(opt.param_info(p).step == 40 for p in params)
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))


def test_threads_mixing_calls_on_one_optimizer_see_whole_calls(seed):
    """A save made while other threads step is a checkpoint of some step
    count, and loads back (never a torn state)."""
    opt, w = _optimizer(seed, n=50_000)
    stop = threading.Event()

    def stepping():
        while not stop.is_set():
            opt.step()

    t = threading.Thread(target=stepping)
    t.start()
    try:
        blobs = [opt.save() for _ in range(5)]
    finally:
        stop.set()
        t.join()
    for blob in blobs:
        opt.load(blob)
    opt.close()


# ----------------------------------------------------------------- clear errors (defect 10)


def test_a_closed_optimizer_says_so():
    opt = lowbit.Optimizer("adamw")
    opt.add_param(np.zeros(10, np.float32))
    opt.close()
    for call in (lambda: opt.read_moment(0), lambda: opt.write_moment(0, 0, np.zeros(10)), lambda: opt.param(0),
                 lambda: opt.set_step(3, 0), lambda: opt.param_info(0)):
        with pytest.raises(lowbit.InvalidStateError, match="the optimizer is closed"):
            call()


def test_integers_beyond_the_c_types_name_the_argument():
    opt = lowbit.Optimizer("adamw")
    opt.add_param(np.zeros(10, np.float32))
    cases = [
        ("step", lambda: opt.set_step(2**64)),
        ("param_id", lambda: opt.read_moment(2**63)),
        ("param_id", lambda: opt.param_info(-2**70)),
        ("moment", lambda: opt.write_moment(0, 2**40, np.zeros(10))),
        ("group", lambda: opt.set_lr(0.1, group=2**31)),
        ("group", lambda: opt.get_hparams(2**31)),
        ("param_id", lambda: opt.set_momentum_mask(2**63, None)),
        ("param_id", lambda: opt.state_bytes(2**63)),
        ("min_quantized_numel", lambda: lowbit.Optimizer("adamw", min_quantized_numel=2**63)),
        ("freeze_step", lambda: lowbit.Optimizer("onebit_adam", freeze_step=-2**63 - 1)),
        ("device_index", lambda: lowbit.Optimizer("adamw", device_index=2**31)),
        ("seed", lambda: lowbit.Optimizer("adamw", seed=2**64)),
        ("shape", lambda: opt.add_param(np.zeros(10, np.float32), shape=(2**63, 1))),
        ("rank", lambda: lowbit.Communicator.from_transport(rank=2**31, world_size=1, alltoall=print,
                                                             allgather=print, allreduce_sum=print)),
    ]
    for arg, call in cases:
        with pytest.raises(lowbit.InvalidArgumentError, match=rf"\b{arg}=-?\d+ does not fit the library's"):
            call()
    with lowbit.Optimizer("zeroone_adam") as z:
        with pytest.raises(lowbit.InvalidArgumentError, match=r"var_update_scaler=\d+ does not fit"):
            z.set_onebit_options(var_update_scaler=2**63)
    assert opt.param_info(0).step == 0 and opt.num_params == 1  # nothing changed
    opt.close()


@pytest.mark.parametrize("step", [1.5, "3", None, True, float("nan")])
def test_set_step_refuses_what_is_not_an_integer(step):
    opt = lowbit.Optimizer("adamw")
    opt.add_param(np.zeros(10, np.float32))
    with pytest.raises(lowbit.InvalidArgumentError, match=r"step=.* is not an integer"):
        opt.set_step(step)
    assert opt.param_info(0).step == 0
    opt.set_step(4.0)  # an integral value is an integer
    assert opt.param_info(0).step == 4
    opt.close()


def test_the_handles_give_their_last_error():
    opt = lowbit.Optimizer("adamw")
    assert opt.last_error() == ""
    with pytest.raises(lowbit.InvalidArgumentError):
        opt.set_hparams(0, lr=float("nan"))
    assert "lr" in opt.last_error()
    opt.close()
    assert opt.last_error() == ""


# ----------------------------------------------------------------- failing before a 1-bit step (defect 2)


def _agreeing_communicator(calls):
    """One rank over Python functions, with the argument agreement."""

    def copy(send, recv, m, stream):
        ctypes.memmove(recv, send, m)

    def agree(values, k):  # one rank: the maximum is its own
        calls.append(k)

    return lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=copy, allgather=copy,
                                              allreduce_sum=lambda data, n, stream: None, allreduce_max=agree)


@pytest.mark.parametrize("algorithm", ["onebit_adam", "zeroone_adam", "onebit_lamb"])
def test_a_rank_that_failed_before_its_step_fails_the_agreement(algorithm):
    """The mechanism behind lowbit.torch's 1-bit optimizers (the torchrun
    test checks it across ranks): a rank whose own checks failed joins its
    step's agreement with its reason, and the step fails with it, nothing
    changed; the next step runs."""
    calls = []
    comm = _agreeing_communicator(calls)
    w = np.linspace(-1, 1, 500, dtype=np.float32)
    g = np.full_like(w, 0.25)
    opt = lowbit.Optimizer(algorithm, lr=1e-2, freeze_step=5)
    opt.add_param(w, g)
    opt.set_comm(comm)
    assert opt.step()
    before, status = w.copy(), opt.onebit_status()
    comm._clear_transport_errors()
    with comm._failing("RuntimeError: param 0 moved"):
        err = opt._join_failed_step()
    assert isinstance(err, lowbit.CommunicationError)
    peer = comm._transport_failure(err)
    assert isinstance(peer, lowbit.InvalidArgumentError)
    assert "rank 0 failed before its step: RuntimeError: param 0 moved" in str(peer)
    assert np.array_equal(w, before) and opt.onebit_status() == status
    assert calls  # the failure went through the transport's agreement
    assert opt.step() and opt.onebit_status().step == status.step + 1
    opt.close()
    comm.close()

"""lowbit.torch.step_in_backward: the step inside backward gives each param
the bits of opt.step() after backward, with param groups, an lr scheduler,
buckets of any size, a torch.compile'd model and DDP (2 ranks under
torchrun), frees the gradients, and refuses what cannot work (opt.step(),
so GradScaler; the 1-bit optimizers). lowbit.Optimizer.step_params: the C
subset step from Python."""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from torchrun_launch import launch  # noqa: E402


def _model(seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                            torch.nn.Linear(64, 5))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m


def _batches(seed, n):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(32, 24, generator=g), torch.randint(0, 5, (32,), generator=g)) for _ in range(n)]


def _groups(m):
    ps = list(m.parameters())
    return [{"params": ps[:4]}, {"params": ps[4:], "lr": 3e-3, "weight_decay": 0.0}]


def _make(cls, m, kwargs):
    opt = cls(_groups(m), lr=1e-2, **kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return opt, sched


CASES = [
    (lt.AdamW, dict(state="8bit", min_quantized_numel=0)),
    (lt.AdamW, dict(state="4bit-sr", min_quantized_numel=0)),
    (lt.AdamW, dict(state="4bit-rank1", min_quantized_numel=0)),
    (lt.Lion, dict(state="4bit", min_quantized_numel=0)),
    (lt.SGD, dict(momentum=0.9, state="bf16")),
]


@pytest.mark.parametrize("bucket_numel", [0, 2000, 1 << 30])
@pytest.mark.parametrize("cls,kwargs", CASES, ids=[f"{c.__name__}-{k['state']}" for c, k in CASES])
def test_in_backward_equals_step_after_backward(cls, kwargs, bucket_numel, seed):
    ref_model, model = _model(seed), _model(seed)
    ref, ref_sched = _make(cls, ref_model, kwargs)
    opt, sched = _make(cls, model, kwargs)
    hooks = lt.step_in_backward(opt, bucket_numel=bucket_numel)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in _batches(seed, 6):
        loss_fn(ref_model(x), y).backward()
        ref.step()
        ref.zero_grad()
        ref_sched.step()
        loss_fn(model(x), y).backward()
        assert all(p.grad is None for p in model.parameters()), "the gradients were not freed"
        sched.step()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert ref.param_info(a).step == opt.param_info(b).step == 6
    hooks.remove()
    loss_fn(model(x), y).backward()  # after remove(): gradients stay, opt.step() works again
    assert all(p.grad is not None for p in model.parameters())
    opt.step()


def test_in_backward_with_a_compiled_model(seed):
    pytest.importorskip("torch._dynamo")
    ref_model, model = _model(seed), _model(seed)
    ref, _ = _make(lt.AdamW, ref_model, dict(state="8bit", min_quantized_numel=0))
    opt, _ = _make(lt.AdamW, model, dict(state="8bit", min_quantized_numel=0))
    lt.step_in_backward(opt, bucket_numel=0)
    cref, cmodel = torch.compile(ref_model, backend="aot_eager"), torch.compile(model, backend="aot_eager")
    for x, y in _batches(seed, 3):
        torch.nn.functional.cross_entropy(cref(x), y).backward()
        ref.step()
        ref.zero_grad()
        torch.nn.functional.cross_entropy(cmodel(x), y).backward()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_a_nonfinite_gradient_skips_its_bucket_only(seed):
    model = _model(seed)
    opt, _ = _make(lt.AdamW, model, dict(state="8bit", min_quantized_numel=0))
    hooks = lt.step_in_backward(opt, bucket_numel=0)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batches(seed, 1)[0]
    out = model(x)
    last = list(model.parameters())[-2]  # the last Linear's weight: its hook sees a NaN
    last.register_hook(lambda g: g * float("nan"))
    torch.nn.functional.cross_entropy(out, y).backward()
    assert hooks.last_step_skipped
    after = list(model.parameters())
    assert torch.equal(after[-2], before[-2])
    assert not torch.equal(after[0], before[0])
    assert opt.param_info(after[0]).step == 1


def test_step_and_grad_scaler_are_refused(seed):
    model = _model(seed)
    opt, _ = _make(lt.AdamW, model, dict(state="8bit"))
    lt.step_in_backward(opt)
    x, y = _batches(seed, 1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="steps inside backward.*gradient clipping by global norm and GradScaler"):
        opt.step()
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
    with pytest.raises(RuntimeError, match="steps inside backward.*GradScaler"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="already steps inside backward"):
        lt.step_in_backward(opt)
    with pytest.raises(TypeError, match="lowbit.torch optimizer"):
        lt.step_in_backward(torch.optim.AdamW(model.parameters()))
    with pytest.raises(TypeError, match="1-bit optimizers"):
        lt.step_in_backward(lt.OneBitAdam.__new__(lt.OneBitAdam))  # refused before anything is read


def test_numpy_step_params_equals_full_steps(rng):
    params = [rng.standard_normal(n).astype(np.float32) for n in (5000, 300, 4100)]
    twins = [p.copy() for p in params]
    grads = [[rng.standard_normal(p.size).astype(np.float32) for p in params] for _ in range(3)]
    with lowbit.Optimizer("adamw", lr=1e-2, state="4bit-sr") as full, \
            lowbit.Optimizer("adamw", lr=1e-2, state="4bit-sr") as parts:
        for p, q in zip(params, twins):
            full.add_param(p)
            parts.add_param(q)
        for g in grads:
            full.step(g)
            assert parts.step_params([2, 0], [g[2], g[0]])
            assert parts.step_params([1], [g[1]])
        for p, q in zip(params, twins):
            assert np.array_equal(p, q)
        with pytest.raises(lowbit.InvalidArgumentError, match="appears twice"):
            parts.step_params([1, 1], [grads[0][1], grads[0][1]])


@pytest.mark.parametrize("case", ["ddp", "fsdp2"])
def test_distributed_in_backward_equals_step_after_backward(case, seed):
    result = launch(Path(__file__).parent / "torch_in_backward_worker.py", 2, case, seed, timeout=600)
    assert result["equal"], result
    assert result["steps"] == 4


# Issue 45 (1): a param whose storage is replaced or resized after it was
# registered. The hooks stepped the registered (freed) memory: ASan reported
# heap-use-after-free in the step; the run of this test under ASan
# (scripts/test_asan.sh, CTest python.asan_moved_storage, exhaustive) says
# no library call touches freed memory now.
MOVES = {
    "data": lambda v: setattr(v, "data", torch.zeros_like(v)),  # a new storage; the registered one is freed
    "resize_grow": lambda v: v.data.resize_(50000),  # the shared storage reallocated, v keeps its shape
    "shrink": lambda v: setattr(v, "data", v.data[:2500]),  # the same address, half the elements
}


def _moving_model(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(64, 24, generator=g) * 0.2)
    v = torch.nn.Parameter(torch.randn(5000, generator=g))  # shape-agnostic in the loss: any size backpropagates
    x = torch.randn(32, 24, generator=g)
    return w, v, lambda: (x @ w.t()).square().mean() + 1e-3 * v.square().sum()


def _state_snapshot(opt, params):
    return ([dev.handle.save() for dev in opt._devices.values()],
            [p.detach().clone().view(torch.int32) for p in params],
            [opt.param_info(p).step for p in opt._where])


@pytest.mark.parametrize("bucket_numel", [0, 1 << 30])
@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_param_whose_storage_moved_is_refused_in_backward_and_nothing_changes(move, bucket_numel, seed):
    w, v, loss = _moving_model(seed)
    opt = lt.AdamW([w, v], lr=1e-2, state="8bit", min_quantized_numel=0)
    lt.step_in_backward(opt, bucket_numel=bucket_numel)
    loss().backward()  # registers both and steps them
    assert opt.param_info(v).step == 1
    MOVES[move](v)
    snap = _state_snapshot(opt, [w, v])
    with pytest.raises(RuntimeError, match=r"param \((5000|2500),\) of this optimizer moved in memory"):
        loss().backward()
    now = _state_snapshot(opt, [w, v])
    assert now[0] == snap[0] and now[2] == snap[2] == [1, 1]
    assert all(torch.equal(a, b) for a, b in zip(now[1], snap[1]))
    # the numpy-level handle refuses the moved param too (what the hooks call)
    handle = opt.lowbit_handles()["cpu"]
    _, pid = opt._where[v]
    with pytest.raises(lowbit.InvalidStateError, match=f"param {pid} no longer holds the memory registered"):
        handle.step_params([pid], [torch.zeros(5000)])
    assert handle.step_params([1 - pid], [torch.zeros_like(w)])  # the param that did not move still steps


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_param_whose_storage_moved_is_refused_by_step_and_the_compile_op(move, seed):
    """The other paths that hand a torch param's memory to the library."""
    w, v, loss = _moving_model(seed)
    opt = lt.AdamW([w, v], lr=1e-2, state="8bit", min_quantized_numel=0)
    loss().backward()
    opt.step()
    opt.zero_grad()
    MOVES[move](v)
    loss().backward()
    snap = _state_snapshot(opt, [w, v])
    with pytest.raises(RuntimeError, match="moved in memory"):
        opt.step()
    from lowbit.torch import _compile
    if _compile.step_op is not None:
        with pytest.raises(RuntimeError, match="moved in memory"):
            torch.ops.lowbit.step(opt._compile_key, [w, v], [w.grad, v.grad], [torch.tensor(1e-2)])
    now = _state_snapshot(opt, [w, v])
    assert now[0] == snap[0] and now[2] == snap[2] == [1, 1]
    assert all(torch.equal(a, b) for a, b in zip(now[1], snap[1]))


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_host_copy_whose_storage_moved_is_refused_by_cpu_offload(move, seed):
    w, v, loss = _moving_model(seed)
    off = lt.CPUOffload(lt.AdamW, [w, v], lr=1e-2, state="8bit", min_quantized_numel=0)
    loss().backward()
    off.step()
    MOVES[move](off.host_param(v))  # the host copy the library steps
    snap = _state_snapshot(off.inner, [w, v, off.host_param(w), off.host_param(v)])
    with pytest.raises(RuntimeError, match="moved in memory"):
        loss().backward()
    now = _state_snapshot(off.inner, [w, v, off.host_param(w), off.host_param(v)])
    assert now[0] == snap[0] and now[2] == snap[2] == [1, 1]
    assert all(torch.equal(a, b) for a, b in zip(now[1], snap[1]))
    off.close()

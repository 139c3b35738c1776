"""lowbit.torch fills the per-step grad descriptors two ways: a vectorised
path for the usual step (every param has a contiguous grad of a known dtype,
nothing moved) and the per-param path that checks each grad and names the
culprit. Both must hand the library the same grads: the same sequence of
steps, with grads replaced, reused, of another dtype, or missing, gives
bit-identical params with either path."""

import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
import seeding  # noqa: E402


def _params(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    shapes = [(37,), (64, 8), (4096,), (3, 5, 7), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]


def _grads(step, params, dtype=None):
    g = torch.Generator().manual_seed(seeding.derive("torch_grad_descriptors", step))
    return [torch.randn(p.shape, generator=g).to(dtype or p.dtype) * 1e-2 for p in params]


def _run(params, opt, dtype):
    """A sequence of steps exercising every way grads change."""
    for step in range(8):
        grads = _grads(step, params, torch.bfloat16 if step in (3, 4) and dtype == torch.float32 else None)
        for i, (p, g) in enumerate(zip(params, grads)):
            if hasattr(p, "grad_dtype"):
                p.grad_dtype = None  # newer torch: allow a grad dtype other than the param's
            if step == 2 and p.grad is not None and p.grad.dtype == g.dtype:
                p.grad.copy_(g)  # the same grad tensors, new values
            else:
                p.grad = g
        if step == 5:
            params[1].grad = None  # a frozen param this step
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("dtype,state", [(torch.float32, "fp32"), (torch.bfloat16, "8bit")])
def test_vectorised_and_per_param_paths_agree(dtype, state, monkeypatch):
    seed = seeding.derive("torch_grad_descriptors.params")
    fast_params = _params(seed, dtype)
    fast = lt.AdamW(fast_params, lr=1e-2, weight_decay=0.1, state=state)
    fast_out = _run(fast_params, fast, dtype)

    calls = []
    real = lt._DeviceState.fill_grads_fast

    def never(self, grads):
        calls.append(real(self, grads))  # what the vectorised path would have said
        return False

    monkeypatch.setattr(lt._DeviceState, "fill_grads_fast", never)
    slow_params = _params(seed, dtype)
    slow = lt.AdamW(slow_params, lr=1e-2, weight_decay=0.1, state=state)
    slow_out = _run(slow_params, slow, dtype)

    for a, b in zip(fast_out, slow_out):
        assert torch.equal(a, b)
    assert calls.count(True) >= 5 and calls.count(False) >= 1  # both paths were exercised
    assert fast.param_info(fast_params[1]).step == 7 and fast.param_info(fast_params[0]).step == 8


def test_after_the_vectorised_path_errors_still_name_the_grad():
    w = torch.nn.Parameter(torch.zeros(8, 8))
    opt = lt.AdamW([w])
    w.grad = torch.zeros(8, 8)
    opt.step()
    w.grad = torch.zeros(8, 8).t()
    with pytest.raises(lowbit.ArrayError, match="grad: the tensor is not contiguous"):
        opt.step()
    if hasattr(w, "grad_dtype"):
        w.grad_dtype = None  # newer torch: allow a grad dtype other than the param's
    w.grad = torch.zeros(8, 8, dtype=torch.float16)
    opt.step()  # a new grad dtype is fine
    w.grad = torch.zeros(8, 8, dtype=torch.float64)
    with pytest.raises(lowbit.ArrayError, match="float64"):
        opt.step()
    w.grad = torch.zeros(8, 8)
    opt.step()
    assert opt.param_info(w).step == 3
    w.data = torch.zeros(8, 8)
    w.grad = torch.zeros(8, 8)
    with pytest.raises(RuntimeError, match="moved in memory"):
        opt.step()

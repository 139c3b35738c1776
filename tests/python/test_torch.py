"""lowbit.torch: drop-in torch.optim.Optimizer classes.

fp32 state must follow torch.optim.AdamW / Adam / SGD to float tolerance
(both compute in fp32; torch's CPU single-tensor path and lowbit's loops round
differently only in the last bits: 1e-5 over 50 steps of lr 1e-2 on weights
of magnitude ~0.1-1 leaves a 10x margin). The low-precision states must train
a small model to a loss near torch.optim.AdamW's: within 2% for 8-bit and
bf16, within measured bounds for fp8 and 4-bit (RELATIVE_LOSS_BOUNDS).
"""

import copy
import functools
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
import seeding  # noqa: E402
from float64_reference import Reference  # noqa: E402

CUDA = torch.cuda.is_available()


def _model(instance=0, width=64, dtype=torch.float32):
    g = torch.Generator().manual_seed(seeding.derive("model", instance))
    m = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, width),
                            torch.nn.Tanh(), torch.nn.Linear(width, 4))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m.to(dtype)


def _data(instance=0, n=512):
    g = torch.Generator().manual_seed(seeding.derive("data", instance))
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, 4, generator=g)).argmax(dim=1)
    return x, y


def _train_step(model, opt, x, y, closure=False):
    def f():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        return loss

    if closure:
        return opt.step(f)
    loss = f()
    opt.step()
    return loss


def _max_diff(m1, m2):
    return max((a.detach().float() - b.detach().float()).abs().max().item()
               for a, b in zip(m1.parameters(), m2.parameters()))


@pytest.mark.parametrize(
    "ours, theirs, kwargs",
    [
        (lt.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
        (lt.AdamW, torch.optim.AdamW, dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0)),
        (lt.Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.05)),
        (lt.SGD, torch.optim.SGD, dict(lr=5e-2, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
        (lt.SGD, torch.optim.SGD, dict(lr=5e-2, momentum=0.9, nesterov=True)),
        (lt.SGD, torch.optim.SGD, dict(lr=5e-2)),
    ],
)
def test_fp32_state_matches_torch_over_50_steps(ours, theirs, kwargs):
    x, y = _data()
    m1, m2 = _model(), _model()
    o1 = theirs(m1.parameters(), **kwargs)
    o2 = ours(m2.parameters(), state="fp32", **kwargs)
    for _ in range(50):
        l1 = _train_step(m1, o1, x, y)
        l2 = _train_step(m2, o2, x, y)
    assert _max_diff(m1, m2) < 1e-5
    assert abs(l1.item() - l2.item()) < 1e-5
    if ours is not lt.SGD:
        p1, p2 = next(m1.parameters()), next(m2.parameters())
        torch.testing.assert_close(o2.read_moment(p2, 0), o1.state[p1]["exp_avg"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(o2.read_moment(p2, 1), o1.state[p1]["exp_avg_sq"], rtol=1e-5, atol=1e-8)


def test_lion_matches_a_float64_reference():
    x, y = _data()
    model = _model()
    hp = dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1)
    refs = [Reference("lion", p.detach().double().numpy(), **hp) for p in model.parameters()]
    opt = lt.Lion(model.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), weight_decay=hp["weight_decay"])
    for _ in range(30):
        # the reference uses the grads lowbit sees (computed at lowbit's weights)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad.double().numpy() for p in model.parameters()]
        before = [p.detach().double().numpy() for p in model.parameters()]
        opt.step()
        for r, b, g in zip(refs, before, grads):
            r.p = b  # each step from lowbit's weights; the momentum is the reference's own
            r.step(g)
        for p, r in zip(model.parameters(), refs):
            assert np.abs(p.detach().double().numpy() - r.p).max() < 1e-6
    for p, r in zip(model.parameters(), refs):
        torch.testing.assert_close(opt.read_moment(p, 0).double(), torch.from_numpy(r.m), rtol=1e-5, atol=1e-8)


def _teacher_task():
    """Regression on a random teacher network with noisy targets (teacher and
    held-out set from the run's seed): 4096 held-out noisy samples, on which
    no model can go below the teacher's own loss (the noise floor, ~0.09), so
    the optimizers are compared on a loss that cannot be driven to zero.
    Returns (f, xt, yt, floor)."""
    g = torch.Generator().manual_seed(seeding.derive("teacher"))
    w1, w2 = torch.randn(16, 32, generator=g) / 4, torch.randn(32, 1, generator=g) / 5.6

    def f(x):
        return torch.tanh(x @ w1) @ w2

    xt = torch.randn(4096, 16, generator=g)
    yt = f(xt) + 0.3 * torch.randn(4096, 1, generator=g)
    return f, xt, yt, torch.nn.functional.mse_loss(f(xt), yt).item()


def _train(opt_factory, steps=300):
    """300 steps on fresh batches (the same for every optimizer of a run) from
    the same initialisation; returns the held-out loss before and after, and
    the optimizer."""
    f, xt, yt, _ = _teacher_task()
    torch.manual_seed(seeding.derive("teacher_init"))  # nn.Linear's initialisation
    # the 128x128 matrix (16384 elements) gets the quantized state
    model = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128),
                                torch.nn.Tanh(), torch.nn.Linear(128, 1))
    with torch.no_grad():
        initial = torch.nn.functional.mse_loss(model(xt), yt).item()
    opt = opt_factory(model.parameters())
    g = torch.Generator().manual_seed(seeding.derive("teacher_batches"))
    for _ in range(steps):
        x = torch.randn(256, 16, generator=g)
        y = f(x) + 0.3 * torch.randn(256, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        return initial, torch.nn.functional.mse_loss(model(xt), yt).item(), opt


@functools.lru_cache(maxsize=1)
def _torch_adamw_losses(seed):
    """(initial, final) held-out loss of torch.optim.AdamW on the run's task
    (`seed`: the run's seed, the cache key)."""
    initial, final, _ = _train(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2))
    return initial, final


# How far the final held-out loss of lowbit's AdamW may be from torch's, as
# (ours - torch) / torch, per state format. Both runs see the same task,
# initialisation and batches and part only through the rounding of the state;
# where training then ends is a random variable of the task, not a float error
# with a derived bound, so the bounds are measured: over the 2000 tasks of
# seeds 0..1999 (LOWBIT_TEST_SEED=N for each), the relative difference was
#              mean     sd      min      max    1e-4 tail points (lo, hi)
#     8bit   -0.15%   0.31%   -1.59%   +1.23%      -1.95%   +1.40%
#     bf16   +0.02%   0.02%   -0.07%   +0.17%      -0.09%   +0.17%
#     fp8    -0.38%   0.62%   -3.54%   +1.97%      -3.68%   +2.48%
#     4bit   -0.61%   1.01%   -5.48%   +2.52%      -6.44%   +3.61%
# The 2% this test had held for 4-bit and fp8 only on the one task it was
# pinned to: 179 of these 2000 tasks put 4-bit outside it (mostly below:
# 4-bit tends to end lower than torch), 22 fp8. The margin beyond the
# measured extremes: each tail beyond its 95% quantile fits an exponential
# (the mean excess as its scale), and the "1e-4 tail point" is where that fit
# puts a probability of 1e-4 per run. Each bound is that point rounded
# outwards to 0.5%, and never inside the 2% the test always had (8-bit and
# bf16 keep it). By the same fits, about one run in 3000 fails by chance in
# one of the four formats.
RELATIVE_LOSS_BOUNDS = {"8bit": (-0.02, 0.02), "bf16": (-0.02, 0.02), "fp8": (-0.04, 0.025), "4bit": (-0.065, 0.04)}
# torch's AdamW must have removed most of the held-out loss above the noise
# floor, or the comparison is between two untrained models: over the same
# 2000 tasks the remaining fraction (final - floor) / (initial - floor) had
# median 0.053 and maximum 0.183; 0.25 is its tail fit's point at 1e-5.
LEARNED_MAX = 0.25


@pytest.mark.parametrize("state", ["8bit", "bf16", "fp8", "4bit"])
def test_low_precision_state_trains_as_well_as_torch_adamw(state):
    initial, base = _torch_adamw_losses(seeding.seed())
    _, ours, opt = _train(lambda p: lt.AdamW(p, lr=1e-3, weight_decay=1e-2, state=state))
    infos = [opt.param_info(p) for p in opt.param_groups[0]["params"]]
    assert sum(i.state_format == state for i in infos) >= 1
    floor = _teacher_task()[3]
    assert base - floor < LEARNED_MAX * (initial - floor), (initial, base, floor)  # torch's run learned
    lo, hi = RELATIVE_LOSS_BOUNDS[state]
    assert lo <= (ours - base) / base <= hi, f"{state}: {ours} vs torch {base} ({100 * (ours - base) / base:+.2f}%)"
    if state != "bf16":
        full = sum(8 * p.numel() for p in opt.param_groups[0]["params"])
        assert opt.state_bytes() < 0.5 * full


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize(
    "cls, kwargs, dtype",
    [
        (lt.AdamW, dict(state="fp32"), torch.float32),
        (lt.AdamW, dict(state="8bit", min_quantized_numel=64), torch.float32),
        (lt.AdamW, dict(state="4bit", min_quantized_numel=64, stochastic_rounding=True), torch.bfloat16),
        (lt.Lion, dict(state="fp8", min_quantized_numel=64, error_correction=True), torch.bfloat16),
        (lt.SGD, dict(momentum=0.9, state="bf16"), torch.float32),
    ],
)
def test_state_dict_round_trip_gives_identical_next_steps(cls, kwargs, dtype):
    x, y = _data()
    x = x.to(dtype)
    model = _model(dtype=dtype)
    sched_kwargs = dict(step_size=3, gamma=0.5)
    opt = cls(model.parameters(), lr=1e-2, **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, **sched_kwargs)
    for _ in range(5):
        _train_step(model, opt, x, y)
        sched.step()
    model_sd = copy.deepcopy(model.state_dict())
    opt_sd = _roundtrip(opt.state_dict())
    sched_sd = copy.deepcopy(sched.state_dict())
    for _ in range(4):
        _train_step(model, opt, x, y)
        sched.step()

    model2 = _model(instance=5, dtype=dtype)
    model2.load_state_dict(model_sd)
    opt2 = cls(model2.parameters(), lr=0.5, **kwargs)
    opt2.load_state_dict(opt_sd)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, **sched_kwargs)
    sched2.load_state_dict(sched_sd)
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt_sd["param_groups"][0]["lr"])
    for _ in range(4):
        _train_step(model2, opt2, x, y)
        sched2.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_imports_a_plain_torch_adamw_state_dict():
    x, y = _data()
    m1 = _model(width=96)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2, weight_decay=0.05)
    for _ in range(10):
        _train_step(m1, o1, x, y)
    sd = _roundtrip(o1.state_dict())

    m2 = copy.deepcopy(m1)
    o2 = lt.AdamW(m2.parameters(), lr=0.1, state="fp32")
    o2.load_state_dict(sd)
    assert o2.param_groups[0]["lr"] == 1e-2 and o2.param_groups[0]["weight_decay"] == 0.05
    p1, p2 = next(m1.parameters()), next(m2.parameters())
    assert o2.param_info(p2).step == 10
    torch.testing.assert_close(o2.read_moment(p2, 1), o1.state[p1]["exp_avg_sq"], rtol=0, atol=0)
    for _ in range(10):
        _train_step(m1, o1, x, y)
        _train_step(m2, o2, x, y)
    assert _max_diff(m1, m2) < 1e-5

    m3 = copy.deepcopy(m1)
    o3 = lt.AdamW(m3.parameters(), state="8bit", min_quantized_numel=1024)
    o3.load_state_dict(o1.state_dict())
    big = [p for p in m3.parameters() if p.numel() >= 1024][0]
    ref = o1.state[[p for p in m1.parameters() if p.numel() >= 1024][0]]["exp_avg"]
    assert o3.param_info(big).state_format == "8bit"
    got = o3.read_moment(big, 0)
    assert ((got - ref).norm() / ref.norm()).item() < 0.02


def test_refuses_amsgrad_state_and_options():
    m = _model()
    with pytest.raises(ValueError, match="amsgrad"):
        lt.AdamW(m.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="maximize"):
        lt.SGD(m.parameters(), lr=0.1, maximize=True)
    with pytest.raises(ValueError, match="capturable"):
        lt.Adam(m.parameters(), capturable=True)
    lt.AdamW(m.parameters(), fused=True, foreach=False)  # torch's kernel choices: accepted, no effect
    o1 = torch.optim.AdamW(m.parameters(), amsgrad=True)
    x, y = _data()
    _train_step(m, o1, x, y)
    o2 = lt.AdamW(m.parameters())
    with pytest.raises(ValueError, match="amsgrad"):
        o2.load_state_dict(o1.state_dict())


def test_param_groups_and_scheduler_match_torch():
    x, y = _data()
    m1, m2 = _model(), _model()

    def groups(m):
        ps = list(m.parameters())
        return [{"params": ps[:2], "lr": 2e-2, "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]

    o1 = torch.optim.AdamW(groups(m1), lr=5e-3)
    o2 = lt.AdamW(groups(m2), lr=5e-3, state="fp32")
    s1 = torch.optim.lr_scheduler.OneCycleLR(o1, max_lr=[3e-2, 1e-2], total_steps=40)
    s2 = torch.optim.lr_scheduler.OneCycleLR(o2, max_lr=[3e-2, 1e-2], total_steps=40)
    for _ in range(40):
        _train_step(m1, o1, x, y)
        _train_step(m2, o2, x, y, closure=True)
        s1.step()
        s2.step()
    assert _max_diff(m1, m2) < 1e-5


def test_add_param_group_and_params_without_grads():
    x, y = _data()
    model = _model()
    layers = [model[0], model[2], model[4]]
    frozen = torch.nn.Parameter(torch.ones(5))
    opt = lt.AdamW(list(layers[0].parameters()) + [frozen], lr=1e-2, state="fp32")
    _train_step(model, opt, x, y)
    assert torch.equal(frozen, torch.ones(5))  # no grad: untouched, no state
    with pytest.raises(KeyError):
        opt.param_info(frozen)
    before = [p.detach().clone() for p in layers[1].parameters()]
    opt.add_param_group({"params": list(layers[1].parameters()), "lr": 0.0, "weight_decay": 0.0})
    opt.add_param_group({"params": list(layers[2].parameters()), "state": "bf16"})
    _train_step(model, opt, x, y)
    for a, b in zip(layers[1].parameters(), before):
        assert torch.equal(a, b)  # lr 0
    assert opt.param_info(layers[2].weight).state_format == "bf16"
    assert opt.param_info(layers[0].weight).step == 2 and opt.param_info(layers[2].weight).step == 1
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_mixed_grad_dtype_and_bf16_params_with_error_correction():
    x, y = _data()
    model = _model(dtype=torch.bfloat16)
    opt = lt.AdamW(model.parameters(), lr=1e-2, error_correction=True)
    first = None
    for _ in range(30):
        loss = _train_step(model, opt, x.bfloat16(), y)
        first = first or loss.item()
    assert loss.item() < 0.8 * first
    n = sum(p.numel() for p in model.parameters())
    assert opt.state_bytes() == 8 * n + n  # fp32 moments + one correction byte per element
    # fp32 params with bf16 grads
    m2 = _model()
    o2 = lt.AdamW(m2.parameters(), lr=1e-2)
    for p in m2.parameters():
        if hasattr(p, "grad_dtype"):
            p.grad_dtype = None  # newer torch: allow a grad dtype other than the param's
        p.grad = torch.ones_like(p, dtype=torch.bfloat16)
    o2.step()
    assert o2.param_info(next(m2.parameters())).step == 1


def test_nonfinite_grads_skip_the_step():
    x, y = _data()
    model = _model()
    opt = lt.AdamW(model.parameters(), lr=1e-2)
    _train_step(model, opt, x, y)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model[0].weight.grad[0, 0] = float("nan")
    opt.step()
    assert opt.last_step_skipped
    for a, b in zip(model.parameters(), before):
        assert torch.equal(a, b)


def test_rejections():
    w = torch.nn.Parameter(torch.zeros(8, 8))
    opt = lt.AdamW([w])
    w.grad = torch.zeros(8, 8).t()  # non-contiguous grad
    with pytest.raises(lowbit.ArrayError, match="grad: the tensor is not contiguous"):
        opt.step()
    if hasattr(w, "grad_dtype"):
        w.grad_dtype = None
    w.grad = torch.zeros(8, 8, dtype=torch.float64)
    with pytest.raises(lowbit.ArrayError, match="float64"):
        opt.step()
    w.grad = torch.zeros(8, 8)
    opt.step()

    base = torch.zeros(8, 8)
    v = torch.nn.Parameter(base.t())  # a non-contiguous param cannot be updated in place
    o2 = lt.AdamW([v])
    v.grad = torch.zeros(8, 8)
    with pytest.raises(lowbit.ArrayError, match="param: the tensor is not contiguous"):
        o2.step()
    d = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    o3 = lt.SGD([d], lr=0.1)
    d.grad = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(lowbit.ArrayError, match="param: dtype torch.float64"):
        o3.step()
    e = torch.nn.Parameter(torch.zeros(4))
    o4 = lt.SGD([e], lr=0.1)
    e.grad = torch.zeros(4).to_sparse()  # taken: densified for the step (test_torch_sparse_grad.py)
    o4.step()
    assert torch.equal(e, torch.zeros(4))
    with pytest.raises(lowbit.InvalidArgumentError, match="state"):
        lt.AdamW([e], state="2bit")
    with pytest.raises(lowbit.InvalidArgumentError, match="lr"):
        o5 = lt.AdamW([e], lr=-1.0)
        e.grad = torch.zeros(4)
        o5.step()
    o6 = lt.AdamW([e])
    e.grad = torch.zeros(4)
    o6.step()
    e.data = torch.zeros(4)  # replaced storage: the registered pointer is stale
    with pytest.raises(RuntimeError, match="moved in memory"):
        o6.step()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_matches_torch_and_cpu_cuda_mix():
    x, y = _data()
    m1, m2 = _model().cuda(), _model().cuda()
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2, weight_decay=0.1)
    o2 = lt.AdamW(m2.parameters(), lr=1e-2, weight_decay=0.1, state="fp32")
    for _ in range(50):
        _train_step(m1, o1, x.cuda(), y.cuda())
        _train_step(m2, o2, x.cuda(), y.cuda())
    torch.cuda.synchronize()
    assert _max_diff(m1, m2) < 1e-5
    cpu = torch.nn.Parameter(torch.ones(10))
    gpu = torch.nn.Parameter(torch.ones(10, device="cuda"))
    o3 = lt.AdamW([cpu, gpu], lr=0.1, state="8bit", min_quantized_numel=1)
    cpu.grad, gpu.grad = torch.ones(10), torch.ones(10, device="cuda")
    o3.step()
    torch.cuda.synchronize()
    assert set(o3.lowbit_handles()) == {"cpu", "cuda:0"}
    torch.testing.assert_close(cpu.detach(), gpu.detach().cpu())
    sd = _roundtrip(o3.state_dict())
    o4 = lt.AdamW([cpu, gpu], lr=0.1, state="8bit", min_quantized_numel=1)
    o4.load_state_dict(sd)
    assert o4.param_info(gpu).step == 1

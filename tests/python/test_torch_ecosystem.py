"""lowbit.torch with the rest of PyTorch's training loop:

- load_state_dict converts saved moments into the loading optimizer's own
  state formats (8-bit -> 4-bit, 4-bit -> 8-bit, fp32 -> 8-bit,
  torch.optim.AdamW -> 4-bit): the formats are the optimizer's afterwards, and
  the moments are exactly what encoding the saved (dequantized) moments into
  those formats gives, i.e. they match the saved ones to the target format's
  quantization error;
- lr schedulers: the lr of each step reaches the library (two steps with
  different lr against the float64 reference);
- torch.nn.utils.clip_grad_norm_: the clipped grads are the ones stepped
  (against torch.optim.AdamW with the same clipping);
- torch.amp.GradScaler on the CPU: plain ``scaler.step(opt)``; a step with an
  inf grad is skipped (params, moments and step counts unchanged) and the
  scale backs off; finite steps follow torch.optim.AdamW under the same scaler;
- a torch.compile'd module (backend aot_eager, to keep the test quick: the
  optimizer sees the module's own parameters whatever the backend).
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowbit.torch as lt  # noqa: E402
import seeding  # noqa: E402
from float64_reference import Reference  # noqa: E402


def _model(width=96):
    g = torch.Generator().manual_seed(seeding.derive("ecosystem.model"))
    m = torch.nn.Sequential(torch.nn.Linear(24, width), torch.nn.Tanh(), torch.nn.Linear(width, 5))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def _data(n=128):
    g = torch.Generator().manual_seed(seeding.derive("ecosystem.data"))
    x = torch.randn(n, 24, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    return x, y


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).float(), y)


def _train(model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        _loss(model, x, y).backward()
        opt.step()


def _max_diff(m1, m2):
    return max((a.detach() - b.detach()).abs().max().item() for a, b in zip(m1.parameters(), m2.parameters()))


# ------------------------------------------------- load_state_dict converts formats

def _source(kind):
    """A state dict after 4 steps, the model it belongs to, and the saved
    moments as fp32 tensors (per param: step, [m, v])."""
    x, y = _data()
    model = _model()
    if kind == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    else:
        opt = lt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05, state=kind, min_quantized_numel=256)
    _train(model, opt, 4, x, y)
    saved = []
    for p in model.parameters():
        if kind == "torch":
            s = opt.state[p]
            saved.append((int(s["step"].item()), [s["exp_avg"].clone(), s["exp_avg_sq"].clone()]))
        else:
            saved.append((opt.param_info(p).step, [opt.read_moment(p, 0), opt.read_moment(p, 1)]))
    return model, opt.state_dict(), saved


# The largest distance from a value in [-1, 1] (first moment) or [0, 1]
# (second moment) to the nearest code of each map (shared/golden/qmaps.json):
# half the largest gap between codes, which is also the distance from -1 to
# the signed maps' lowest code (they hold +1 but not -1); for the 4-bit second
# moment's linear map without zero, 1/16 (values under 1/16 round up to it).
HALF_GAP = {"8bit": (0.0070313, 0.0035157), "4bit": (0.1125001, 0.0625)}
# Re-encoding fp32 moments (write_moment, a load into another format) gives a
# block whose largest magnitude is negative the scale that makes the signed
# map's lowest code decode to it exactly (so that save/load cycles are a fixed
# point): |min| / |lowest code|, so the scale is at most max|x| / |lowest code|.
LOWEST_CODE = {"8bit": (0.99296874, 1.0), "4bit": (0.8875, 1.0)}


@pytest.mark.parametrize("src, dst", [("8bit", "4bit"), ("4bit", "8bit"), ("fp32", "8bit"), ("torch", "4bit"),
                                      ("torch", "8bit")])
def test_load_state_dict_converts_moments_to_the_optimizers_formats(src, dst):
    model, sd, saved = _source(src)
    m2 = copy.deepcopy(model)
    o2 = lt.AdamW(m2.parameters(), lr=0.5, state=dst, min_quantized_numel=256)
    o2.load_state_dict(sd)
    assert o2.param_groups[0]["lr"] == 1e-2 and o2.param_groups[0]["weight_decay"] == 0.05  # from the state dict
    assert o2.param_groups[0]["state"] == dst  # how the state is kept: this optimizer's own

    # The reference: the saved moments (dequantized) written into the target
    # format through write_moment, the documented fp32 -> format encoding.
    m3 = copy.deepcopy(model)
    ref = lt.AdamW(m3.parameters(), state=dst, min_quantized_numel=256)
    ref.load_state_dict({"state": {i: {"step": torch.tensor(float(step)), "exp_avg": m, "exp_avg_sq": v}
                                   for i, (step, (m, v)) in enumerate(saved)},
                         "param_groups": [{**sd["param_groups"][0], "state": dst}]})

    quantized = 0
    for p, pr, (step, moments) in zip(m2.parameters(), m3.parameters(), saved):
        info = o2.param_info(p)
        expect = dst if p.numel() >= 256 else "fp32"
        assert (info.state_format, info.second_state_format) == (expect, expect)
        assert info.step == step == 4
        for k, want in enumerate(moments):
            got = o2.read_moment(p, k)
            assert torch.equal(got, ref.read_moment(pr, k)), (p.shape, k)
            want = want.reshape(got.shape)
            if expect == "fp32":
                assert torch.equal(got, want)
            else:
                quantized += 1
                # one quantization: each element within the largest half-gap of
                # the format's map (shared/golden/qmaps.json) times its block's
                # scale, at most max|want| / |lowest code| (see LOWEST_CODE)
                bound = HALF_GAP[dst][k] * want.abs().max().item() / LOWEST_CODE[dst][k] * 1.001
                assert (got - want).abs().max().item() <= bound, (p.shape, k)
    assert quantized >= 2

    # and it keeps training in that format
    x, y = _data()
    _train(m2, o2, 1, x, y)
    assert o2.param_info(next(m2.parameters())).state_format == dst


def test_load_keeps_per_group_state_options_of_the_loading_optimizer():
    model, sd, _ = _source("8bit")
    ps = list(model.parameters())
    o2 = lt.AdamW([{"params": ps[:2], "state": "fp32"}, {"params": ps[2:]}], state="4bit", min_quantized_numel=256)
    sd = copy.deepcopy(sd)
    sd["param_groups"] = [{**sd["param_groups"][0], "params": [0, 1]}, {**sd["param_groups"][0], "params": [2, 3]}]
    o2.load_state_dict(sd)
    assert o2.param_info(ps[0]).state_format == "fp32"
    assert o2.param_info(ps[2]).state_format == "4bit"
    assert [g["state"] for g in o2.param_groups] == ["fp32", "4bit"]


# ------------------------------------------------- lr schedulers

def test_scheduler_lr_reaches_the_library_each_step():
    """Two steps with different lr (LambdaLR: lr, then lr / 10) against the
    float64 reference given those two lrs; the same steps with one lr differ."""
    gen = torch.Generator().manual_seed(seeding.derive("ecosystem.sched"))
    w0 = torch.randn(300, generator=gen)
    grads = [torch.randn(300, generator=gen) for _ in range(2)]
    hp = dict(lr=5e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)

    w = torch.nn.Parameter(w0.clone())
    opt = lt.AdamW([w], lr=hp["lr"], weight_decay=hp["weight_decay"], state="fp32")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: [1.0, 0.1][min(step, 1)])
    ref = Reference("adamw", w0.double().numpy(), float32_hparams=True, **hp)
    for g, lr in zip(grads, (5e-2, 5e-3)):
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)
        w.grad = g.clone()
        opt.step()
        sched.step()
        ref.step(g.double().numpy(), lr=lr)
        np.testing.assert_allclose(w.detach().double().numpy(), ref.p, rtol=0, atol=2e-6)
    assert opt.lowbit_handles()["cpu"].get_hparams(0)["lr"] == pytest.approx(5e-3)

    constant = Reference("adamw", w0.double().numpy(), float32_hparams=True, **hp)
    for g in grads:
        constant.step(g.double().numpy())
    assert np.abs(constant.p - ref.p).max() > 100 * 2e-6  # the lr change is visible well above the tolerance


# ------------------------------------------------- gradient clipping

def test_clip_grad_norm_is_applied_to_the_grads_stepped():
    x, y = _data()
    m1, m2 = _model(), _model()
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2, weight_decay=0.05)
    o2 = lt.AdamW(m2.parameters(), lr=1e-2, weight_decay=0.05, state="fp32")
    clipped = 0
    for _ in range(15):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            _loss(m, x, y).backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=0.05)
            o.step()
        clipped += norm.item() > 0.05
    assert clipped >= 10  # the clipping did act
    assert _max_diff(m1, m2) < 1e-5
    # without clipping the same run ends elsewhere
    m3 = _model()
    _train(m3, torch.optim.AdamW(m3.parameters(), lr=1e-2, weight_decay=0.05), 15, x, y)
    assert _max_diff(m1, m3) > 1e-3


# ------------------------------------------------- AMP GradScaler

def _grad_scaler():
    try:
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1000)
    except (AttributeError, TypeError, RuntimeError) as e:  # pragma: no cover - older torch
        pytest.skip(f"torch {torch.__version__} has no CPU GradScaler: {e}")


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    moments = [(opt.read_moment(p, 0), opt.read_moment(p, 1), opt.param_info(p).step) for p in model.parameters()]
    return params, moments


def test_grad_scaler_steps_and_skips_inf_steps():
    x, y = _data()
    m1, m2 = _model(), _model()
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = lt.AdamW(m2.parameters(), lr=1e-2, state="fp32")
    s1, s2 = _grad_scaler(), _grad_scaler()

    def step(model, opt, scaler, poison=False):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = _loss(model, x, y)
        scaler.scale(loss).backward()
        if poison:
            model[0].weight.grad[3, 1] = float("inf")
        scaler.step(opt)
        scaler.update()

    for _ in range(3):
        step(m1, o1, s1)
        step(m2, o2, s2)
    assert o2.param_info(m2[0].weight).step == 3
    assert _max_diff(m1, m2) < 1e-5  # the unscaled grads were stepped, as torch's AdamW steps them

    params, moments = _snapshot(m2, o2)
    scale = s2.get_scale()
    step(m2, o2, s2, poison=True)
    assert s2.get_scale() == scale / 2  # found inf: the scaler backed off...
    for p, before in zip(m2.parameters(), params):  # ...and opt.step() was not called
        assert torch.equal(p.detach(), before)
    for p, (m, v, t) in zip(m2.parameters(), moments):
        assert torch.equal(o2.read_moment(p, 0), m) and torch.equal(o2.read_moment(p, 1), v)
        assert o2.param_info(p).step == t

    step(m2, o2, s2)  # a finite step after the skip
    assert o2.param_info(m2[0].weight).step == 4
    assert not torch.equal(m2[0].weight.detach(), params[0])


# ------------------------------------------------- torch.compile

def test_steps_the_params_of_a_compiled_module():
    if not hasattr(torch, "compile"):
        pytest.skip(f"torch {torch.__version__} has no torch.compile")
    x, y = _data()
    eager, base = _model(width=32), _model(width=32)
    compiled = torch.compile(base, backend="aot_eager")
    o1 = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    o2 = lt.AdamW(compiled.parameters(), lr=1e-2, state="fp32")
    losses = []
    for _ in range(8):
        for m, o in ((eager, o1), (compiled, o2)):
            o.zero_grad()
            loss = _loss(m, x, y)
            loss.backward()
            o.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert _max_diff(eager, base) < 1e-5  # the compiled module's own params were stepped

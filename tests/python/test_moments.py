"""Moments and step counts through the C API (lowbit_optimizer_write_moment,
lowbit_optimizer_set_step) and the state plan (lowbit_plan_param_state):

- writing fp32 moments and a step count gives, byte for byte, the state that
  loading a materialized fp32 checkpoint of the same values gives (the way
  lowbit.torch imported torch state dicts before), in every format;
- the next step after set_step uses the bias correction of that step count;
- bad moments (wrong size, NaN/Inf, a negative variance, a parameter or moment
  that does not exist) and bad step counts raise with a message naming what
  was wrong and change nothing;
- lowbit.torch imports a torch.optim.AdamW state dict through these calls, and
  a bad one (NaN, wrong size, unknown parameter index) changes nothing;
- the plan agrees with what add_param allocates."""

import numpy as np
import pytest

import lowbit
import seeding
from float64_reference import update
from lowbit._plan import plan_param_state

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16

SIZES = (5000, 300, 7)


def _opt(params, state, **kw):
    opt = lowbit.Optimizer("adamw", lr=1e-2, state=state, seed=5, **kw)
    opt.add_group(lr=3e-2, weight_decay=0.2)
    for i, p in enumerate(params):
        opt.add_param(p, group=i % 2)
    return opt


def _moments(rng):
    out = []
    for n in SIZES:
        m = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        v = (rng.standard_normal(n) ** 2 * 1e-6).astype(np.float32)
        out.append((m, v))
    return out


@pytest.mark.parametrize("state", ["fp32", "bf16", "8bit", "4bit", "fp8", "4bit-sr"])
def test_write_moment_equals_loading_a_materialized_checkpoint(state, rng):
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    moments = _moments(rng)
    steps = (7, 3, 12)
    with _opt([p.copy() for p in params], "fp32") as src:
        for i, (m, v) in enumerate(moments):
            src.write_moment(i, 0, m)
            src.write_moment(i, 1, v)
            src.set_step(steps[i], i)
            np.testing.assert_array_equal(src.read_moment(i, 0), m)  # fp32: exact
            np.testing.assert_array_equal(src.read_moment(i, 1), v)
        blob = src.save("fp32")
    via_load, via_write = [p.copy() for p in params], [p.copy() for p in params]
    with _opt(via_load, state) as a, _opt(via_write, state) as b:
        a.load(blob)
        for i, (m, v) in enumerate(moments):
            b.write_moment(i, 0, m)
            b.write_moment(i, 1, v)
            b.set_step(steps[i], i)
        assert a.save() == b.save()
        g = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
        a.step(g)
        b.step(g)
        assert a.save() == b.save()
    for x, y in zip(via_load, via_write):
        assert np.array_equal(x, y)


def test_set_step_sets_the_bias_correction(rng):
    p0 = rng.standard_normal(1000).astype(np.float32)
    g = rng.standard_normal(1000).astype(np.float32)
    with lowbit.Optimizer("adamw", lr=1e-2, weight_decay=0.0) as opt:
        p = p0.copy()
        opt.add_param(p)
        opt.set_step(9)
        assert opt.param_info(0).step == 9
        opt.step([g])
        assert opt.param_info(0).step == 10
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    expect, _, _ = update("adamw", hp, p0, g, t=10)  # zero moments, bias corrections of step 10
    np.testing.assert_allclose(p, expect, rtol=2e-6, atol=1e-7)


def test_bad_moments_and_steps_change_nothing(rng):
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    with _opt(params, "8bit") as opt:
        opt.step([rng.standard_normal(n).astype(np.float32) for n in SIZES])
        before = opt.save()
        good = np.ones(SIZES[0], np.float32)
        nan = good.copy()
        nan[17] = np.nan
        inf = good.copy()
        inf[3] = -np.inf
        neg = good.copy()
        neg[4] = -1.0
        cases = [
            (lambda: opt.write_moment(0, 0, good[:-1]), lowbit.InvalidArgumentError, "numel"),
            (lambda: opt.write_moment(0, 0, nan), lowbit.NonFiniteError, r"values\[17\]"),
            (lambda: opt.write_moment(0, 1, inf), lowbit.NonFiniteError, r"values\[3\]"),
            (lambda: opt.write_moment(0, 1, neg), lowbit.InvalidArgumentError, "negative"),
            (lambda: opt.write_moment(0, 2, good), lowbit.InvalidArgumentError, "moment"),
            (lambda: opt._call("lowbit_optimizer_set_step", -2, 3, None), lowbit.InvalidArgumentError, "param_id"),
            (lambda: opt.set_step(-1), lowbit.InvalidArgumentError, "step"),
        ]
        for fn, exc, needle in cases:
            with pytest.raises(exc, match=needle):
                fn()
            assert opt.save() == before
        with pytest.raises(lowbit.InvalidArgumentError, match="param_id"):
            opt.write_moment(3, 0, good)  # caught by the binding: no such param
        assert opt.save() == before


@pytest.mark.parametrize("state", ["fp32", "8bit", "4bit"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_plan_matches_add_param(state, dtype):
    for n in (1, 129, 4095, 4096, 70001):
        for flags in ({}, {"stochastic_rounding": True}, {"error_correction": True, "stochastic_rounding": True}):
            plan = plan_param_state(lowbit.Algorithm.ADAMW, n, lowbit.Dtype.BFLOAT16 if dtype is BF16 else
                                    lowbit.Dtype.FLOAT32, state_format=lowbit.StateFormat[
                                        {"fp32": "FP32", "8bit": "BIT8", "4bit": "BIT4"}[state]], **flags)
            with lowbit.Optimizer("adamw", state=state, **flags) as opt:
                opt.add_param(np.zeros(n, dtype))
                info = opt.param_info(0)
            assert plan.state_bytes == info.state_bytes
            assert [lowbit._optimizer.STATE_FORMAT_NAMES[f] for f in plan.formats] == [info.state_format,
                                                                                        info.second_state_format]
            assert (plan.rounding == lowbit.Rounding.ERROR_CORRECTION) == info.error_correction
            assert (plan.rounding == lowbit.Rounding.STOCHASTIC) == info.stochastic_rounding
    empty = plan_param_state(lowbit.Algorithm.SGD, 0, lowbit.Dtype.FLOAT32)
    assert empty.num_moments == 0 and empty.state_bytes == 0


torch = pytest.importorskip("torch")


def _model():
    torch.manual_seed(seeding.derive("test_moments._model"))  # also draws _torch_state's batch
    return torch.nn.Sequential(torch.nn.Linear(96, 80), torch.nn.Tanh(), torch.nn.Linear(80, 4))


def _torch_state():
    m = _model()
    o = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.05)
    x = torch.randn(64, 96)
    for _ in range(3):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    return o.state_dict()


@pytest.mark.parametrize("state", ["fp32", "8bit"])
def test_torch_import_uses_the_written_moments(state):
    import lowbit.torch as lt

    sd = _torch_state()
    m = _model()
    o = lt.AdamW(m.parameters(), state=state, min_quantized_numel=1024)
    o.load_state_dict(sd)
    for idx, p in enumerate(m.parameters()):
        assert o.param_info(p).step == 3
        ref = sd["state"][idx]["exp_avg_sq"].reshape(-1)
        got = o.read_moment(p, 1).reshape(-1)
        if o.param_info(p).state_format == "fp32":
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
        else:
            assert ((got - ref).norm() / ref.norm()).item() < 0.05


@pytest.mark.parametrize("defect", ["nan", "size", "index"])
def test_torch_import_of_bad_moments_changes_nothing(defect):
    import lowbit.torch as lt

    sd = _torch_state()
    m = _model()
    o = lt.AdamW(m.parameters(), state="8bit", min_quantized_numel=1024)
    o.load_state_dict(_torch_state())
    before = o.state_dict()["lowbit"]["handles"][0]["checkpoint"].clone()
    if defect == "nan":
        sd["state"][2]["exp_avg"][0, 0] = float("nan")
        exc, needle = lowbit.NonFiniteError, "not finite"
    elif defect == "size":
        sd["state"][1]["exp_avg_sq"] = sd["state"][1]["exp_avg_sq"][:-1]
        exc, needle = ValueError, "elements"
    else:
        sd["state"][7] = sd["state"][0]
        exc, needle = ValueError, "param index 7"
    with pytest.raises(exc, match=needle):
        o.load_state_dict(sd)
    assert torch.equal(o.state_dict()["lowbit"]["handles"][0]["checkpoint"], before)

"""Issue 46: LAMB (optax.lamb's rule: Adam's direction plus decoupled decay,
scaled by the per-tensor trust ratio ||p|| / ||u||), its step the fused step
to a workspace and the trust ratio's passes (trust/). Against a float64
reference: fp32 state free-running over 50 steps within 1e-5 relative; every
quantized state format and bf16 params with stochastic rounding or
error-correction bytes in lockstep (each step from the state as stored);
lowbit.torch.LAMB has the handle optimizer's bits; checkpoints resume with
the same bits; bad input gets an error naming it and changes nothing. The
optax comparison through lowbit.jax is tests/jax/test_jax_lamb.py. Seed:
LOWBIT_TEST_SEED."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit

SHAPES = [(64, 33), (4099,), (300,), (1,)]


def _reference_step(p, g, m, v, t, lr, b1, b2, eps, wd, bias_correction=True):
    """One float64 LAMB step (optax.lamb) of one tensor: new p, m, v."""
    p, g, m, v = (np.asarray(x, np.float64) for x in (p, g, m, v))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    bc1, bc2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1.0, 1.0)
    u = (m / bc1) / (np.sqrt(v / bc2) + eps) + wd * p
    pn, un = np.linalg.norm(p), np.linalg.norm(u)
    ratio = pn / un if pn > 0 and un > 0 else 1.0
    return p - lr * ratio * u, m, v


def _problem(rng, shapes=SHAPES, steps=50):
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[(0.1 + 0.05 * k) * rng.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)]
             for _ in range(steps)]
    return params, grads


HP = [dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0, bias_correction=True),
      dict(lr=5e-3, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.01, bias_correction=True),
      dict(lr=2e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1, bias_correction=False)]


@pytest.mark.parametrize("hp", HP, ids=["plain", "decay", "no-bias-correction"])
def test_fp32_state_follows_float64(rng, hp):
    params, grads = _problem(rng)
    params[3][...] = 0.0  # a zero param: its trust ratio is 1
    ref = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(r) for r in ref]
    v = [np.zeros_like(r) for r in ref]
    with lowbit.Optimizer("lamb", **hp) as opt:
        for p in params:
            opt.add_param(p)
        for t, gs in enumerate(grads, 1):
            opt.step(gs)
            for i, g in enumerate(gs):
                ref[i], m[i], v[i] = _reference_step(ref[i], g, m[i], v[i], t, hp["lr"], hp["beta1"], hp["beta2"],
                                                     hp["eps"], hp["weight_decay"], hp["bias_correction"])
        for i, (p, r) in enumerate(zip(params, ref)):
            scale = max(np.abs(r).max(), 1e-30)
            assert np.abs(p - r).max() / scale <= 1e-5, (i, np.abs(p - r).max() / scale)
            # the moments: fp32 EMAs of 50 steps (their rounding accumulates)
            assert np.allclose(opt.read_moment(i, 0), m[i], rtol=1e-4, atol=1e-7)
            assert np.allclose(opt.read_moment(i, 1), v[i], rtol=1e-4, atol=1e-10)


@pytest.mark.parametrize("state,second", [("bf16", None), ("8bit", None), ("4bit", None), ("fp8", None),
                                          ("4bit-dyn", None), ("4bit-sr", "4bit")])
def test_quantized_state_lockstep(rng, state, second):
    """Each step from the moments as stored: the param after it is the float64
    step's within fp32 rounding (the step updates the decoded moments, codes
    them, and takes its direction from the values before coding)."""
    params, grads = _problem(rng, steps=12)
    hp = HP[1]
    with lowbit.Optimizer("lamb", state=state, second_state=second, min_quantized_numel=0, **hp) as opt:
        for p in params:
            opt.add_param(p)
        for t, gs in enumerate(grads, 1):
            before = [(p.astype(np.float64), opt.read_moment(i, 0), opt.read_moment(i, 1))
                      for i, p in enumerate(params)]
            opt.step(gs)
            for i, g in enumerate(gs):
                p0, m0, v0 = before[i]
                want, _, _ = _reference_step(p0, g, m0, v0, t, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"],
                                             hp["weight_decay"])
                err = np.abs(params[i] - want).max() / max(np.abs(want).max(), 1e-30)
                assert err <= 1e-5, (state, t, i, err)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("mode", ["sr", "ecc"])
def test_bf16_params_lockstep(rng, mode):
    """bf16 params with stochastic rounding or error-correction bytes, 8-bit
    state: each stored param is the float64 step from the stored param and
    state within one bf16 ulp (SR: the rounding; ECC: the stored value is the
    exact param's nearest bf16, the exact param within half an ulp of it)."""
    import lowbit.torch as lt

    params, grads = _problem(rng, shapes=[(64, 96), (4099,)], steps=8)
    ps = [torch.nn.Parameter(torch.from_numpy(p).to(torch.bfloat16)) for p in params]
    opt = lt.LAMB(ps, lr=1e-2, weight_decay=0.01, state="8bit", min_quantized_numel=0,
                  stochastic_rounding=mode == "sr", error_correction=mode == "ecc")
    for gs in grads:
        before = []
        for p in ps:
            st = opt.state[p]
            m0 = st["exp_avg"].float() if "exp_avg" in st else torch.zeros(p.shape)
            v0 = st["exp_avg_sq"].float() if "exp_avg_sq" in st else torch.zeros(p.shape)
            t = int(st["step"]) if "step" in st else 0
            before.append((p.detach().double().numpy(), m0.double().numpy(), v0.double().numpy(), t))
        for p, g in zip(ps, gs):
            p.grad = torch.from_numpy(g).to(torch.bfloat16)
        opt.step()
        for k, p in enumerate(ps):
            p0, m0, v0, t = before[k]
            g = p.grad.double().numpy()
            want, _, _ = _reference_step(p0, g, m0, v0, t + 1, 1e-2, 0.9, 0.999, 1e-6, 0.01)
            got = p.detach().double().numpy()
            # one bf16 ulp of want (at least), and for ECC half of p0's: the exact param it started from
            ulp = (np.abs(want) + (0.5 * np.abs(p0) if mode == "ecc" else 0.0)) * 2.0**-7 * 1.01 + 1e-30
            assert (np.abs(got - want) <= ulp).all(), (mode, (np.abs(got - want) / ulp).max())


def test_torch_class_has_the_handle_optimizers_bits(rng):
    import lowbit.torch as lt

    params, grads = _problem(rng, steps=10)
    ps = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params]
    opt = lt.LAMB(ps, lr=5e-3, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.01, state="8bit", min_quantized_numel=0)
    ref_p = [p.copy() for p in params]
    with lowbit.Optimizer("lamb", lr=5e-3, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.01, state="8bit",
                          min_quantized_numel=0) as ref:
        for p in ref_p:
            ref.add_param(p)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = torch.from_numpy(g.copy())
            opt.step()
            ref.step(gs)
    for p, r in zip(ps, ref_p):
        assert np.array_equal(p.detach().numpy(), r)
    assert set(opt.state[ps[0]]) >= {"exp_avg", "exp_avg_sq"}


def test_checkpoint_resumes_with_the_same_bits(rng):
    params, grads = _problem(rng, steps=20)
    hp = HP[1]
    a = [p.copy() for p in params]
    with lowbit.Optimizer("lamb", state="4bit", min_quantized_numel=0, **hp) as opt:
        for p in a:
            opt.add_param(p)
        for gs in grads[:10]:
            opt.step(gs)
        blob = opt.save()
        b = [p.copy() for p in a]
        for gs in grads[10:]:
            opt.step(gs)
    with lowbit.Optimizer("lamb", state="4bit", min_quantized_numel=0, **hp) as opt2:
        for p in b:
            opt2.add_param(p)
        opt2.load(blob)
        for gs in grads[10:]:
            opt2.step(gs)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    # a LAMB checkpoint is not an AdamW optimizer's: refused, nothing changed
    c = [p.copy() for p in b]
    with lowbit.Optimizer("adamw", state="4bit", min_quantized_numel=0) as other:
        for p in c:
            other.add_param(p)
        other.step(grads[0])
        before = [other.read_moment(i, 0).copy() for i in range(len(c))]
        with pytest.raises(lowbit.LowbitError, match="(?i)algorithm|lamb"):
            other.load(blob)
        for i in range(len(c)):
            assert np.array_equal(other.read_moment(i, 0), before[i])


def test_nonfinite_grad_changes_nothing(rng):
    params, grads = _problem(rng, steps=3)
    with lowbit.Optimizer("lamb", state="8bit", min_quantized_numel=0) as opt:
        for p in params:
            opt.add_param(p)
        opt.step(grads[0])
        saved = [p.copy() for p in params]
        moments = [(opt.read_moment(i, 0).copy(), opt.read_moment(i, 1).copy()) for i in range(len(params))]
        bad = [g.copy() for g in grads[1]]
        bad[1][7] = np.nan
        opt.step(bad)
        assert opt.last_step_skipped
        for i, p in enumerate(params):
            assert np.array_equal(p, saved[i])
            assert np.array_equal(opt.read_moment(i, 0), moments[i][0])
            assert np.array_equal(opt.read_moment(i, 1), moments[i][1])


def test_bad_input_is_named():
    with pytest.raises(lowbit.LowbitError, match="eps"):
        lowbit.Optimizer("lamb", eps=0.0)
    with pytest.raises(lowbit.LowbitError, match="momentum"):
        lowbit.Optimizer("lamb", momentum=0.9)
    p = np.ones((8, 16), np.float32)
    with lowbit.Optimizer("lamb") as opt:
        with pytest.raises(lowbit.LowbitError, match="(?i)factor"):
            opt.add_param(p, second_normalization="factored")
        assert opt.num_params == 0

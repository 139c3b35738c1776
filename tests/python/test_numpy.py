"""The numpy path of lowbit.Optimizer against float64 references.

Tolerances: fp32 params with fp32 state are compared elementwise with the
float64 reference after 50 steps; the library computes in fp32, so each step
adds a few fp32 roundings (~6e-8 relative) to params of magnitude ~1 and to
moments - 2e-5 absolute / relative leaves a wide margin and still catches any
formula error (a wrong bias correction or decay is off by >1e-4 after a
handful of steps). 16-bit params are checked one step at a time from the
library's own state, to within one bf16/fp16 ulp (fp32 and float64 can land
on different sides of a rounding tie only within an ulp). Quantized states are
compared by relative L2 error with bounds measured with a 3x margin.
"""

import numpy as np
import pytest

import lowbit
from float64_reference import Reference, bf16_round, fp16_round, ulp16

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16

HP = {
    "adamw": dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1),
    "adam": dict(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05),
    "lion": dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.5),
    "sgd": dict(lr=5e-2, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": dict(lr=5e-2, momentum=0.8, dampening=0.0, nesterov=True, weight_decay=0.01),
    "sgd_plain": dict(lr=5e-2, weight_decay=0.02),
    "adamw_nobias": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, bias_correction=False),
}
ALGO = {"sgd_nesterov": "sgd", "sgd_plain": "sgd", "adamw_nobias": "adamw"}
SIZES = [1, 7, 4097]


def _make(name, state="fp32", **kw):
    hp = dict(HP[name])
    betas = (hp.pop("beta1"), hp.pop("beta2")) if "beta1" in hp else None
    return lowbit.Optimizer(ALGO.get(name, name), betas=betas, state=state, **hp, **kw)


def _num_moments(name):
    algo = ALGO.get(name, name)
    if algo in ("adamw", "adam"):
        return 2
    if algo == "lion" or HP[name].get("momentum", 0):
        return 1
    return 0


@pytest.mark.parametrize("name", list(HP))
def test_fp32_matches_float64_reference_over_50_steps(name, rng):
    algo = ALGO.get(name, name)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    grads = [np.zeros(n, np.float32) for n in SIZES]
    refs = [Reference(algo, p, **HP[name]) for p in params]
    lrs = HP[name]["lr"] * (1.0 + 0.5 * np.cos(np.arange(50) / 7.0))  # a schedule, set every step
    with _make(name) as opt:
        for p, g in zip(params, grads):
            opt.add_param(p, g)
        for t in range(50):
            opt.set_lr(lrs[t])
            for g in grads:
                g[...] = rng.standard_normal(g.shape).astype(np.float32)
            assert opt.step() is True
            for r, g in zip(refs, grads):
                r.step(g, lr=float(np.float32(lrs[t])))
        for i, (p, r) in enumerate(zip(params, refs)):
            info = opt.param_info(i)
            assert info.step == 50
            if algo == "lion":
                # sign(c) may differ between fp32 and float64 where c is ~0:
                # allow a rare flip, bounded by 2*lr per flipped step.
                bad = np.abs(p - r.p) > 2e-5
                assert bad.mean() <= 1e-3
                assert np.all(np.abs(p - r.p) <= 2 * lrs.max() * 50)
            else:
                np.testing.assert_allclose(p, r.p, rtol=2e-5, atol=2e-5)
            if _num_moments(name) >= 1:
                np.testing.assert_allclose(opt.read_moment(i, 0), r.m, rtol=2e-5, atol=2e-6)
            if _num_moments(name) == 2:
                np.testing.assert_allclose(opt.read_moment(i, 1), r.v, rtol=2e-5, atol=1e-9)


def test_groups_have_their_own_hparams(rng):
    a = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    ga, gb = np.zeros_like(a), np.zeros_like(b)
    hp_b = dict(lr=3e-2, beta1=0.5, beta2=0.9, eps=1e-6, weight_decay=0.3)
    ref_a, ref_b = Reference("adamw", a, **HP["adamw"]), Reference("adamw", b, **hp_b)
    with _make("adamw") as opt:
        g1 = opt.add_group(lr=hp_b["lr"], betas=(hp_b["beta1"], hp_b["beta2"]), eps=hp_b["eps"],
                           weight_decay=hp_b["weight_decay"])
        assert g1 == 1 and opt.num_groups == 2
        opt.add_param(a, ga)
        opt.add_param(b, gb, group=g1)
        got = opt.get_hparams(1)
        assert got["betas"] == (np.float32(0.5), np.float32(0.9)) and np.float32(got["lr"]) == np.float32(3e-2)
        for t in range(20):
            if t == 10:  # change one group's hyper-parameters mid-run
                opt.set_hparams(1, weight_decay=0.0, betas=(0.6, 0.95))
                hp_b.update(weight_decay=0.0, beta1=0.6, beta2=0.95)
                ref_b.hp.update(hp_b)
            ga[...] = rng.standard_normal(300)
            gb[...] = rng.standard_normal(300)
            opt.step()
            ref_a.step(ga)
            ref_b.step(gb)
        np.testing.assert_allclose(a, ref_a.p, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(b, ref_b.p, rtol=2e-5, atol=2e-5)
        assert opt.get_hparams(1)["weight_decay"] == 0.0


def test_step_with_grads_given_per_step_and_skipped_params(rng):
    p = [rng.standard_normal(n).astype(np.float32) for n in (5, 9)]
    refs = [Reference("adamw", x, **HP["adamw"]) for x in p]
    with _make("adamw") as opt:
        for x in p:
            opt.add_param(x)  # no registered grads
        for t in range(6):
            g0 = rng.standard_normal(5).astype(np.float32)
            g1 = rng.standard_normal(9).astype(np.float32)
            if t % 2:
                opt.step([g0, None])  # param 1 left alone on odd steps
                refs[0].step(g0)
            else:
                opt.step([g0, g1])
                refs[0].step(g0)
                refs[1].step(g1)
        assert opt.param_info(0).step == 6 and opt.param_info(1).step == 3
        for x, r in zip(p, refs):
            np.testing.assert_allclose(x, r.p, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("grad_dtype", [np.float16, BF16])
def test_16bit_grads_for_fp32_params(grad_dtype, rng):
    p = rng.standard_normal(1000).astype(np.float32)
    g = np.zeros(1000, dtype=grad_dtype)
    ref = Reference("adamw", p, **HP["adamw"])
    with _make("adamw") as opt:
        opt.add_param(p, g)
        for _ in range(10):
            g[...] = rng.standard_normal(1000).astype(grad_dtype)
            opt.step()
            ref.step(g.astype(np.float64))
        np.testing.assert_allclose(p, ref.p, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("algo", ["adamw", "sgd"])
def test_16bit_params_round_to_nearest_each_step(dtype, algo, rng):
    """Each step from the library's own state: compute in float64, round to
    the param dtype; the library's result is within one ulp, and equal for
    nearly every element."""
    np_dtype = BF16 if dtype == "bf16" else np.float16
    n = 3000
    p = rng.uniform(-2, 2, n).astype(np_dtype)
    g = np.zeros(n, np.float32)
    name = algo
    with _make(name) as opt:
        opt.add_param(p, g)
        ref = Reference(algo, p.astype(np.float64), **HP[name])
        exact, total = 0, 0
        for t in range(8):
            g[...] = rng.standard_normal(n)
            before = p.astype(np.float64)
            ref.p = before.copy()
            ref.t = t
            if _num_moments(name) >= 1:
                ref.m = opt.read_moment(0, 0).astype(np.float64)
            if _num_moments(name) == 2:
                ref.v = opt.read_moment(0, 1).astype(np.float64)
            ref.step(g)
            want = bf16_round(ref.p) if dtype == "bf16" else fp16_round(ref.p)
            opt.step()
            got = p.astype(np.float64)
            diff = np.abs(got - want)
            # one ulp of the result, plus the fp32 arithmetic of the library
            # (a few 2^-24 of the operands) where the result nearly cancels
            tol = ulp16(want, dtype) * 1.0001 + 2.0 ** -21 * (np.abs(before) + 0.1)
            assert np.all(diff <= tol), f"step {t}: worst excess {(diff - tol).max()}"
            exact += int((diff == 0).sum())
            total += n
        assert exact / total > 0.99


def test_uint16_bits_with_explicit_dtype_equal_bf16_arrays(rng):
    start = rng.standard_normal(2000).astype(BF16)
    grads = [rng.standard_normal(2000).astype(np.float32) for _ in range(5)]
    a = start.copy()
    bits = start.copy().view(np.uint16)
    with _make("adamw") as o1, _make("adamw") as o2:
        o1.add_param(a)
        o2.add_param(bits, dtype="bfloat16")
        assert o2.param_info(0).param_dtype == "bfloat16"
        for g in grads:
            o1.step([g])
            o2.step([g])
    assert np.array_equal(a.view(np.uint16), bits)
    assert not np.array_equal(a, start)


def test_error_correction_keeps_updates_smaller_than_an_ulp(rng):
    """Every update (~1e-3) is below half a bf16 ulp (2^-8 ~ 3.9e-3 on
    [1, 2)): plain rounding never moves the weights, while error correction
    accumulates the updates like an fp32 weight. The residual byte holds
    ulp/256 units, so each step rounds the update to ~3% of itself and the
    bf16 part is the nearest rounding of the (weight + residual) pair."""
    n = 4096
    start = rng.uniform(1.0, 2.0, n).astype(np.float32).astype(BF16)
    grads = [(0.5 + rng.random(n)).astype(np.float32) for _ in range(200)]
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def run(dtype, **flags):
        p = start.astype(dtype)
        with lowbit.Optimizer("adamw", **hp, **flags) as opt:
            opt.add_param(p)
            for g in grads:
                opt.step([g])
            return p.astype(np.float64), opt.param_info(0).error_correction, opt.state_bytes()

    s0 = start.astype(np.float64)
    fp32, _, _ = run(np.float32)
    rne, _, bytes_rne = run(BF16)
    ecc, ecc_on, bytes_ecc = run(BF16, error_correction=True)
    assert ecc_on and bytes_ecc == bytes_rne + n  # one extra byte per element
    assert np.array_equal(rne, s0)  # nearest rounding is stuck
    ulp = 2.0 ** -7
    assert np.all(fp32 - s0 < -20 * ulp / 2)  # fp32 moved by >10 ulps
    diff = np.abs(ecc - fp32)
    assert diff.max() <= 0.75 * ulp and diff.mean() <= 0.3 * ulp
    assert abs((ecc - s0).mean() / (fp32 - s0).mean() - 1.0) < 0.02


def test_stochastic_rounding_is_unbiased(rng):
    n = 20000
    start = np.ones(n, dtype=BF16)  # bf16 ulp above 1.0: 2^-7; below: 2^-8
    g = np.ones(n, np.float32)
    with lowbit.Optimizer("sgd", lr=1e-3, stochastic_rounding=True, seed=int(rng.integers(1 << 62))) as opt:
        p = start.copy()
        opt.add_param(p, g)
        assert opt.param_info(0).stochastic_rounding
        for _ in range(10):
            opt.step()
    got = p.astype(np.float64)
    assert len(np.unique(got)) > 1  # randomised, not all rounded the same way
    # fp32 trajectory: 1 - 10 * 1e-3; the mean of SR results is unbiased
    # (std of the mean ~ 2^-8 / sqrt(n) * sqrt(10) ~ 9e-5)
    assert abs(got.mean() - (1.0 - 10e-3)) < 5e-4
    with lowbit.Optimizer("sgd", lr=1e-3) as opt:
        p = start.copy()
        opt.add_param(p, g)
        for _ in range(10):
            opt.step()
    assert np.all(p.astype(np.float64) == 1.0)  # nearest rounding is stuck


def _expected_bytes(fmt, n):
    if fmt == "fp32":
        return 4 * n
    if fmt == "bf16":
        return 2 * n
    if fmt in ("8bit", "fp8"):
        return n + 4 * -(-n // 256)
    if fmt == "4bit":
        return -(-n // 2) + 4 * -(-n // 128)
    raise ValueError(fmt)


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "8bit", "4bit", "fp8"])
def test_state_bytes_per_format(fmt):
    sizes = [100, 4096, 10001]
    arrays = [np.zeros(n, np.float32) for n in sizes]
    with lowbit.Optimizer("adamw", state=fmt) as opt:
        for a in arrays:
            opt.add_param(a)
        quantized = fmt in ("8bit", "4bit", "fp8")
        want = 0
        for i, n in enumerate(sizes):
            eff = "fp32" if quantized and n < 4096 else fmt  # the size threshold
            assert opt.param_info(i).state_format == eff
            assert opt.state_bytes(i) == 2 * _expected_bytes(eff, n)
            want += 2 * _expected_bytes(eff, n)
        assert opt.state_bytes() == want
        small = np.zeros(100, np.float32)
        pid = opt.add_param(small, state=fmt)  # explicit: applies below the threshold
        assert opt.param_info(pid).state_format == fmt
        assert opt.state_bytes(pid) == 2 * _expected_bytes(fmt, 100)
    with lowbit.Optimizer("lion", state=fmt) as opt:
        opt.add_param(np.zeros(10001, np.float32))
        assert opt.state_bytes() == _expected_bytes(fmt, 10001)
        assert opt.param_info(0).second_state_format is None
    with lowbit.Optimizer("sgd", state=fmt) as opt:  # no momentum: no state
        opt.add_param(np.zeros(10001, np.float32))
        assert opt.state_bytes() == 0


def test_min_quantized_numel_and_second_state():
    with lowbit.Optimizer("adamw", state="8bit", second_state="bf16", min_quantized_numel=10) as opt:
        opt.add_param(np.zeros(20, np.float32))
        info = opt.param_info(0)
        assert (info.state_format, info.second_state_format) == ("8bit", "bf16")
        assert opt.state_bytes() == _expected_bytes("8bit", 20) + _expected_bytes("bf16", 20)


# Relative L2 errors (first moment, second moment, param change) after 50
# AdamW steps, gradient magnitudes spanning a factor ~60 inside each block,
# worst of 40 seeds:
#   bf16 0.004 0.007 0.002 | 8bit 0.028 0.019 0.026 | fp8 0.060 0.118 0.039 |
#   4bit 0.405 0.189 0.547 (16 codes per block of 128: a coarse state).
# The bounds are ~1.5x those. (Wider ranges inside a block make 8-bit and FP8
# second moments underflow to 0: see test_update_stays_bounded_when_a_second_
# moment_underflows.)
QUANT_BOUNDS = {"bf16": (0.006, 0.011, 0.004), "8bit": (0.042, 0.03, 0.04), "fp8": (0.09, 0.18, 0.06),
                "4bit": (0.6, 0.29, 0.82)}


@pytest.mark.parametrize("fmt", list(QUANT_BOUNDS))
def test_low_precision_state_tracks_the_reference(fmt, rng):
    n = 10000
    p = rng.standard_normal(n).astype(np.float32)
    p0 = p.astype(np.float64)
    g = np.zeros(n, np.float32)
    scale = np.exp(rng.uniform(-1.5, 1.5, n)).astype(np.float32)
    ref = Reference("adamw", p, **HP["adamw"])
    with _make("adamw", state=fmt) as opt:
        opt.add_param(p, g)
        assert opt.param_info(0).state_format == fmt
        for _ in range(50):
            sign = np.where(rng.random(n) < 0.65, 1.0, -1.0)
            g[...] = (scale * sign * rng.uniform(0.3, 1.5, n)).astype(np.float32)
            opt.step()
            ref.step(g)
        m, v = opt.read_moment(0, 0), opt.read_moment(0, 1)

    def rel(a, b):
        return np.linalg.norm(a - b) / np.linalg.norm(b)

    bm, bv, bp = QUANT_BOUNDS[fmt]
    assert rel(m, ref.m) < bm
    assert rel(v, ref.v) < bv
    assert rel(p - p0, ref.p - p0) < bp
    assert np.all(v >= 0)


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "8bit", "4bit", "fp8"])
def test_update_stays_bounded_when_a_second_moment_underflows(fmt):
    """One block: element 0 has gradient 1, the others 1e-4 at the first
    step and 0 at the second. Exact AdamW moves every weight by at most ~lr
    per step (|m_hat| <= sqrt(v_hat) here); a second moment decoded as 0
    while the first is not would give lr * m_hat / eps instead (~45 with lr
    1e-2). The library never stores a positive second moment as 0."""
    n = 256
    g1 = np.full(n, 1e-4, np.float32)
    g1[0] = 1.0
    g2 = np.zeros(n, np.float32)
    g2[0] = 1.0
    p = np.zeros(n, np.float32)
    with lowbit.Optimizer("adamw", lr=1e-2, weight_decay=0.0, state=fmt, min_quantized_numel=1) as opt:
        opt.add_param(p)
        opt.step([g1])
        assert np.abs(p).max() <= 1.01e-2
        before = p.copy()
        opt.step([g2])
    assert np.abs(p - before).max() <= 1.5e-2


def test_nonfinite_gradient_skips_the_whole_step(rng):
    a = rng.standard_normal(500).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    ga, gb = rng.standard_normal(500).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    with _make("adamw", state="8bit", min_quantized_numel=1) as opt:
        opt.add_param(a, ga)
        opt.add_param(b, gb)
        assert opt.step() is True and not opt.last_step_skipped
        before = (a.copy(), b.copy(), opt.save(), opt.read_moment(0, 1))
        for bad in (np.nan, np.inf, -np.inf):
            gb[7] = bad
            assert opt.step() is False
            assert opt.last_step_skipped
            assert np.array_equal(a, before[0]) and np.array_equal(b, before[1])
            assert opt.save() == before[2]
            assert opt.param_info(0).step == 1
        gb[7] = 0.5
        assert opt.step() is True
        assert opt.param_info(1).step == 2 and not np.array_equal(a, before[0])


def test_nonfinite_gradient_propagates_without_the_check():
    p = np.ones(10, np.float32)
    g = np.ones(10, np.float32)
    g[3] = np.nan
    with lowbit.Optimizer("sgd", lr=0.1, skip_nonfinite=False) as opt:
        opt.add_param(p, g)
        assert opt.step() is True
    assert np.isnan(p[3]) and np.all(np.isfinite(np.delete(p, 3)))


def test_read_moment_shape_and_buffers_are_used_in_place(rng):
    w = rng.standard_normal((3, 5, 7)).astype(np.float32)
    g = rng.standard_normal((3, 5, 7)).astype(np.float32)
    with lowbit.Optimizer("adamw", lr=0.1) as opt:
        pid = opt.add_param(w, g)
        assert opt.param(pid) is w
        w_id = w.__array_interface__["data"][0]
        opt.step()
        m = opt.read_moment(pid)
        assert m.shape == (3, 5, 7) and m.dtype == np.float32
        np.testing.assert_allclose(m, 0.1 * g, rtol=1e-6)
        assert w.__array_interface__["data"][0] == w_id
        g[...] = 0.0  # the registered buffer is read at each step
        opt.step()
        np.testing.assert_allclose(opt.read_moment(pid), 0.9 * m, rtol=1e-6)

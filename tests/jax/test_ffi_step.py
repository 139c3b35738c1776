"""The fused FFI step under jax.jit against float64 references and against the
C API (same bits for the same inputs)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")

from float64_reference import float32_hparams, ulp16, update  # noqa: E402
from fp32_bounds import SCALAR, U32, AdamMoments, fp32_sum_error, lowbit_adam_update  # noqa: E402
from jax_reference import CapiOptimizer, bf16_ecc_value, check_quantized, decode  # noqa: E402

import seeding  # noqa: E402

HPARAMS = {
    "adamw": dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1),
    "adam": dict(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05),
    "lion": dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1),
    "sgd": dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": dict(lr=0.05, momentum=0.8, nesterov=1, weight_decay=0.01),
}


def make_opt(ljax, algo, h, lr=None, **kw):
    lr = h["lr"] if lr is None else lr
    if algo == "adamw":
        return ljax.adamw(lr, b1=h["beta1"], b2=h["beta2"], eps=h["eps"], weight_decay=h["weight_decay"], **kw)
    if algo == "adam":
        return ljax.adam(lr, b1=h["beta1"], b2=h["beta2"], eps=h["eps"], weight_decay=h["weight_decay"], **kw)
    if algo == "lion":
        return ljax.lion(lr, b1=h["beta1"], b2=h["beta2"], weight_decay=h["weight_decay"], **kw)
    return ljax.sgd(lr, momentum=h["momentum"], nesterov=bool(h.get("nesterov", 0)),
                    dampening=h.get("dampening", 0.0), weight_decay=h["weight_decay"], **kw)


def base_algo(name):
    return "sgd" if name.startswith("sgd") else name


def random_tree(rng, shapes, dtype=np.float32):
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def bits(x):
    x = np.asarray(x)
    return x.view({4: np.uint32, 2: np.uint16}[x.dtype.itemsize])


def bf16_nearest(x):
    """float64 -> the nearest bfloat16 (ties to even) as float64, in one
    rounding (float64_reference.bf16_round goes through float32)."""
    x = np.asarray(x, np.float64)
    ulp = ulp16(x, "bf16")  # a power of two: x / ulp and the product are exact
    return np.round(x / ulp) * ulp  # np.round: half to even, and even quotients are even significands


def check_bf16_rounding(got, exact, delta, what):
    """Each bf16 value of `got` is the round-to-nearest-even of some x with
    |x - exact| <= delta. Rounding is monotone, so the x of that interval
    nearest to got is a witness if any x is."""
    got = np.asarray(got).astype(np.float64)
    witness = np.clip(got, exact - delta, exact + delta)
    bad = bf16_nearest(witness) != got
    assert not bad.any(), (f"{what}: {bad.sum()} bf16 values are no nearest rounding within the fp32 error "
                           f"of the float64 value, e.g. got {got[bad][:3]}, float64 {exact[bad][:3]}, "
                           f"fp32 error bound {np.broadcast_to(delta, got.shape)[bad][:3]}")


# ----------------------------------------------------------------- float64 references


@pytest.mark.parametrize("name", list(HPARAMS))
def test_fp32_state_matches_float64_reference(ljax, name, rng):
    algo, h = base_algo(name), HPARAMS[name]
    shapes = {"a": (5000,), "b": (33, 7), "c": (70001,)}  # "c" spans two engine chunks
    params = random_tree(rng, shapes)
    lr0 = h["lr"]
    opt = make_opt(ljax, algo, h, lr=lambda count: lr0 * (1.0 - 0.1 * count))  # a schedule under jit
    state = opt.init(jax.tree.map(jnp.asarray, params))
    step = jax.jit(opt.step)
    p_jax = jax.tree.map(jnp.asarray, params)
    ref = {k: (params[k].astype(np.float64), np.zeros(params[k].shape), np.zeros(params[k].shape)) for k in shapes}
    for t in range(4):
        grads = random_tree(rng, shapes)
        p_jax, state = step(p_jax, jax.tree.map(jnp.asarray, grads), state)
        ht = dict(h, lr=lr0 * (1.0 - 0.1 * t))
        ref = {k: update(algo, float32_hparams(ht), ref[k][0], grads[k], *ref[k][1:], t=t + 1) for k in shapes}
    assert int(state.count) == 4
    mu, nu = ljax.moments(state, p_jax)
    for k in shapes:
        p_ref, m_ref, v_ref = ref[k]
        np.testing.assert_allclose(np.asarray(p_jax[k]), p_ref, rtol=1e-5, atol=1e-6, err_msg=f"{name} param {k}")
        np.testing.assert_allclose(np.asarray(mu[k]), m_ref, rtol=1e-5, atol=1e-6, err_msg=f"{name} moment 0 {k}")  # terms are O(1)
        if algo in ("adamw", "adam"):
            np.testing.assert_allclose(np.asarray(nu[k]), v_ref, rtol=1e-5, atol=1e-9, err_msg=f"{name} moment 1")
        else:
            assert nu[k] is None


@pytest.mark.parametrize("fmt", ["8bit", "4bit", "fp8", "bf16"])
def test_low_bit_state_matches_float64_reference(ljax, fmt, rng):
    """Step 2 from the stored (quantized) state of step 1: the new param is
    the float64 update of the decoded state, and the new state is a nearest
    encoding (block scales = absmax) of the float64 moments.

    bf16: the library computes each moment in float32 and rounds it to the
    nearest bf16, so the stored value is the nearest bf16 of a value within
    the float32 error of the float64 moment: gamma_2 (m) or gamma_3 (v) times
    the sum of the absolute terms (fp32_bounds.fp32_sum_error). Where the
    terms nearly cancel (b1 m ~ -(1 - b1) g) that error is many bf16 ulps of
    the small result (LOWBIT_TEST_SEED=1172488837: m ~ -5e-8 from terms of
    5e-3); elsewhere it is ~2^-23 of the moment, and the check is the nearest
    bf16 up to ties within that distance."""
    algo, h = "adamw", HPARAMS["adamw"]
    n = 5000  # above the 4096 threshold; partial last block
    p0 = rng.standard_normal(n).astype(np.float32)
    g0, g1 = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    opt = make_opt(ljax, algo, h, state_format=fmt)
    state = opt.init(jnp.asarray(p0))
    step = jax.jit(opt.step)
    p1, state = step(jnp.asarray(p0), jnp.asarray(g0), state)
    snap = jax.tree.map(np.asarray, state)
    p2, state = step(p1, jnp.asarray(g1), state)

    m1 = decode(fmt, 0, snap.mu, snap.mu_scale, n)
    v1 = decode(fmt, 1, snap.nu, snap.nu_scale, n)
    p_ref, m_ref, v_ref = update(algo, float32_hparams(h), np.asarray(p1), g1, m1, v1, t=2)
    np.testing.assert_allclose(np.asarray(p2), p_ref, rtol=1e-5, atol=1e-6)
    if fmt == "bf16":
        hp = float32_hparams(h)
        b1, b2 = hp["beta1"], hp["beta2"]
        g = g1.astype(np.float64)
        # the float64 sums of the absolute terms: m = b1 m1 + (1 - b1) g, v = b2 v1 + (1 - b2) g g
        terms = ((state.mu, m_ref, b1 * np.abs(m1) + (1 - b1) * np.abs(g), 2),
                 (state.nu, v_ref, b2 * v1 + (1 - b2) * g * g, 3))
        for (got, exact, scale, k), name in zip(terms, ("m", "v")):
            check_bf16_rounding(np.asarray(got), exact, fp32_sum_error(k, scale), name)
    else:
        check_quantized(fmt, 0, state.mu, state.mu_scale, m_ref, n)
        check_quantized(fmt, 1, state.nu, state.nu_scale, v_ref, n)


def test_bf16_params_with_error_correction_track_float64(ljax, rng):
    """Updates far below one bf16 ulp: the (weight, ecc byte) pair follows the
    float64 trajectory to within ulp/256 per step, the ulp of the weight that
    step stored, plus the float32 arithmetic of the steps.

    Each step stores its float32 result p' as the pair: w = bf16(p') and the
    byte round((p' - w) / (ulp(w) / 256)), clamped to [-128, 127] (only +128,
    at a tie, is clamped), so the pair is within ulp(w) / 256 of p'; the next
    step reads the pair back exactly (16 significant bits). An error already
    in the weight is carried on multiplied by 1 - lr wd < 1. The bound is the
    sum over the steps of ulp(w_t) / 256, each step's own ulp (a weight that
    shrinks across binades, or crosses zero, stored earlier errors at a
    coarser ulp than its final one), plus the float32 rounding of the decay,
    of the update (fp32_bounds.lowbit_adam_update) and of the subtraction."""
    h = dict(HPARAMS["adamw"], lr=1e-4)
    hp = float32_hparams(h)
    n, steps = 6000, 5
    p0 = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    opt = make_opt(ljax, "adamw", h, error_correction=True)
    p = jnp.asarray(p0)
    state = opt.init(p)
    assert state.ecc.shape == (n,) and state.ecc.dtype == jnp.uint8
    step = jax.jit(opt.step)
    ref = (p0.astype(np.float64), np.zeros(n), np.zeros(n))
    decay = 1 - hp["lr"] * hp["weight_decay"]
    mom = AdamMoments(n, hp["beta1"], 1 - hp["beta1"], hp["beta2"], 1 - hp["beta2"])
    value = p0.astype(np.float64)  # the library's weight (the pair) before the step
    bound = np.zeros(n)
    for t in range(1, steps + 1):
        g = rng.standard_normal(n).astype(np.float32)
        p, state = step(p, jnp.asarray(g), state)
        ref = update("adamw", hp, ref[0], g, ref[1], ref[2], t=t)
        mom.step(g.astype(np.float64))
        _, q_err = lowbit_adam_update(mom, t, hp["lr"], hp["eps"])
        new_value, ulp = bf16_ecc_value(bits(p), np.asarray(state.ecc))
        decayed = np.abs(value) * decay * (SCALAR + U32 * (1 + SCALAR))  # fl(p * fl32(1 - lr wd))
        subtracted = U32 * (np.abs(new_value) + ulp / 256)  # fl(p1 - q); |p'| <= |pair| + ulp / 256
        bound = decay * bound + decayed + q_err + subtracted + ulp / 256
        value = new_value
    err = np.abs(value - ref[0])
    assert np.all(err <= bound), (err.max(), np.flatnonzero(err > bound)[:5])
    # The bf16 weights alone are off by about the accumulated update, which
    # is what error correction recovers.
    plain = np.abs(np.asarray(p).astype(np.float64) - ref[0])
    assert err.mean() < plain.mean() / 20


# ----------------------------------------------------------------- same bits as the C API

CAPI_CASES = {
    "adamw-fp32": dict(algo="adamw", fmt="fp32", dtype=np.float32, grad_dtype=np.float32, kw={}),
    "adamw-8bit": dict(algo="adamw", fmt="8bit", dtype=np.float32, grad_dtype=np.float32, kw={}),
    "adam-4bit/8bit-bf16-ecc": dict(algo="adam", fmt="4bit", second="8bit", dtype=ml_dtypes.bfloat16,
                                    grad_dtype=np.float32, kw=dict(error_correction=True)),
    "lion-fp8-fp16-sr": dict(algo="lion", fmt="fp8", dtype=np.float16, grad_dtype=ml_dtypes.bfloat16,
                             kw=dict(stochastic_rounding=True, seed=1234)),
    "sgd-bf16state-bf16-sr": dict(algo="sgd_nesterov", fmt="bf16", dtype=ml_dtypes.bfloat16,
                                  grad_dtype=ml_dtypes.bfloat16, kw=dict(stochastic_rounding=True, seed=99)),
    "adamw-8bit-all-sizes-fp16": dict(algo="adamw", fmt="8bit", dtype=np.float16, grad_dtype=np.float16,
                                      kw=dict(min_quantized_numel=0)),
}


@pytest.mark.parametrize("case", list(CAPI_CASES))
def test_same_bits_as_c_api(ljax, capi, case, seed):
    c = CAPI_CASES[case]
    name, algo, fmt = c["algo"], base_algo(c["algo"]), c["fmt"]
    h = HPARAMS[name]
    rng = seeding.rng(case, base=seed)  # a stream of its own for each case
    shapes = [(5000,), (33, 7), (70001,)]
    params = [rng.standard_normal(s).astype(c["dtype"]) for s in shapes]
    lrs = np.array([h["lr"], h["lr"] * 0.5, h["lr"] * 0.25, h["lr"] * 0.125], np.float32)

    kw = dict(c["kw"])
    second = c.get("second")
    if second:
        kw["second_state_format"] = second
    opt = make_opt(ljax, algo, h, lr=lambda count: jnp.asarray(lrs)[count], state_format=fmt, **kw)
    p_jax = [jnp.asarray(p) for p in params]
    state = opt.init(p_jax)
    step = jax.jit(opt.step)

    config = dict(state_format=fmt, seed=kw.get("seed", 0), stochastic_rounding=int(kw.get("stochastic_rounding", 0)),
                  error_correction=int(kw.get("error_correction", 0)),
                  min_quantized_numel=kw.get("min_quantized_numel", 4096))
    if second:
        config["second_state_format"] = second
    hp = {k: v for k, v in h.items()}
    ref = CapiOptimizer(capi, algo, hp, params, **config)
    try:
        applied = 0
        for t in range(4):
            grads = [rng.standard_normal(s).astype(c["grad_dtype"]) for s in shapes]
            if t == 2:  # a non-finite gradient: both skip the whole step
                grads[1].reshape(-1)[5] = np.nan
            ref.set_lr(lrs[applied])
            ref.step(grads)
            p_jax, state = step(p_jax, [jnp.asarray(g) for g in grads], state)
            applied += t != 2
        assert int(state.count) == applied == 3
        mu, nu = ljax.moments(state, p_jax)
        layout = np.asarray(state.layout)
        for i in range(len(shapes)):
            np.testing.assert_array_equal(bits(p_jax[i]).reshape(-1), bits(ref.params[i]), err_msg=f"param {i}")
            info = ref.info(i)
            assert info.step == applied
            assert (info.state_format, info.second_state_format) == (layout[i, 0], layout[i, 1]), i
            assert info.error_correction == (layout[i, 2] == 2) and info.stochastic_rounding == (layout[i, 2] == 1)
            nbytes = sum(np.asarray(x[i]).nbytes for x in (state.mu, state.mu_scale, state.nu, state.nu_scale,
                                                            state.ecc) if x[i] is not None)
            assert nbytes == info.state_bytes, (i, nbytes, info.state_bytes)
            for m, tree in enumerate((mu, nu)):
                if tree[i] is None:
                    continue
                np.testing.assert_array_equal(bits(np.asarray(tree[i]).reshape(-1)), bits(ref.read_moment(i, m)),
                                              err_msg=f"param {i} moment {m}")
    finally:
        ref.close()


# ----------------------------------------------------------------- step behaviour


def test_nonfinite_gradient_skips_everything(ljax, rng):
    params = {"w": jnp.asarray(rng.standard_normal((80, 64)), jnp.float32), "b": jnp.zeros(64, jnp.bfloat16)}
    opt = ljax.adamw(1e-2, state_format="8bit", error_correction=True)
    state = opt.init(params)
    step = jax.jit(opt.step)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    params, state = step(params, grads, state)
    before = jax.tree.map(np.asarray, (params, state))
    bad = dict(grads, b=grads["b"].at[3].set(jnp.inf))
    p2, s2 = step(params, bad, state)
    after = jax.tree.map(np.asarray, (p2, s2))
    assert int(s2.count) == 1
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(x, y)
    p3, s3 = step(p2, grads, s2)
    assert int(s3.count) == 2 and not np.array_equal(np.asarray(p3["w"]), np.asarray(p2["w"]))


def test_donated_step_updates_in_place(ljax):
    p = jnp.ones((10000,), jnp.float32)
    g = jnp.full((10000,), 0.5, jnp.float32)
    opt = ljax.adamw(1e-2, state_format="4bit")
    state = opt.init(p)
    step = jax.jit(opt.step, donate_argnums=(0, 2))
    ptrs = (p.unsafe_buffer_pointer(), state.mu.unsafe_buffer_pointer(), state.nu_scale.unsafe_buffer_pointer())
    p2, s2 = step(p, g, state)
    assert (p2.unsafe_buffer_pointer(), s2.mu.unsafe_buffer_pointer(), s2.nu_scale.unsafe_buffer_pointer()) == ptrs
    np.testing.assert_allclose(np.asarray(p2), 1.0 * (1 - 1e-2 * 1e-4) - 1e-2, rtol=1e-6)


def test_state_round_trips_through_numpy(ljax, rng):
    """The state is plain arrays: saving and restoring it resumes bit for bit."""
    params = {"w": jnp.asarray(rng.standard_normal((4100,)), jnp.bfloat16)}
    opt = ljax.lion(1e-3, state_format="8bit", stochastic_rounding=True, seed=5)
    state = opt.init(params)
    step = jax.jit(opt.step)
    grads = [{"w": jnp.asarray(rng.standard_normal((4100,)), jnp.float32)} for _ in range(4)]
    for g in grads[:2]:
        params, state = step(params, g, state)
    leaves, treedef = jax.tree.flatten((params, state))
    saved = [np.array(x) for x in leaves]
    restored = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in saved])
    a, b = (params, state), restored
    for g in grads[2:]:
        a = step(a[0], g, a[1])
        b = step(b[0], g, b[1])
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_state_layout_and_sizes(ljax):
    params = {"big": jnp.zeros((300, 20)), "small": jnp.zeros((10,)), "half": jnp.zeros((4097,), jnp.float16)}
    s = ljax.adamw(1e-3, state_format="4bit", error_correction=True).init(params)
    assert s.mu["big"].shape == (3000,) and s.mu["big"].dtype == jnp.uint8
    assert s.mu_scale["big"].shape == (47,)  # ceil(6000 / 128)
    assert s.mu["small"].dtype == jnp.float32 and s.mu["small"].shape == (10,)  # under the threshold
    assert s.mu["half"].shape == (2049,) and s.ecc["half"].shape == (4097,) and s.ecc["big"] is None
    assert s.mu_scale["small"] is None  # absent parts are None: no array to dispatch
    layout = {k: tuple(v) for k, v in zip(sorted(params), np.asarray(s.layout).tolist())}
    flat = (1, 1, 0) + (0,) * 8  # block normalisations, no bound shape
    assert layout == {"big": (4, 4, 0) + flat, "half": (4, 4, 2) + flat, "small": (1, 1, 0) + flat}
    s = ljax.sgd(0.1).init(params)  # no momentum: no moments
    assert jax.tree.leaves((s.mu, s.nu, s.mu_scale, s.nu_scale, s.ecc)) == []
    s = ljax.lion(1e-4, state_format="bf16").init(params)
    assert s.mu["small"].dtype == jnp.bfloat16 and s.nu["small"] is None


def test_state_with_zero_size_parts_from_older_lowbit(ljax, rng):
    """Earlier lowbit held absent parts as zero-size arrays: such a state steps
    to the same bits as one with None there, and keeps its structure (a
    lax.fori_loop carry needs the same tree in and out)."""
    params = {"w": jnp.asarray(rng.standard_normal((5000,)), jnp.float32),
              "h": jnp.asarray(rng.standard_normal((4500,)), jnp.bfloat16),
              "b": jnp.asarray(rng.standard_normal((9,)), jnp.float32)}
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
    opt = ljax.adamw(1e-2, state_format="8bit", error_correction=True)
    new = opt.init(params)
    assert new.ecc["w"] is None and new.mu_scale["b"] is None
    assert new.ecc["h"].shape == (4500,) and new.nu_scale["h"].size > 0
    old = new._replace(**{f: {k: jnp.zeros((0,), jnp.uint8 if f == "ecc" else jnp.float32) if v is None else v
                              for k, v in getattr(new, f).items()}
                          for f in ("mu", "mu_scale", "nu", "nu_scale", "ecc")})
    assert len(jax.tree.leaves(old)) == len(jax.tree.leaves(new)) + 4  # ecc w, b; mu_scale b; nu_scale b

    def steps(state):
        return jax.lax.fori_loop(0, 3, lambda i, c: opt.step(c[0], grads, c[1]), (params, state))

    p_new, s_new = jax.jit(steps)(new)
    p_old, s_old = jax.jit(steps)(old)
    assert jax.tree.structure(s_old) == jax.tree.structure(old)
    assert jax.tree.structure(s_new) == jax.tree.structure(new)
    assert s_old.ecc["w"].shape == (0,) and s_old.ecc["w"].dtype == jnp.uint8
    kept = [z for z in jax.tree.leaves((p_old, s_old)) if z.size]
    assert len(kept) == len(jax.tree.leaves((p_new, s_new)))
    for x, y in zip(jax.tree.leaves((p_new, s_new)), kept):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(p_new["w"]), np.asarray(params["w"]))
    mu_new, nu_new = ljax.moments(s_new, p_new)
    mu_old, nu_old = ljax.moments(s_old, p_old)
    for k in params:
        np.testing.assert_array_equal(np.asarray(mu_new[k]), np.asarray(mu_old[k]))
        np.testing.assert_array_equal(np.asarray(nu_new[k]), np.asarray(nu_old[k]))

"""Issue 46: the algorithms lowbit.jax makes from the library's descriptors
(RMSprop plain, with momentum and centred; Adagrad with lr_decay, weight
decay and initial_accumulator_value) step through the FFI handler with the
bits of the handle optimizer (lowbit.Optimizer, numpy) on the same inputs,
follow a float64 reference of torch.optim's rule (described_reference.py)
over 20 steps with fp32 and 8-bit state, take their signatures from the
descriptors, and bad input gets an error naming it. Seed: LOWBIT_TEST_SEED."""

import inspect

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import seeding  # noqa: E402
from described_reference import update  # noqa: E402
from expect_errors import fails  # noqa: E402
from jax_reference import MAPS, codes_of  # noqa: E402

CASES = {
    "rmsprop": ("rmsprop", dict(lr=1e-2, alpha=0.99, eps=1e-8)),
    "rmsprop-momentum": ("rmsprop", dict(lr=5e-3, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.9)),
    "rmsprop-centered": ("rmsprop", dict(lr=5e-3, alpha=0.95, eps=1e-8, centered=True)),
    "adagrad": ("adagrad", dict(lr=5e-2, lr_decay=1e-3, weight_decay=0.01, initial_accumulator_value=0.1,
                                eps=1e-10)),
}
SHAPES = {"b": (300,), "w": (48, 96)}  # jax flattens a dict in sorted key order
STEPS = 20


def _opt(ljax, name, hp, **settings):
    kw = {("learning_rate" if k == "lr" else k): v for k, v in hp.items()}
    return getattr(ljax, name)(**kw, min_quantized_numel=0, **settings)


def _problem(case):
    rng = seeding.rng("jax-described", case)
    params = {k: (0.5 * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)]
    return params, grads


def _tree(x):
    return jax.tree_util.tree_map(jnp.asarray, x)


@pytest.mark.parametrize("fmt", ["fp32", "8bit"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_bits_as_the_handle_optimizer(ljax, case, fmt):
    import lowbit

    name, hp = CASES[case]
    params, grads = _problem(case)
    opt = _opt(ljax, name, hp, state_format=fmt)
    p = _tree(params)
    state = opt.init(p)
    step = jax.jit(opt.step)
    ref_p = {k: v.copy() for k, v in params.items()}
    ref_g = {k: np.zeros_like(v) for k, v in params.items()}
    with lowbit.Optimizer(name, lr=hp["lr"], state=fmt, min_quantized_numel=0) as ref:
        ref.set_hparams(0, **hp)  # the described fields by name, before the params are planned
        for k in sorted(SHAPES):
            ref.add_param(ref_p[k], ref_g[k])
        for g in grads:
            for k in g:
                ref_g[k][...] = g[k]
            ref.step()
            p, state = step(p, _tree(g), state)
        mu, nu = opt.moments(state, p)
        for i, k in enumerate(sorted(SHAPES)):
            assert np.array_equal(np.asarray(p[k]), ref_p[k]), (case, fmt, k)
            for m, tree in enumerate((mu, nu)):
                if tree[k] is not None:
                    assert np.array_equal(np.asarray(tree[k]), ref.read_moment(i, m)), (case, fmt, k, m)
    assert int(state.count) == STEPS
    n_moments = sum(x is not None for x in (mu["w"], nu["w"]))
    assert n_moments == (2 if hp.get("momentum") or hp.get("centered") else 1), (case, n_moments)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_state_follows_the_float64_reference(ljax, case):
    """Free-running: the float64 reference keeps its own state. Each step's
    float32 roundings are a few units of 2^-24 of the values they round; over
    20 steps the params stay within 2e-6 of the reference relative to their
    size plus their total move (measured with the default seed: at most
    3.2e-7, RMSprop with momentum)."""
    name, hp = CASES[case]
    params, grads = _problem(case)
    opt = _opt(ljax, name, hp, state_format="fp32")
    p = _tree(params)
    state = opt.init(p)
    step = jax.jit(opt.step)
    ref = {k: (np.asarray(v, np.float64), None) for k, v in params.items()}
    h32 = {k: float(np.float32(v)) for k, v in hp.items()}  # the library holds float32 hyper-parameters
    for t, g in enumerate(grads, 1):
        p, state = step(p, _tree(g), state)
        ref = {k: update(name, h32, ref[k][0], g[k], ref[k][1], t=t) for k in ref}
    for k in SHAPES:
        want = ref[k][0]
        moved = np.abs(want - params[k]).max()
        err = np.abs(np.asarray(p[k], np.float64) - want).max()
        assert err <= 2e-6 * (np.abs(want).max() + moved), (case, k, err, moved)
    mu, nu = opt.moments(state, p)
    np.testing.assert_allclose(np.asarray(mu["w"]), ref["w"][1][0], rtol=1e-5, atol=1e-12)


def _check_codes(kind, data, scales, exact, n, what):
    """The stored 8-bit slot is a nearest code of `exact` on the map of its
    kind (signed or unsigned dynamic), block absmax scales; an unsigned slot
    keeps a positive value off code 0 (its floor: the least positive code)."""
    values = MAPS["unsigned_dynamic_8bit" if kind == "unsigned" else "signed_dynamic_8bit"]
    nb = -(-n // 256)
    pad = np.zeros(nb * 256)
    pad[:n] = np.abs(exact)
    np.testing.assert_allclose(np.asarray(scales, np.float64), pad.reshape(nb, 256).max(axis=1), rtol=2e-6,
                               err_msg=f"{what}: block scales")
    s = np.repeat(np.asarray(scales, np.float64), 256)[:n]
    x = np.divide(exact, s, out=np.zeros(n), where=s > 0)
    got = values[codes_of("8bit", data, n)]
    nearest = values[np.abs(x[:, None] - values[None, :]).argmin(axis=1)]
    floor = (kind == "unsigned") & (x > 0) & (nearest == 0) & (got == values[values > 0].min())
    bad = (np.abs(x - got) > np.abs(x - nearest) + 1e-6) & ~floor
    assert not bad.any(), f"{what}: {bad.sum()} of {n} codes are not nearest, e.g. x={x[bad][:3]} got {got[bad][:3]}"


def _decayed_grad_error(name, hp, t, g, p, slots):
    """What the library's float32 rounding of the L2-decayed gradient g + wd p
    (two roundings of terms as large as |g| and wd |p|: relative to the sum
    it is large where they cancel) moves the new param by, through the
    step's sensitivity to the gradient, lr_t / denominator."""
    if name == "adagrad":
        lr_t = hp["lr"] / (1 + (t - 1) * hp.get("lr_decay", 0.0))
        denom = np.sqrt(slots[0]) + hp["eps"]
    else:
        lr_t = hp["lr"]
        var = slots[0] - (slots[1] ** 2 if hp.get("centered") else 0.0)
        denom = np.sqrt(np.maximum(var, 0.0)) + hp["eps"]
    return lr_t * 2.0**-22 * (np.abs(g) + hp.get("weight_decay", 0.0) * np.abs(p)) / denom


@pytest.mark.parametrize("case", sorted(CASES))
def test_8bit_state_steps_as_the_float64_reference(ljax, case):
    """Lockstep: every step starts the float64 reference from lowbit's
    decoded 8-bit state; the new params follow it to float32 rounding (with
    the rounding of the decayed gradient, _decayed_grad_error) and the
    stored moments are nearest codes of its new moments, each on its slot's
    map (RMSprop's square average and Adagrad's sum: the unsigned map)."""
    from lowbit._algorithms import algorithm_specs

    name, hp = CASES[case]
    kinds = algorithm_specs()[name].moment_kinds
    params, grads = _problem(case)
    opt = _opt(ljax, name, hp, state_format="8bit")
    p = _tree(params)
    state = opt.init(p)
    step = jax.jit(opt.step)
    h32 = {k: float(np.float32(v)) for k, v in hp.items()}
    for t, g in enumerate(grads, 1):
        slots = opt.moments(state, p)
        before = {k: np.asarray(p[k], np.float64) for k in SHAPES}
        p, state = step(p, _tree(g), state)
        parts = ((state.mu, state.mu_scale), (state.nu, state.nu_scale))
        for k in SHAPES:
            old = [None if s[k] is None else np.asarray(s[k], np.float64).reshape(-1) for s in slots]
            want_p, want_m = update(name, h32, before[k].reshape(-1), g[k].reshape(-1), old, t=t)
            got = np.asarray(p[k], np.float64).reshape(-1)
            tol = 4e-7 * (np.abs(want_p) + np.abs(want_p - before[k].reshape(-1))) + 1e-9
            tol += _decayed_grad_error(name, h32, t, g[k].reshape(-1), before[k].reshape(-1), want_m)
            assert (np.abs(got - want_p) <= tol).all(), (case, t, k, np.abs(got - want_p).max())
            for m, (data, scales) in enumerate(parts):
                if slots[m][k] is not None:
                    _check_codes(kinds[m], data[k], scales[k], want_m[m], want_p.size, f"{case} t={t} {k} slot {m}")


def test_signatures_and_defaults_from_the_descriptors(ljax):
    from lowbit._algorithms import algorithm_specs

    specs = algorithm_specs()
    for name in ("rmsprop", "adagrad"):
        assert name in ljax.__all__ and callable(getattr(ljax, name))
        sig = inspect.signature(getattr(ljax, name)).parameters
        names = [("learning_rate" if h.name == "lr" else h.name) for h in specs[name].hparams]
        assert list(sig)[: len(names)] == names, (name, list(sig))
        for h in specs[name].hparams:
            want = h.default
            got = sig["learning_rate" if h.name == "lr" else h.name].default
            assert np.float32(got) == np.float32(want), (name, h.name, got, want)
    # torch.optim's positional order: RMSprop(lr, alpha, eps, weight_decay, momentum, centered)
    opt = ljax.rmsprop(3e-3, 0.9, 1e-6, 0.0, 0.5)
    assert opt.config.hparam("alpha") == 0.9 and opt.config.momentum == 0.5 and opt.config.centered is False
    assert "second_state_format" not in inspect.signature(ljax.adagrad).parameters  # one moment


def _small(ljax):
    p = {"w": jnp.ones((16,), jnp.float32)}
    return p, {"w": jnp.full((16,), 0.5, jnp.float32)}


def test_bad_input_is_named(ljax):
    import lowbit

    with pytest.raises(lowbit.UnsupportedError, match=r"lowbit.jax.rmsprop: .*centered = 1 with momentum = 0.9: RMSprop would keep three moments"):
        ljax.rmsprop(1e-2, momentum=0.9, centered=True)
    with pytest.raises(lowbit.InvalidArgumentError, match=r"lowbit.jax.rmsprop: .*alpha"):
        ljax.rmsprop(1e-2, alpha=1.5)
    with pytest.raises(lowbit.InvalidArgumentError, match=r"lowbit.jax.adagrad: .*lr_decay"):
        ljax.adagrad(1e-2, lr_decay=-1.0)
    with pytest.raises(lowbit.InvalidArgumentError, match=r"lowbit.jax.adagrad: .*initial_accumulator_value"):
        ljax.adagrad(1e-2, initial_accumulator_value=float("nan"))
    with pytest.raises(lowbit.InvalidArgumentError, match=r"centered=2 must be a bool"):
        ljax.rmsprop(1e-2, centered=2)
    with pytest.raises(TypeError, match=r"lowbit.jax.adagrad: .*'betas'"):
        ljax.adagrad(1e-2, betas=(0.9, 0.99))
    with pytest.raises(lowbit.InvalidArgumentError, match=r"preset of AdamW"):
        ljax.rmsprop(1e-2, state_format="4bit-rank1")


def _raw_call(ljax, algorithm, names, values):
    """A hand-written call of the step (protocol 5) on one fp32 param of 16
    elements with one fp32 moment."""
    ljax._MODULE.load()
    n = 16
    layout = jnp.asarray(np.array([[1, 0, 0, 1, 0, 0] + [0] * 8], np.int32))
    args = [jnp.float32(1e-2), jnp.int32(0), layout, jnp.ones(n, jnp.float32), jnp.full(n, 0.5, jnp.float32),
            jnp.zeros(n, jnp.float32)]
    outs = [jax.ShapeDtypeStruct((), jnp.int32)] + [jax.ShapeDtypeStruct((n,), jnp.float32)] * 2
    attrs = dict(algorithm=np.int32(algorithm), hparam_names=names, hparam_values=np.array(values, np.float64),
                 weight_decay=np.array([0.0], np.float32), formats=np.array([1, 0], np.int32),
                 rounding=np.array([0], np.int32), normalizations=np.array([1, 0], np.int32), seed=np.uint64(0),
                 skip_nonfinite=np.int32(0), num_threads=np.int32(1), names="w", parts=np.array([1], np.int32))
    call = jax.ffi.ffi_call("lowbit_step", outs, input_output_aliases={1: 0, 3: 1, 5: 2})
    return lambda: jax.jit(lambda *a: call(*a, **attrs))(*args)


def test_raw_calls_with_bad_algorithms_and_hparams(ljax):
    good = _raw_call(ljax, 10, "lr_decay\ninitial_accumulator_value\neps", [0.0, 0.1, 1e-10])()
    assert int(good[0]) == 1 and bool(jnp.all(good[1] < 1)) and bool(jnp.all(good[2] > 0))  # one Adagrad step
    fails(r"algorithm = 42 is not an algorithm of this library \(adamw \(1\), .*rmsprop \(9\), adagrad \(10\)",
          _raw_call(ljax, 42, "eps", [1e-10]))
    fails(r"algorithm = 5 \(onebit_adam\) is a distributed optimizer", _raw_call(ljax, 5, "eps", [1e-8]))
    fails(r"hparam_names: 'beta1' is not a hyper-parameter of adagrad \(its: lr_decay, initial_accumulator_value, "
          r"eps\)", _raw_call(ljax, 10, "beta1", [0.9]))
    fails(r"hparam_names: 'lr' travels as input 0", _raw_call(ljax, 10, "lr", [0.1]))
    fails(r"hparam_names: 'eps' is given twice", _raw_call(ljax, 10, "eps\neps", [1e-10, 1e-10]))
    fails(r"hparam_values has 2 values but hparam_names \(1 names\) takes 1", _raw_call(ljax, 10, "eps", [1, 2]))
    fails(r"lr_decay", _raw_call(ljax, 10, "lr_decay", [-1.0]))  # out of range: lowbit_hparams_check's message
    fails(r"centered = 0.5 must be an integer", _raw_call(ljax, 9, "centered", [0.5]))
    fails(r"centered = 1 with momentum = 0.9: RMSprop would keep three moments", _raw_call(ljax, 9, "centered\nmomentum", [1, 0.9]))


def test_moments_read_each_slot_with_its_kind(ljax):
    """RMSprop's square average is an unsigned slot 0: read with the
    algorithm (opt.moments, or moments(..., algorithm=)) it is the handle
    optimizer's; read with the default kinds (slot 0 signed, as AdamW's) it
    is not. A bad algorithm is named."""
    import lowbit

    name, hp = CASES["rmsprop"]
    params, grads = _problem("rmsprop-kinds")
    opt = _opt(ljax, name, hp, state_format="8bit")
    p = _tree(params)
    state = opt.init(p)
    for g in grads[:3]:
        p, state = opt.step(p, _tree(g), state)
    mine = np.asarray(opt.moments(state, p)[0]["w"])
    assert np.array_equal(mine, np.asarray(ljax.moments(state, p, algorithm="rmsprop")[0]["w"]))
    assert (mine >= 0).all() and (mine > 0).mean() > 0.99  # a square average, its floor keeps it off 0
    assert not np.array_equal(mine, np.asarray(ljax.moments(state, p)[0]["w"]))
    with pytest.raises(lowbit.InvalidArgumentError, match=r"algorithm='rmsprob' is not one of .*rmsprop"):
        ljax.moments(state, p, algorithm="rmsprob")
    fails(r"algorithm = 42 is not an algorithm of this library", lambda: ljax.moments(state, p, algorithm=42))

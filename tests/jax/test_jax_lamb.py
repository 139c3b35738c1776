"""Issue 46: LAMB through lowbit.jax (the FFI handler's functional step with
the trust-ratio driver): 50 steps with fp32 state within 1e-5 relative of
optax.lamb on the same inputs, and the bits of the handle optimizer
(lowbit.Optimizer) with fp32 and 8-bit state. Seed: LOWBIT_TEST_SEED."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy

import seeding  # noqa: E402

SHAPES = {"b": (300,), "w": (48, 96)}  # jax flattens a dict in sorted key order


def _problem(case, steps):
    rng = seeding.rng("jax-lamb", case)
    params = {k: (0.5 * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()} for _ in range(steps)]
    return params, grads


def _tree(x):
    return jax.tree_util.tree_map(jnp.asarray, x)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_matches_optax_lamb(ljax, wd):
    params, grads = _problem(f"optax-{wd}", 50)
    opt = ljax.lamb(learning_rate=1e-2, weight_decay=wd, min_quantized_numel=0)
    p = _tree(params)
    state = opt.init(p)
    step = jax.jit(opt.step)
    ref = optax.lamb(learning_rate=1e-2, b1=0.9, b2=0.999, eps=1e-6, weight_decay=wd)
    q = _tree(params)
    rstate = ref.init(q)
    for g in grads:
        p, state = step(p, _tree(g), state)
        updates, rstate = ref.update(_tree(g), rstate, q)
        q = optax.apply_updates(q, updates)
    for k in SHAPES:
        a, b = np.asarray(p[k]), np.asarray(q[k])
        rel = np.abs(a - b).max() / np.abs(b).max()
        assert rel <= 1e-5, (k, wd, rel)


@pytest.mark.parametrize("fmt", ["fp32", "8bit"])
def test_same_bits_as_the_handle_optimizer(ljax, fmt):
    import lowbit

    params, grads = _problem(fmt, 15)
    hp = dict(lr=5e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01)
    opt = ljax.lamb(learning_rate=hp["lr"], beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01, state_format=fmt,
                    min_quantized_numel=0)
    p = _tree(params)
    state = opt.init(p)
    step = jax.jit(opt.step)
    ref_p = {k: v.copy() for k, v in params.items()}
    with lowbit.Optimizer("lamb", state=fmt, min_quantized_numel=0, **hp) as ref:
        for k in sorted(SHAPES):
            ref.add_param(ref_p[k])
        for g in grads:
            ref.step([g[k] for k in sorted(SHAPES)])
            p, state = step(p, _tree(g), state)
        for k in sorted(SHAPES):
            assert np.array_equal(np.asarray(p[k]), ref_p[k]), (fmt, k)
    assert int(state.count) == len(grads)

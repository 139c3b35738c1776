"""Bad input: an XLA error carrying the handler's message (never a crash), or
a Python error at build/init time for what Python can see; on a GPU, a step
that changes nothing for what is checked in device data (expect_errors.py)."""

import numpy as np
import pytest

import seeding
from expect_errors import ON_GPU, fails, refused

jax = pytest.importorskip("jax")
jnp = jax.numpy


def setup(ljax, fmt="8bit", n=5000, **kw):
    rng = seeding.rng("test_jax_errors.setup")
    params = {"w": jnp.asarray(rng.standard_normal(n), jnp.float32), "b": jnp.zeros((7,), jnp.float32)}
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    opt = ljax.adamw(1e-3, state_format=fmt, **kw)
    return opt, params, grads, opt.init(params)


def test_state_of_another_format(ljax):
    _, params, grads, state = setup(ljax, "8bit")
    other = ljax.adamw(1e-3, state_format="fp8")  # same sizes as 8-bit: only the layout tells them apart
    refused(r"param \['w'\] \(leaf 1\): the state was created with \(moment 0: 8bit.*"
            r"this optimizer uses \(moment 0: fp8", lambda: jax.jit(other.step)(params, grads, state), params, state)


def test_state_of_another_size(ljax):
    opt, params, grads, _ = setup(ljax)
    state = opt.init({"w": jnp.zeros(4096), "b": jnp.zeros(7)})
    fails(r"state mu is uint8\(4096,\) but the 8bit format of a 5000-element param needs uint8\(5000,\)",
          lambda: jax.jit(opt.step)(params, grads, state))


def test_state_scales_of_another_size(ljax):
    opt, params, grads, state = setup(ljax)
    bad = state._replace(nu_scale=dict(state.nu_scale, w=jnp.zeros(3, jnp.float32)))
    fails(r"state nu_scale is float32\(3,\) but .* needs float32\(20,\)", lambda: opt.step(params, grads, bad))


def test_grad_dtype(ljax):
    opt, params, grads, state = setup(ljax)
    bad = dict(grads, w=grads["w"].astype(jnp.int32))
    fails(r"grad of param \['w'\] \(leaf 1\) has dtype int32", lambda: jax.jit(opt.step)(params, bad, state))


def test_grad_shape(ljax):
    opt, params, grads, state = setup(ljax)
    bad = dict(grads, b=jnp.ones((7, 1), jnp.float32))
    fails(r"grad of param \['b'\] \(leaf 0\) has shape \(7, 1\) but the param has shape \(7,\)",
          lambda: jax.jit(opt.step)(params, bad, state))


def test_param_dtype_changed_since_init(ljax):
    """Error-correction bytes exist for 16-bit params only: a state made for
    fp32 params does not fit bf16 ones."""
    opt, params, grads, state = setup(ljax, error_correction=True)
    half = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    # the CPU handler compares the recorded layout first; on CUDA (layout
    # checked on the device) the missing error-correction bytes are the error
    match = (r"state ecc is absent .* error correction of this param needs uint8" if ON_GPU else
             r"created with .*rounding: nearest.* uses .*rounding: error-correction")
    fails(match, lambda: jax.jit(opt.step)(half, grads, state))


@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf")])
def test_bad_learning_rate_from_schedule(ljax, lr):
    opt = ljax.adamw(lambda count: jnp.float32(lr) + 0 * count)
    params = {"w": jnp.ones(10)}
    state = opt.init(params)
    refused(r"lr = (-1|nan|inf) must be finite and >= 0", lambda: jax.jit(opt.update)(params, state, params),
            params, state, update=True)


def test_corrupted_count(ljax):
    opt, params, grads, state = setup(ljax)
    bad = state._replace(count=jnp.int32(-3))
    refused(r"state.count = -3", lambda: opt.step(params, grads, bad), params, bad)


def test_layout_of_another_tree(ljax):
    opt, params, grads, state = setup(ljax)
    fails(r"state.layout has shape \(3, 3\)",
          lambda: opt.step(params, grads, state._replace(layout=jnp.zeros((3, 3), jnp.int32))))


def test_python_side_errors(ljax):
    opt, params, grads, state = setup(ljax)
    with pytest.raises(ValueError, match="grads does not have the structure of the params"):
        opt.step(params, {"w": grads["w"]}, state)
    with pytest.raises(ValueError, match="needs params"):
        opt.update(grads, state)
    with pytest.raises(TypeError, match="dtype int32"):
        opt.init({"w": jnp.zeros(3, jnp.int32)})
    with pytest.raises(ValueError, match="beta2 = 1 must be in"):
        ljax.adamw(1e-3, b2=1.0)
    with pytest.raises(ValueError, match="eps = 0 must be finite and > 0"):
        ljax.adam(1e-3, eps=0.0)
    with pytest.raises(ValueError, match="nesterov = 1 requires momentum > 0"):
        ljax.sgd(0.1, nesterov=True)
    with pytest.raises(ValueError, match="weight_decay = -0.1"):
        ljax.lion(1e-4, weight_decay=-0.1)
    with pytest.raises(ValueError, match="state_format='3bit' is not one of"):
        ljax.adamw(1e-3, state_format="3bit")
    with pytest.raises(ValueError, match="learning rate must be a scalar"):
        ljax.adamw(lambda c: jnp.ones(2)).step(params, grads, state)


def test_errors_leave_everything_usable(ljax):
    """A failed call changes nothing: the same arrays step normally after it."""
    opt, params, grads, state = setup(ljax)
    step = jax.jit(opt.step)
    fails("has dtype int32", lambda: step(params, dict(grads, w=grads["w"].astype(jnp.int32)), state))
    before = jax.tree.map(np.array, (params, state))
    p2, s2 = step(params, grads, state)
    after = jax.tree.map(np.array, (params, state))
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(x, y)
    assert int(s2.count) == 1


@pytest.mark.parametrize("absent", ["none", "zero-size"])
def test_a_needed_state_part_left_out(ljax, absent):
    # An absent part (None, or an empty array) does not travel to the handler;
    # it is rejected there for the format that needs it.
    opt, params, grads, state = setup(ljax)
    bad = state._replace(mu_scale=dict(state.mu_scale, w=None if absent == "none" else jnp.zeros((0,), jnp.float32)))
    fails(r"state mu_scale is absent \(None or zero-size\) but the 8bit format of a 5000-element param needs "
          r"float32\(20,\)", lambda: jax.jit(opt.step)(params, grads, bad))


def test_a_part_the_format_does_not_have(ljax):
    opt, params, grads, state = setup(ljax)
    bad = state._replace(ecc=dict(state.ecc, w=jnp.zeros((5000,), jnp.uint8)))
    fails(r"state ecc is uint8\(5000,\) but .* needs none \(None\)", lambda: jax.jit(opt.step)(params, grads, bad))


def test_raw_call_with_a_bad_parts_attribute(ljax):
    # The handler checks the call protocol itself (a hand-written call).
    ljax._MODULE.load()
    n = 16
    layout = jnp.asarray(np.array([[1, 1, 0, 1, 1, 0] + [0] * 8], np.int32))
    args = [jnp.float32(1e-3), jnp.int32(0), layout, jnp.zeros(n, jnp.float32), jnp.ones(n, jnp.float32),
            jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.float32)]
    outs = [jax.ShapeDtypeStruct((), jnp.int32)] + [jax.ShapeDtypeStruct((n,), jnp.float32)] * 3
    attrs = dict(algorithm=np.int32(1), hparam_names="beta1\nbeta2\neps\nbias_correction",
                 hparam_values=np.array([0.9, 0.999, 1e-8, 1], np.float64),
                 weight_decay=np.array([0.0], np.float32), formats=np.array([1, 1], np.int32),
                 rounding=np.array([0], np.int32), normalizations=np.array([1, 1], np.int32), seed=np.uint64(0),
                 skip_nonfinite=np.int32(0), num_threads=np.int32(1), names="w")
    call = jax.ffi.ffi_call("lowbit_step", outs, input_output_aliases={1: 0, 3: 1, 5: 2, 6: 3})
    good = jax.jit(lambda *a: call(*a, parts=np.array([1 | 4], np.int32), **attrs))(*args)
    assert int(good[0]) == 1 and bool(jnp.all(good[1] < 0))  # one AdamW step on positive grads
    fails(r"parts\[0\] = 32 is not a mask of the 5 state parts",
          lambda: jax.jit(lambda *a: call(*a, parts=np.array([32], np.int32), **attrs))(*args))
    bad = jax.ffi.ffi_call("lowbit_step", outs, input_output_aliases={1: 0, 3: 1, 5: 2})
    fails(r"expected 7 inputs and 4 outputs for the parts attribute.*got 6 and 4",
          lambda: jax.jit(lambda *a: bad(*a, parts=np.array([1 | 4], np.int32), **attrs))(*args[:6]))

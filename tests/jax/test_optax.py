"""lowbit.jax as an optax GradientTransformation: fp32 state follows optax's
own optimizers to float tolerance, and 8-bit state trains a small model to
the same loss."""

import functools

import numpy as np
import pytest

import seeding
from fp32_bounds import (SCALAR, U32, AdamMoments, gamma, lowbit_adam_update, quotient_error, sqrt_error,
                         update_round_trip)

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy


def least_squares(instance):
    """Problem `instance` (a small int) of the run's seed."""
    rng = seeding.rng("least_squares", instance)
    a = jnp.asarray(rng.standard_normal((512, 64)) / 8, jnp.float32)
    b = jnp.asarray(rng.standard_normal((512, 96)), jnp.float32)
    params = {"w": jnp.asarray(rng.standard_normal((64, 96)) * 0.1, jnp.float32), "b": jnp.zeros((96,), jnp.float32)}

    def loss(p):
        return jnp.mean((a @ p["w"] + p["b"] - b) ** 2)

    return params, loss


# ----------------------------------------------------------------- lockstep comparison with optax
#
# Both optimizers take every step from the same params with the same gradient
# (computed once, at lowbit's params), each keeping its own state over the
# whole run; after each step their new params are compared element by element.
# Two free-running trajectories have no bound that holds for every problem:
# where a weight's gradient stays near zero (|g| ~ 1e-8, Adam's eps), Adam's
# normalised step m / (sqrt(v) + eps) turns the 1e-10 gradient differences
# that two float32 trajectories a few ulps apart see into an O(lr) difference
# of the step, and a Lion momentum near zero may flip the sign of an lr step;
# both then feed back into the other weights through the loss
# (LOWBIT_TEST_SEED=1899741242 for adam and 2780148492 for lion ended 3.5e-4
# and 2e-3 apart after 50 steps, both implementations being correct).
#
# The bound of each step is derived from the arithmetic (tests/jax/fp32_bounds.py):
# each implementation is modelled in float64 with its own float32 constants
# (lowbit: 1 - b of the float32 betas, bias corrections in double; optax:
# float32(1 - b) of the Python floats, its float32 1 - b ** count), and
#     |lowbit - optax| <= |model_lowbit - model_optax| + E_lowbit + E_optax
# where E bounds an implementation's float32 roundings against its model:
# running bounds on the moments, then every operation of the step, each one
# rounding of at most U32 relative to its result. The models differ by their
# constants (Adam's v by ~1.3e-5 relative: float32(0.001) against
# 1 - float32(0.999)); the E terms are some ulps of the weight plus, for Adam,
# lr times some 2^-24 (the moments' error bounds are multiples of the moving
# averages of |g| and g^2, whose ratio to sqrt(v) is bounded whatever the
# gradients: a near-zero gradient makes a near-zero error, relative to lr).
#
# Lion: sign(c) of a c within either implementation's float32 error of zero,
# or where their models disagree on its sign, is ambiguous: lowbit's step
# there may take any of the three outcomes (as the communicator tests treat
# their ambiguous elements), each checked against lowbit's model of it.


def f32(x):
    return float(np.float32(x))


@functools.lru_cache(maxsize=None)
def _optax_bias_correction(b):
    return jax.jit(lambda count: 1 - b**count)  # optax.tree.bias_correction's, in float32


def optax_bias_correction(b, t):
    """optax's float32 1 - b ** count for count t (the same expression and dtypes)."""
    return float(_optax_bias_correction(b)(jnp.asarray(t, jnp.int32)))


def decayed(p, d):
    """Model and bound of lowbit's fl(p * fl32(d)) for d = 1 - lr wd in (0, 1]
    (exact where d = 1)."""
    return p * d, (np.abs(p) * d * (SCALAR + U32 * (1 + SCALAR)) if d != 1 else np.zeros(p.shape))


def optax_descent(p, lr, x, x_err, wd=0.0):
    """Model and bound of optax's p + fl(-lr fl(x~ + fl(wd p))) (an alias's
    add_decayed_weights and scale_by_learning_rate, then optax.apply_updates)
    for |x~ - x| <= x_err; wd = 0: no decay term."""
    if wd:
        y = x + wd * p
        y_err = (x_err + U32 * wd * np.abs(p)) * (1 + U32) + U32 * np.abs(y)
    else:
        y, y_err = x, x_err
    new = p - lr * y
    return new, (lr * y_err * (1 + U32) + U32 * lr * np.abs(y)) * (1 + U32) + U32 * np.abs(new)


def lowbit_descent(p, p1, p1_err, q, q_err):
    """Model and bound of lowbit's fl(p1~ - q~), through update() and
    optax.apply_updates (from params p)."""
    new = p1 - q
    return new, update_round_trip(p, new, (p1_err + q_err) * (1 + U32) + U32 * np.abs(new))


class AdamLeaf:
    """lowbit's and optax's Adam / AdamW (decoupled weight decay wd) on one leaf."""

    def __init__(self, shape, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=True):
        assert decoupled or wd == 0, "Adam's L2 decay is not modelled (optax.adam has none)"
        self.b1, self.b2, self.eps, self.wd = b1, b2, eps, wd
        self.low = AdamMoments(shape, f32(b1), 1 - f32(b1), f32(b2), 1 - f32(b2))
        self.opt = AdamMoments(shape, f32(b1), f32(1 - b1), f32(b2), f32(1 - b2))

    def check(self, t, lr, p, g, g_err, got, want):
        lr, wd, eps = f32(lr), f32(self.wd), f32(self.eps)
        self.low.step(g, g_err)
        self.opt.step(g, g_err)
        # lowbit: p (1 - lr wd) - step_size m / (sqrt(v) inv_sqrt_bc2 + eps)
        p1, p1_err = decayed(p, 1 - lr * wd)
        q, q_err = lowbit_adam_update(self.low, t, lr, eps)
        low, low_err = lowbit_descent(p, p1, p1_err, q, q_err)
        # optax: m_hat / (sqrt(v_hat) + eps) (scale_by_adam), + wd p, * -lr, + p
        o = self.opt
        b1c, b2c = optax_bias_correction(self.b1, t), optax_bias_correction(self.b2, t)
        mh, mh_err = o.m / b1c, (o.em + U32 * (np.abs(o.m) + o.em)) / b1c
        vh, vh_err = o.v / b2c, (o.ev + U32 * (o.v + o.ev)) / b2c
        den = np.sqrt(vh) + eps
        den_err = sqrt_error(vh, vh_err) * (1 + U32) + U32 * den
        opt, opt_err = optax_descent(p, lr, mh / den, quotient_error(mh, mh_err, den, den_err), wd)
        return np.abs(got - want) <= np.abs(low - opt) + low_err + opt_err


class LionLeaf:
    """lowbit's and optax's Lion (decoupled weight decay wd) on one leaf."""

    def __init__(self, shape, b1=0.9, b2=0.99, wd=0.0):
        self.b1, self.wd = f32(b1), wd
        # c = b1 m + c1 g, then m = b2 m + c2 g, with each side's constants
        self.c1 = {"low": 1 - f32(b1), "opt": f32(1 - b1)}
        self.mom = {"low": AdamMoments(shape, f32(b2), 1 - f32(b2), 0.0, 0.0),
                    "opt": AdamMoments(shape, f32(b2), f32(1 - b2), 0.0, 0.0)}
        self.ambiguous = 0

    def check(self, t, lr, p, g, g_err, got, want):
        lr, wd, b1 = f32(lr), f32(self.wd), self.b1
        sign = {}
        for side, mom in self.mom.items():
            c1 = self.c1[side]
            c = b1 * mom.m + c1 * g
            c_err = (b1 * mom.em + c1 * g_err) * (1 + gamma(2)) + gamma(2) * (b1 * np.abs(mom.m) + c1 * np.abs(g))
            sign[side] = np.where(c - c_err > 0, 1.0, np.where(c + c_err < 0, -1.0, np.nan))  # nan: either
            mom.step(g, g_err)
        clear = sign["low"] == sign["opt"]  # false where either is nan
        self.ambiguous += int(np.sum(~clear))

        def lowbit_model(s):  # p (1 - lr wd) - lr s; lr s is exact
            p1, p1_err = decayed(p, 1 - lr * wd)
            return lowbit_descent(p, p1, p1_err, lr * s, 0.0)

        s = np.where(clear, sign["low"], 0.0)
        (low, low_err), (opt, opt_err) = lowbit_model(s), optax_descent(p, lr, s, 0.0, wd)
        ok = np.abs(got - want) <= np.abs(low - opt) + low_err + opt_err
        some_outcome = np.zeros(p.shape, bool)
        for s in (-1.0, 0.0, 1.0):
            model, err = lowbit_model(s)
            some_outcome |= np.abs(got - model) <= err
        return np.where(clear, ok, some_outcome)


class SgdLeaf:
    """lowbit's and optax's SGD (momentum, Nesterov; no dampening, no weight
    decay): the same formula with the same float32 constants on both sides,
    the trace fl(g + fl(mom m)) (the first step's is g on both), the step
    p - fl(lr x)."""

    def __init__(self, shape, momentum=0.0, nesterov=False):
        self.mom, self.nesterov = f32(momentum), nesterov
        self.m, self.em = np.zeros(shape), np.zeros(shape)

    def check(self, t, lr, p, g, g_err, got, want):
        assert np.all(g_err == 0), "a clipped gradient is not modelled"
        lr, mom = f32(lr), self.mom
        x, x_err = g, 0.0
        if mom:
            self.em = mom * self.em * (1 + gamma(2)) + gamma(2) * (mom * np.abs(self.m) + np.abs(g))
            self.m = mom * self.m + g
            x, x_err = self.m, self.em
            if self.nesterov:
                x = g + mom * self.m
                x_err = mom * self.em * (1 + gamma(2)) + gamma(2) * (mom * np.abs(self.m) + np.abs(g))
        new, opt_err = optax_descent(p, lr, x, x_err)  # p + fl(-lr x~) is lowbit's fl(p - fl(lr x~)) too
        low_err = update_round_trip(p, new, opt_err)
        return np.abs(got - want) <= low_err + opt_err


def lockstep(make_optax, make_lowbit, params, loss, steps, leaves, lr_at, clip=None):
    """Runs optax's and lowbit's optimizers in lockstep (see above), checking
    every step with leaves[k].check; returns the params after `steps`.
    lr_at(t): the float32 learning rate of step t, the same value on both
    sides (a constant, or the same schedule at the same count). clip: the
    max_norm of an optax.clip_by_global_norm ahead of both."""
    opts = [make_optax(), make_lowbit()]
    states = [opt.init(params) for opt in opts]
    grad = jax.jit(jax.grad(loss))

    def stepper(opt):
        @jax.jit
        def step(p, g, s):
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s

        return step

    steppers = [stepper(opt) for opt in opts]
    n = sum(x.size for x in jax.tree.leaves(params))
    p = params
    for t in range(1, steps + 1):
        g = grad(p)
        (want, states[0]), (got, states[1]) = (step(p, g, s) for step, s in zip(steppers, states))
        g64 = {k: np.asarray(g[k], np.float64) for k in p}
        g_rel = 0.0  # a relative error bound of the gradient both optimizers see
        if clip is not None:
            # optax.clip_by_global_norm passes t unchanged where its float32 norm is
            # below max_norm, certain for norm < max_norm / (1 + gamma_(n+1)) (n
            # squares summed in any order, the square root); else t / norm * max_norm
            norm = np.sqrt(sum(np.sum(x * x) for x in g64.values()))
            dn = gamma(n + 1)
            if norm >= clip / (1 + dn):
                g64 = {k: x * min(1.0, clip / norm) for k, x in g64.items()}
                g_rel = dn / (1 - dn) + 3 * U32
        for k in p:
            ok = leaves[k].check(t, lr_at(t), np.asarray(p[k], np.float64), g64[k], g_rel * np.abs(g64[k]),
                                 np.asarray(got[k], np.float64), np.asarray(want[k], np.float64))
            bad = lambda x: np.asarray(x[k])[~ok][:3]  # noqa: E731
            assert ok.all(), f"step {t}, {k}: lowbit {bad(got)}, optax {bad(want)} from {bad(p)}, gradient {bad(g)}"
        p = got
    return p


# name: optax's, lowbit's, the leaf model (leaf name, shape), the learning rate
OPTAX_PAIRS = {
    "adamw": (lambda o: o.adamw(1e-2, weight_decay=0.1), lambda l: l.adamw(1e-2, weight_decay=0.1),
              lambda k, shape: AdamLeaf(shape, wd=0.1), 1e-2),
    "adamw-mask": (lambda o: o.adamw(1e-2, weight_decay=0.1, mask={"w": True, "b": False}),
                   lambda l: l.adamw(1e-2, weight_decay=0.1, mask={"w": True, "b": False}),
                   lambda k, shape: AdamLeaf(shape, wd=0.1 if k == "w" else 0.0), 1e-2),
    "adam": (lambda o: o.adam(1e-2), lambda l: l.adam(1e-2), lambda k, shape: AdamLeaf(shape, decoupled=False), 1e-2),
    "lion": (lambda o: o.lion(1e-3, weight_decay=0.1), lambda l: l.lion(1e-3, weight_decay=0.1),
             lambda k, shape: LionLeaf(shape, wd=0.1), 1e-3),
    "sgd-nesterov": (lambda o: o.sgd(0.1, momentum=0.9, nesterov=True),
                     lambda l: l.sgd(0.1, momentum=0.9, nesterov=True),
                     lambda k, shape: SgdLeaf(shape, momentum=0.9, nesterov=True), 0.1),
    "sgd": (lambda o: o.sgd(0.1), lambda l: l.sgd(0.1), lambda k, shape: SgdLeaf(shape), 0.1),
}


@pytest.mark.parametrize("name", list(OPTAX_PAIRS))
def test_fp32_state_matches_optax_over_50_steps(ljax, name):
    """50 steps, each from the same params and gradient, each side with its
    own state: every step gives optax's params to within the float32 bound
    derived for the two implementations (see lockstep)."""
    make_optax, make_lowbit, make_leaf, lr = OPTAX_PAIRS[name]
    params, loss = least_squares(0)
    leaves = {k: make_leaf(k, x.shape) for k, x in params.items()}
    final = lockstep(lambda: make_optax(optax), lambda: make_lowbit(ljax), params, loss, 50, leaves,
                     lambda t: f32(lr))
    for k in params:
        moved = float(jnp.max(jnp.abs(final[k] - params[k])))
        assert moved > 1e-3, (k, moved)  # the comparison is not vacuous
    if name == "lion":
        ambiguous = sum(leaf.ambiguous for leaf in leaves.values())
        print(f"lion: {ambiguous} of 50 x {sum(x.size for x in params.values())} sign decisions ambiguous")


def test_chain_schedule_and_jit(ljax):
    """Inside optax.chain, with an optax schedule, under jit: the same as
    optax.chain(clip, adamw) with that schedule, step by step (see lockstep)."""
    params, loss = least_squares(1)
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 10, 50)
    sched_jit = jax.jit(sched)

    def lr_at(t):  # both evaluate the schedule at the count before the step
        return float(sched_jit(jnp.asarray(t - 1, jnp.int32)))

    leaves = {k: AdamLeaf(x.shape, wd=0.01) for k, x in params.items()}
    lockstep(lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(sched, weight_decay=0.01)),
             lambda: optax.chain(optax.clip_by_global_norm(0.5), ljax.adamw(sched, weight_decay=0.01)),
             params, loss, 30, leaves, lr_at, clip=0.5)


def test_update_and_step_agree(ljax):
    """update() returns new_params - params, so optax.apply_updates gives
    step()'s params: exactly where a weight changes by less than a factor of
    two (the subtraction is then exact), else to within one ulp of the larger
    of old and new."""
    params, loss = least_squares(2)
    opt = ljax.adamw(1e-3, state_format="8bit")
    g = jax.grad(loss)(params)
    s = opt.init(params)
    updates, s1 = jax.jit(opt.update)(g, s, params)
    p2, s2 = jax.jit(opt.step)(params, g, s)
    applied = optax.apply_updates(params, updates)
    for k in params:
        old, new, got = (np.asarray(x[k]) for x in (params, p2, applied))
        exact = (np.sign(old) == np.sign(new)) & (np.abs(new) / 2 <= np.abs(old)) & (np.abs(old) <= 2 * np.abs(new))
        exact |= old == 0
        assert exact.mean() > 0.9
        np.testing.assert_array_equal(got[exact], new[exact])
        scale = np.maximum(np.abs(old), np.abs(new))
        assert np.all(np.abs(got - new) <= np.spacing(scale))  # two roundings at the larger magnitude
    for x, y in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert isinstance(opt, optax.GradientTransformation)


# ----------------------------------------------------------------- training a small model


def classification(instance, n=16384, d=32, k=8, noise=0.2):
    """A teacher-network labelling with 20% label noise."""
    rng = seeding.rng("classification", instance)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = np.argmax(np.tanh(x @ rng.standard_normal((d, 64))) @ rng.standard_normal((64, k)), axis=1)
    flip = rng.random(n) < noise
    y[flip] = rng.integers(0, k, flip.sum())
    return jnp.asarray(x), jnp.asarray(y.astype(np.int32))


def mlp_init(instance, sizes=(32, 128, 128, 8)):
    rng = seeding.rng("mlp_init", instance)
    return {
        f"l{i}": {"w": jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a), jnp.float32), "b": jnp.zeros(b, jnp.float32)}
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
    }


def mlp_loss(params, x, y):
    h = x
    for i in range(len(params)):
        h = h @ params[f"l{i}"]["w"] + params[f"l{i}"]["b"]
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()


def train_mlp(opt, x, y, epochs, batch=512, instance=10):
    params = mlp_init(instance)
    state = opt.init(params)
    nb = x.shape[0] // batch
    xb, yb = x[: nb * batch].reshape(nb, batch, -1), y[: nb * batch].reshape(nb, batch)

    @jax.jit
    def epoch(params, state):
        def body(carry, b):
            p, s = carry
            g = jax.grad(mlp_loss)(p, *b)
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        return jax.lax.scan(body, (params, state), (xb, yb))[0]

    initial = float(mlp_loss(params, x, y))
    for _ in range(epochs):
        params, state = epoch(params, state)
    return initial, float(mlp_loss(params, x, y)), state


def test_8bit_state_trains_mlp_within_2_percent_of_optax(ljax):
    """MLP 32-128-128-8 (weights of 4096 and 16384 elements get 8-bit state,
    the 1024-element head and the biases stay fp32 by the threshold), 640
    AdamW steps of batch 512: the final training loss is within 2% of
    optax.adamw's."""
    x, y = classification(0)
    initial, want, _ = train_mlp(optax.adamw(2e-3, weight_decay=1e-2), x, y, epochs=20)
    _, got, state = train_mlp(ljax.adamw(2e-3, weight_decay=1e-2, state_format="8bit"), x, y, epochs=20)
    assert state.mu["l1"]["w"].dtype == jnp.uint8 and state.mu["l0"]["w"].dtype == jnp.uint8
    assert state.mu["l2"]["w"].dtype == jnp.float32
    print(f"\n8-bit AdamW MLP: initial loss {initial:.4f}, optax.adamw {want:.4f}, lowbit 8bit {got:.4f} "
          f"({100 * (got - want) / want:+.2f}%)")
    assert want < 0.6 * initial  # it trained
    assert abs(got - want) <= 0.02 * want

"""Error bounds of float32 arithmetic, for tests that compare float32 results
(lowbit's, optax's) with float64 values: every bound here follows from the
operations the implementation performs, each rounding at most one unit
roundoff relative to its result (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., chapters 2-3), so it holds for every input in the normal
range, not for a calibrated one.

    gamma(k, u)              k roundings: k u / (1 - k u)
    U32, SCALAR              the unit roundoffs used (see below)
    fp32_sum_error(k, s)     fl32(a x + b y) against the exact value
    AdamMoments              running bounds of the float32 moments of Adam
    lowbit_adam_update(...)  lowbit's float32 Adam update, q = step_size m / denom
    update_round_trip(...)   lowbit.jax's update() through optax.apply_updates

Nothing here imports lowbit or jax.
"""

import numpy as np

# Unit roundoff of the float32 roundings in the bounds, with a 2^-20 relative
# margin that covers the float64 evaluation of the references and of the
# bounds themselves (each a few roundings of 2^-53 relative to the same
# magnitudes, far below 2^-44).
U32 = 2.0**-24 * (1 + 2.0**-20)
# lowbit's per-step scalars (core/step_scalars.hpp: the step size, 1 / sqrt(1 -
# b2^t), 1 - lr wd) are computed in double and rounded once to float32: 2^-24
# plus the double error, below 2^-32 for condition numbers b^t / (1 - b^t) up
# to 1000 (b2 = 0.999 at t = 1) times a few roundings of 2^-53.
SCALAR = 2.0**-24 + 2.0**-32


def gamma(k, u=U32):
    """gamma_k = k u / (1 - k u): the relative error bound of a result that
    went through k roundings of unit roundoff u."""
    return k * u / (1 - k * u)


def fp32_sum_error(k, scale):
    """Bound on |fl32(a x + b y) - (a x + b y)| where each term passes through
    at most k float32 roundings (its products and the sum; with or without
    FMA), for scale = |a x| + |b y| in float64: gamma_k * scale (Higham 3.1).
    The float64 reference of a x + b y is within a few 2^-53 scale, covered
    by U32's margin."""
    return gamma(k) * scale


class AdamMoments:
    """The float64 moments of Adam, m = b1 m + c1 g and v = b2 v + c2 g^2,
    with running bounds em, ev on the float32 moments of an implementation
    that computes fl(fl(b1 m) + fl(c1 g)) and fl(fl(b2 v) + fl(c2 fl(g g)))
    (or fl(fl(c2 g) g); any order of the sum, with or without FMA): each term
    through at most 2 (m) or 3 (v) roundings, the previous error carried on
    multiplied by b. c1, c2 are the implementation's own float32 constants
    (lowbit: 1 - b, exact; optax: float32(1 - b) of the Python float).

    g_err: a bound on the float32 gradient's own error against the g given
    (0 where both are the same array)."""

    def __init__(self, shape, b1, c1, b2, c2):
        self.b1, self.c1, self.b2, self.c2 = b1, c1, b2, c2
        self.m, self.v = np.zeros(shape), np.zeros(shape)
        self.em, self.ev = np.zeros(shape), np.zeros(shape)

    def step(self, g, g_err=0.0):
        b1, c1, b2, c2 = self.b1, self.c1, self.b2, self.c2
        ag = np.abs(g)
        self.em = (b1 * self.em + c1 * g_err) * (1 + gamma(2)) + gamma(2) * (b1 * np.abs(self.m) + c1 * ag)
        self.ev = ((b2 * self.ev + c2 * g_err * (2 * ag + g_err)) * (1 + gamma(3)) +
                   gamma(2) * b2 * self.v + gamma(3) * c2 * ag * ag)
        self.m = b1 * self.m + c1 * g
        self.v = b2 * self.v + c2 * g * g


def quotient_error(num, num_err, den, den_err):
    """Bound on |fl(n~ / d~) - num / den| for |n~ - num| <= num_err and
    |d~ - den| <= den_err < den / 2 (den > 0)."""
    rho = den_err / den
    assert np.all(rho < 0.5), "the float32 denominator is not within half of its value"
    q = num / den
    return (num_err + np.abs(q) * den_err) / (den * (1 - rho)) * (1 + U32) + U32 * np.abs(q)


def sqrt_error(x, x_err):
    """Bound on |fl(sqrt(x~)) - sqrt(x)| for |x~ - x| <= x_err, x >= 0:
    |sqrt(x~) - sqrt(x)| = |x~ - x| / (sqrt(x~) + sqrt(x)) <= min(x_err / sqrt(x),
    sqrt(x_err)), then one rounding."""
    s = np.sqrt(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(s > 0, np.minimum(x_err / np.where(s > 0, s, 1), np.sqrt(x_err)), np.sqrt(x_err))
    return d * (1 + U32) + U32 * s


def lowbit_adam_update(mom, t, lr, eps):
    """lowbit's float32 update of step t (core/update_rules.hpp, compiled
    without FMA contraction), from the moments after the step (mom, an
    AdamMoments already stepped):
        q = fl(fl(step_size m) / fl(fl(fl(sqrt(v)) inv_sqrt_bc2) + eps))
    with step_size = lr / (1 - b1^t) and inv_sqrt_bc2 = 1 / sqrt(1 - b2^t)
    rounded from double (SCALAR). Returns (q, bound on |q~ - q|), q the
    float64 value of the same formula."""
    ss, ibc = lr / (1 - mom.b1**t), 1 / np.sqrt(1 - mom.b2**t)
    sv, sv_err = np.sqrt(mom.v), sqrt_error(mom.v, mom.ev)
    k = (1 + U32) * (1 + SCALAR)  # the rounding of inv_sqrt_bc2 and of the product
    den = ibc * sv + eps
    den_err = ibc * (sv_err * k + sv * (k - 1)) * (1 + U32) + U32 * den  # then the sum
    num_err = ss * (mom.em * k + np.abs(mom.m) * (k - 1))  # the rounding of step_size and of the product
    return ss * mom.m / den, quotient_error(ss * mom.m, num_err, den, den_err)


def update_round_trip(p, new, new_err):
    """lowbit.jax's update() returns fl(new~ - p) and optax.apply_updates adds
    it back, fl(p + fl(new~ - p)): two more roundings. For p exact and
    |new~ - new| <= new_err, the bound on the result's distance to new."""
    d = np.abs(new - p) + new_err
    return new_err + U32 * d + U32 * (np.abs(new) + new_err + U32 * d)

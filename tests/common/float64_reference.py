"""The float64 ground truth of the optimizer updates, shared by the Python
(tests/python) and JAX (tests/jax) suites.

Written from the formulas (PyTorch's AdamW / Adam / SGD, and Lion as in Chen
et al. 2023, the conventions the C header documents), not from lowbit's code:
nothing here imports lowbit, so a test that compares the library with these
functions checks the library against an independent reference.

    update(algorithm, hp, p, g, m, v, *, t) -> (p, m, v)
        One step in float64, without side effects. t is the number of this
        step, counting from 1 (the bias corrections use b1**t, b2**t, and SGD
        momentum starts as the first gradient at t == 1). m, v: the moments
        before the step (None: zeros, the state before the first step).
    float32_hparams(hp) -> dict
        Every hyper-parameter rounded to float32, as the C API stores it
        (1 - beta2 with beta2 = float32(0.999) differs from 0.001 by ~1e-5
        relative); pass the result to update() to follow the library's
        inputs exactly.
    Reference(algorithm, p, *, float32_hparams=False, **hp)
        One parameter's state (attributes p, m, v, t, hp, all public and
        writable) advanced by update(); step(g, **override) returns p.
    bf16_round(x), fp16_round(x), ulp16(x, dtype)
        Rounding to bfloat16 / float16 and the spacing of those formats, in
        float64.

Hyper-parameters (a dict): lr, weight_decay (default 0); beta1, beta2, eps
(AdamW/Adam), beta1, beta2 (Lion); momentum, dampening (default 0), nesterov
(default False) for SGD; bias_correction (AdamW/Adam, default True).
"""

import numpy as np

ALGORITHMS = ("adamw", "adam", "lion", "sgd")


def float32_hparams(hp):
    """The hyper-parameters as the C API holds them: each value rounded to
    float32 (returned as Python floats; flags become 0.0 / 1.0)."""
    return {k: float(np.float32(v)) for k, v in hp.items()}


def update(algorithm, hp, p, g, m=None, v=None, *, t):
    """One float64 step of `algorithm` for the step numbered t (t >= 1);
    returns the new (p, m, v). The inputs are not modified. m is the first
    moment (AdamW/Adam/Lion) or the momentum buffer (SGD), v the second
    moment (AdamW/Adam); a moment the algorithm does not use is returned as
    given (zeros where None was given)."""
    if t < 1:
        raise ValueError(f"t is the number of this step, counting from 1; got {t}")
    p = np.asarray(p, dtype=np.float64)
    g = np.array(g, dtype=np.float64)  # a copy: a moment may start as g itself
    m = np.zeros_like(p) if m is None else np.asarray(m, dtype=np.float64)
    v = np.zeros_like(p) if v is None else np.asarray(v, dtype=np.float64)
    lr, wd = hp["lr"], hp.get("weight_decay", 0.0)
    if algorithm in ("adamw", "adam"):
        b1, b2, eps = hp["beta1"], hp["beta2"], hp["eps"]
        if algorithm == "adamw":
            p = p * (1.0 - lr * wd)  # decoupled decay
        else:
            g = g + wd * p  # L2 decay, through the moments
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        if hp.get("bias_correction", True):
            step_size = lr / (1 - b1**t)
            denom = np.sqrt(v) / np.sqrt(1 - b2**t) + eps
        else:
            step_size = lr
            denom = np.sqrt(v) + eps
        return p - step_size * m / denom, m, v
    if algorithm == "lion":
        b1, b2 = hp["beta1"], hp["beta2"]
        c = b1 * m + (1 - b1) * g
        p = p * (1 - lr * wd) - lr * np.sign(c)
        m = b2 * m + (1 - b2) * g
        return p, m, v
    if algorithm == "sgd":
        mom, damp, nesterov = hp.get("momentum", 0.0), hp.get("dampening", 0.0), hp.get("nesterov", False)
        g = g + wd * p
        if mom != 0:
            m = g if t == 1 else mom * m + (1 - damp) * g
            g = g + mom * m if nesterov else m
        return p - lr * g, m, v
    raise ValueError(f"unknown algorithm {algorithm!r} (one of {ALGORITHMS})")


class Reference:
    """One parameter's float64 state for AdamW / Adam / Lion / SGD.

    p, m, v (float64 arrays), t (steps taken) and hp (the hyper-parameters)
    may be read and set between steps, e.g. to restart from a library's
    state. With float32_hparams=True every step rounds the hyper-parameters
    to float32 first (see float32_hparams())."""

    def __init__(self, algorithm, p, *, float32_hparams=False, **hp):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r} (one of {ALGORITHMS})")
        self.algorithm = algorithm
        self.p = np.array(p, dtype=np.float64)
        self.m = np.zeros_like(self.p)
        self.v = np.zeros_like(self.p)
        self.t = 0
        self.hp = dict(hp)
        self.float32_hparams = float32_hparams

    def step(self, g, **override):
        """Advance by one step with gradient g; `override` replaces
        hyper-parameters for this step only (e.g. a scheduled lr)."""
        hp = {**self.hp, **override}
        if self.float32_hparams:
            hp = float32_hparams(hp)
        self.t += 1
        self.p, self.m, self.v = update(self.algorithm, hp, self.p, g, self.m, self.v, t=self.t)
        return self.p


# ----------------------------------------------------------------- 16-bit formats


def bf16_round(x):
    """float64 -> nearest bfloat16 (ties to even), returned as float64.

    Rounds through float32 first: the result differs from a direct rounding of
    the float64 value only where that value lies within half a float32 ulp of
    a bfloat16 tie (never for float32 inputs)."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def fp16_round(x):
    """float64 -> nearest float16 (ties to even, one rounding), returned as float64."""
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def ulp16(x, dtype):
    """Spacing of the 16-bit format dtype ("bf16" or "fp16") at |x|, as float64
    (subnormals: the spacing of the smallest normal binade)."""
    x = np.abs(np.asarray(x, np.float64))
    if dtype == "bf16":
        e = np.floor(np.log2(np.maximum(x, 2.0**-126)))
        return 2.0 ** (e - 7)
    if dtype == "fp16":
        e = np.floor(np.log2(np.maximum(x, 2.0**-14)))
        return 2.0 ** (e - 10)
    raise ValueError(f"dtype must be 'bf16' or 'fp16', got {dtype!r}")

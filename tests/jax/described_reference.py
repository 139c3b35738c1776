"""The float64 ground truth of the algorithms added through the descriptors
(issue 46), written from torch.optim's documented rules, not from lowbit's
code (nothing here imports lowbit):

    update(name, hp, p, g, slots, *, t) -> (p, slots)

One step numbered t (t >= 1) of "rmsprop" or "adagrad"; `slots` are the
moments before the step in the library's slot order (RMSprop: square_avg,
then momentum_buffer or, centred, grad_avg; Adagrad: sum), None for zeros.
Adagrad's sum starts at initial_accumulator_value: its stored state is zero
before the first step, so at t == 1 the sum given is replaced by it.
Hyper-parameters by torch's names: lr, alpha, eps, weight_decay, momentum,
centered (RMSprop); lr, lr_decay, weight_decay, initial_accumulator_value,
eps (Adagrad)."""

import numpy as np


def update(name, hp, p, g, slots=None, *, t):
    if t < 1:
        raise ValueError(f"t counts from 1, got {t}")
    p = np.asarray(p, np.float64)
    g = np.asarray(g, np.float64) + hp.get("weight_decay", 0.0) * p  # L2 decay, as torch
    slots = [np.zeros_like(p) if s is None else np.asarray(s, np.float64) for s in (slots or [None, None])]
    if name == "rmsprop":
        alpha, eps, mom, centered = hp["alpha"], hp["eps"], hp.get("momentum", 0.0), bool(hp.get("centered"))
        sq = alpha * slots[0] + (1 - alpha) * g * g
        second = slots[1]
        if centered:
            second = second + (1 - alpha) * (g - second)  # torch: grad_avg.lerp_(grad, 1 - alpha)
            avg = np.sqrt(np.maximum(sq - second * second, 0.0)) + eps
        else:
            avg = np.sqrt(sq) + eps
        if mom > 0:
            second = mom * second + g / avg
            return p - hp["lr"] * second, [sq, second]
        return p - hp["lr"] * g / avg, [sq, second]
    if name == "adagrad":
        start = np.full_like(p, hp.get("initial_accumulator_value", 0.0)) if t == 1 else slots[0]
        s = start + g * g
        clr = hp["lr"] / (1 + (t - 1) * hp.get("lr_decay", 0.0))
        return p - clr * g / (np.sqrt(s) + hp["eps"]), [s, slots[1]]
    raise ValueError(f"unknown algorithm {name!r}")

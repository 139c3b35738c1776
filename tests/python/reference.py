"""Independent float64 references for the optimizer updates (PyTorch's
formulas), written for the tests: no lowbit code is used here."""

import numpy as np


def bf16_round(x):
    """float64 -> nearest bfloat16 (ties to even), returned as float64."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    # a float64 value can sit on a bf16 tie only after its own rounding to
    # fp32; values here are fp32-exact, so rounding twice is exact.
    return out


class Reference:
    """One parameter's float64 state for AdamW / Adam / Lion / SGD."""

    def __init__(self, algorithm, p, **hp):
        self.algorithm = algorithm
        self.p = np.asarray(p, dtype=np.float64).copy()
        self.m = np.zeros_like(self.p)
        self.v = np.zeros_like(self.p)
        self.t = 0
        self.hp = dict(hp)

    def step(self, g, **override):
        hp = {**self.hp, **override}
        g = np.asarray(g, dtype=np.float64)
        lr, wd = hp.get("lr"), hp.get("weight_decay", 0.0)
        self.t += 1
        if self.algorithm in ("adamw", "adam"):
            b1, b2, eps = hp["beta1"], hp["beta2"], hp["eps"]
            if self.algorithm == "adamw":
                self.p *= 1.0 - lr * wd
            else:
                g = g + wd * self.p
            self.m = b1 * self.m + (1 - b1) * g
            self.v = b2 * self.v + (1 - b2) * g * g
            if hp.get("bias_correction", True):
                step_size = lr / (1 - b1 ** self.t)
                denom = np.sqrt(self.v) / np.sqrt(1 - b2 ** self.t) + eps
            else:
                step_size = lr
                denom = np.sqrt(self.v) + eps
            self.p -= step_size * self.m / denom
        elif self.algorithm == "lion":
            b1, b2 = hp["beta1"], hp["beta2"]
            c = b1 * self.m + (1 - b1) * g
            self.p = self.p * (1 - lr * wd) - lr * np.sign(c)
            self.m = b2 * self.m + (1 - b2) * g
        elif self.algorithm == "sgd":
            mom, damp, nesterov = hp.get("momentum", 0.0), hp.get("dampening", 0.0), hp.get("nesterov", False)
            g = g + wd * self.p
            if mom != 0:
                self.m = g.copy() if self.t == 1 else mom * self.m + (1 - damp) * g
                g = g + mom * self.m if nesterov else self.m
            self.p -= lr * g
        else:
            raise ValueError(self.algorithm)
        return self.p

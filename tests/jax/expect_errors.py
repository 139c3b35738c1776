"""How the JAX tests expect bad input to be answered, on the CPU and on a GPU.

On a GPU JAX dispatches asynchronously: a handler's error surfaces when the
result is awaited, so each check awaits its call. What the handler reads from
device arrays (the lr of a schedule, state.count, the layout recorded in the
state) is checked by the engine on the device, where the host never waits: a
mismatch makes the step change nothing, count included, instead of raising
(`refused`)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

XlaError = getattr(jax.errors, "JaxRuntimeError", None) or jax.errors.XlaRuntimeError
ON_GPU = jax.default_backend() == "gpu"


def fails(match, call):
    """What the handler checks without reading device data (dtypes, shapes,
    attributes): an XLA error naming it, on every backend."""
    with pytest.raises(XlaError, match=match):
        jax.block_until_ready(call())


def refused(match, call, params, state, *, update=False):
    """What is checked in device data: on the CPU an XLA error naming it; on
    CUDA a step that changes nothing (the new params are the old ones, or
    update()'s updates are zeros; the state and its count are unchanged)."""
    if not ON_GPU:
        fails(match, call)
        return
    before_p, before_s = jax.tree.map(np.array, (params, state))
    out, new_state = jax.block_until_ready(call())
    for x in jax.tree.leaves(out) if update else []:
        assert not np.any(np.asarray(x)), "a refused update() must return zero updates"
    pairs = ([] if update else list(zip(jax.tree.leaves(before_p), jax.tree.leaves(out))))
    pairs += list(zip(jax.tree.leaves(before_s), jax.tree.leaves(new_state)))
    for x, y in pairs:
        np.testing.assert_array_equal(x, np.asarray(y))

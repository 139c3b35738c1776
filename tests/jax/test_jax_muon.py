"""lowbit.jax.muon: the step through liblowbit_jax gives the bits of the
handle optimizer (lowbit.Optimizer("muon"), the engine the C tests check
against torch.optim.Muon and a float64 reference) for every state format and
Newton-Schulz precision, with the products of LOWBIT_MATMUL=auto and =builtin; optax's update path and the Muon + AdamW hybrid
through optax.partition; 1-D leaves refused."""

import numpy as np
import pytest

import lowbit
import seeding

jax = pytest.importorskip("jax")
jnp = jax.numpy

if not hasattr(lowbit.Algorithm, "MUON"):
    pytest.skip("the loaded liblowbit has no Muon (lowbit < 0.7)", allow_module_level=True)

SHAPES = {"a": (48, 48), "b": (80, 24), "c": (24, 80), "d": (8, 4, 6)}


@pytest.mark.parametrize("products", ["auto", "builtin"])
@pytest.mark.parametrize("prec", ["fp32", "bf16"])
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "8bit", "4bit"])
def test_muon_gives_the_handle_optimizers_bits(ljax, fmt, prec, products, monkeypatch):
    # LOWBIT_MATMUL (read at every step): "builtin" is what runs the bf16
    # products on a CPU without oneDNN's bf16 matmul (AVX2 hosts)
    monkeypatch.setenv("LOWBIT_MATMUL", products)
    rng = seeding.rng("jax-muon", fmt, prec)
    params = {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}
    hp = dict(weight_decay=0.05, momentum=0.9, nesterov=True, ns_steps=5)
    opt = ljax.muon(0.02, adjust_lr_fn="match_rms_adamw", ns_precision=prec, state_format=fmt,
                    min_quantized_numel=0, **hp)
    state = opt.init(jax.tree_util.tree_map(jnp.asarray, params))
    ref_p = {k: v.copy() for k, v in params.items()}
    ref_g = {k: np.zeros_like(v) for k, v in params.items()}
    norm = "rank1" if fmt in ("8bit", "4bit") else None  # lowbit.jax.muon's choice for 8-bit / 4-bit
    with lowbit.Optimizer("muon", lr=0.02, adjust_lr="match_rms_adamw", ns_precision=prec, state=fmt,
                          min_quantized_numel=0, first_normalization=norm, **hp) as ref:
        for k in sorted(SHAPES):  # jax flattens a dict in sorted key order
            ref.add_param(ref_p[k], ref_g[k])
        p = jax.tree_util.tree_map(jnp.asarray, params)
        for _ in range(4):
            g = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
            for k in g:
                ref_g[k][...] = g[k]
            ref.step()
            p, state = opt.step(p, jax.tree_util.tree_map(jnp.asarray, g), state)
        for i, k in enumerate(sorted(SHAPES)):
            assert np.array_equal(np.asarray(p[k]), ref_p[k]), k
            mu, _ = ljax.moments(state, p)
            assert np.array_equal(np.asarray(mu[k]), ref.read_moment(i)), k
    assert int(state.count) == 4


def test_muon_update_and_hybrid_through_optax(ljax):
    optax = pytest.importorskip("optax")
    rng = seeding.rng("jax-muon-hybrid")
    x = jnp.asarray(rng.standard_normal((256, 16)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((256, 4)), jnp.float32)
    params = {"w1": jnp.asarray(rng.standard_normal((16, 32)) * 0.3, jnp.float32), "b1": jnp.zeros(32),
              "w2": jnp.asarray(rng.standard_normal((32, 4)) * 0.3, jnp.float32), "b2": jnp.zeros(4)}

    def loss(p):
        return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - y) ** 2)

    labels = {k: "muon" if v.ndim >= 2 else "adamw" for k, v in params.items()}
    opt = optax.partition({"muon": ljax.muon(0.02, state_format="8bit"), "adamw": ljax.adamw(3e-3)}, labels)
    state = opt.init(params)

    @jax.jit
    def train_step(p, s):
        value, g = jax.value_and_grad(loss)(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, value

    first = None
    for _ in range(60):
        params, state, value = train_step(params, state)
        first = value if first is None else first
    print(f"hybrid Muon + AdamW through optax.partition: loss {float(first):.4f} -> {float(value):.4f}")
    assert float(value) < 0.8 * float(first)


def test_muon_refusals(ljax):
    with pytest.raises(ValueError, match="adamw"):
        ljax.muon(0.02).init({"w": jnp.zeros((8, 8)), "b": jnp.zeros(8)})
    with pytest.raises(lowbit.InvalidArgumentError, match="ns_steps"):
        ljax.muon(0.02, ns_steps=101)
    ljax.muon(0.02, ns_steps=100)  # the header's range: 1..100
    with pytest.raises(lowbit.InvalidArgumentError, match="adjust_lr_fn"):
        ljax.muon(0.02, adjust_lr_fn="sqrt")
    with pytest.raises(lowbit.InvalidArgumentError, match="ns_precision"):
        ljax.muon(0.02, ns_precision="fp16")

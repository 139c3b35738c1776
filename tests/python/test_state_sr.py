"""The 4bit-sr state format (4BIT_SR: 4-bit codes rounded stochastically,
issue 37) from Python: the names, lowbit.Optimizer and lowbit.torch steps that
follow the seed, the state dict and a checkpoint that resume bit for bit, and
lowbit.jax stepping it under jit (its layout check accepts the format)."""

import numpy as np
import pytest

import lowbit

N = 5000  # above the 4096 threshold, with a partial last block


def _data(rng):
    p = rng.standard_normal(N).astype(np.float32)
    g = (rng.standard_normal(N) * 10.0 ** rng.uniform(-4, 0, N)).astype(np.float32)
    return p, g


def _run(p, g, seed, steps=3, state="4bit-sr"):
    p = p.copy()
    with lowbit.Optimizer("adamw", lr=1e-2, state=state, second_state="4bit", seed=seed, num_threads=1) as opt:
        opt.add_param(p)
        for _ in range(steps):
            opt.step([g])
        return p, opt.read_moment(0, 0), opt.param_info(0)


def test_optimizer_steps_follow_the_seed(rng):
    p, g = _data(rng)
    a, ma, info = _run(p, g, seed=4)
    b, mb, _ = _run(p, g, seed=4)
    c, mc, _ = _run(p, g, seed=5)
    assert info.state_format == "4bit-sr" and info.second_state_format == "4bit"
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ma, mb)
    assert np.mean(ma != mc) > 0.1
    _, m_nearest, _ = _run(p, g, seed=4, state="4bit")
    assert np.mean(ma != m_nearest) > 0.1  # the codes are not the nearest ones


def test_checkpoint_resumes_bit_for_bit(rng):
    p, g = _data(rng)
    p0, p1 = p.copy(), p.copy()
    with lowbit.Optimizer("adamw", state="4bit-sr", seed=2, num_threads=1) as a:
        a.add_param(p0)
        for _ in range(3):
            a.step([g])
        blob = a.save()
        p1[:] = p0
        with lowbit.Optimizer("adamw", state="4bit-sr", seed=2, num_threads=1) as b:
            b.add_param(p1)
            b.load(blob)
            for _ in range(2):
                a.step([g])
                b.step([g])
    np.testing.assert_array_equal(p0, p1)


def test_rank1_is_refused_by_name():
    with pytest.raises(lowbit.LowbitError, match="4bit-sr"):
        lowbit.Optimizer("adamw", state="4bit-sr", first_normalization="rank1")


def test_torch_state_dict_resumes(rng):
    torch = pytest.importorskip("torch")
    import lowbit.torch as lbt

    p, g = _data(rng)
    w0 = torch.nn.Parameter(torch.from_numpy(p.copy()))
    opt0 = lbt.AdamW([w0], lr=1e-2, state="4bit-sr", seed=3)
    for _ in range(3):
        w0.grad = torch.from_numpy(g.copy())
        opt0.step()
    sd = opt0.state_dict()
    w1 = torch.nn.Parameter(w0.detach().clone())
    opt1 = lbt.AdamW([w1], lr=1e-2, state="4bit-sr", seed=3)
    opt1.load_state_dict(sd)
    for _ in range(2):
        for w, o in ((w0, opt0), (w1, opt1)):
            w.grad = torch.from_numpy(g.copy())
            o.step()
    assert torch.equal(w0, w1)


def test_jax_steps_4bit_sr(rng):
    jax = pytest.importorskip("jax")
    ljax = pytest.importorskip("lowbit.jax")
    import jax.numpy as jnp

    p, g = _data(rng)
    out = {}
    for seed in (1, 1, 2):
        opt = ljax.adamw(1e-2, state_format="4bit-sr", seed=seed)
        state = opt.init(jnp.asarray(p))
        x = jnp.asarray(p)
        step = jax.jit(opt.step)
        for _ in range(3):
            x, state = step(x, jnp.asarray(g), state)
        out.setdefault(seed, []).append(np.asarray(x))
    assert not np.array_equal(out[1][0], p)  # stepped (a layout mismatch would skip every step)
    np.testing.assert_array_equal(out[1][0], out[1][1])
    assert not np.array_equal(out[1][0], out[2][0])


def test_the_name_is_a_preset_for_adam_and_a_format_for_lion(rng):
    p, _ = _data(rng)
    with lowbit.Optimizer("adamw", state="4bit-sr") as opt:
        opt.add_param(p.copy())
        info = opt.param_info(0)
        assert (info.state_format, info.second_state_format) == ("4bit-sr", "4bit")
    with lowbit.Optimizer("adamw", state="4bit-sr", second_state="4bit-sr") as opt:
        opt.add_param(p.copy())
        assert opt.param_info(0).second_state_format == "4bit-sr"
    with lowbit.Optimizer("lion", state="4bit-sr") as opt:
        opt.add_param(p.copy())
        assert opt.param_info(0).state_format == "4bit-sr"

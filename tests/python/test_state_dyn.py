"""The 4bit-dyn state format (4BIT_DYN: 4-bit blocks whose unsigned moment is
coded on the unsigned dynamic-exponent map, issue 50) from Python: the names
and what the plan makes of them per moment kind, the stored second moment
against a float64 model of the map, a checkpoint and a torch state dict that
resume bit for bit, rank-1 normalisation, and lowbit.jax under jit."""

import numpy as np
import pytest

import lowbit

N = 5000  # above the 4096 threshold, with a partial last block


def dynamic_map_u4():
    """0, 1 and, for exponent i = 0, 1, 2, the midpoints of 2^(i+1) + 1
    evenly spaced points in [0.1, 1] times 10^(i - 2): float64, then float32."""
    vals = [0.0, 1.0]
    for i in range(3):
        pts = np.linspace(0.1, 1.0, 2 ** (i + 1) + 1)
        vals += list((pts[:-1] + pts[1:]) / 2 * 10.0 ** (i - 2))
    return np.array(sorted(vals), dtype=np.float32)


def nearest_codes(x, values):
    """The nearest map value to x, exact ties to the lower one, in float64
    (midpoints of float32 values are exact in float64)."""
    v = values.astype(np.float64)
    mids = (v[:-1] + v[1:]) / 2
    return np.searchsorted(mids, x.astype(np.float64), side="left")


def _data(rng):
    p = rng.standard_normal(N).astype(np.float32)
    # grads over four decades inside every block: v over eight
    g = (rng.standard_normal(N) * 10.0 ** rng.uniform(-4, 0, N)).astype(np.float32)
    return p, g


def test_the_map():
    values = dynamic_map_u4()
    assert values.size == 16 and values[0] == 0 and values[-1] == 1
    np.testing.assert_allclose(values[1:4], [0.00325, 0.00775, 0.02125], rtol=1e-6)


def test_names_and_plans(rng):
    p, _ = _data(rng)
    cases = [
        ("adamw", dict(state="4bit", second_state="4bit-dyn"), ("4bit", "4bit-dyn")),
        ("adamw", dict(state="4bit-dyn"), ("4bit", "4bit-dyn")),  # a signed m is 4BIT
        ("adamw", dict(state="4bit-sr", second_state="4bit-dyn"), ("4bit-sr", "4bit-dyn")),
        ("rmsprop", dict(state="4bit-dyn"), ("4bit-dyn", None)),  # square_avg is unsigned
        ("lion", dict(state="4bit-dyn"), ("4bit", None)),
    ]
    for algo, kw, want in cases:
        with lowbit.Optimizer(algo, **kw) as opt:
            opt.add_param(p.copy())
            info = opt.param_info(0)
            got = (info.state_format, info.second_state_format if want[1] else None)
            assert got == want, (algo, kw, got)


def test_second_moment_is_the_nearest_value_on_the_dynamic_map(rng):
    """Adam with beta2 = 0 stores v = g * g (one float32 rounding): each
    block's codes are the float64 model's nearest values of v / absmax, a
    positive v never 0."""
    p, g = _data(rng)
    values = dynamic_map_u4()
    with lowbit.Optimizer("adam", lr=1e-3, betas=(0.9, 0.0), state="4bit", second_state="4bit-dyn",
                          num_threads=1) as opt:
        opt.add_param(p.copy())
        opt.step([g])
        v = opt.read_moment(0, 1)
    want_v = (g.astype(np.float32) * g.astype(np.float32)).astype(np.float32)
    want = np.empty(N, np.float32)
    rel = np.empty(N, np.float32)  # v over its block's largest
    for b in range(0, N, 128):
        x = want_v[b:b + 128]
        absmax = np.float32(np.max(np.abs(x)))
        q = (x / absmax).astype(np.float32)
        k = nearest_codes(q, values)
        k = np.where((values[k] == 0) & (q > 0), k + 1, k)
        want[b:b + 128] = values[k] * absmax
        rel[b:b + 128] = q
    np.testing.assert_array_equal(v, want)
    # the point of the map: a v a decade or two under its block's largest keeps its size within 2x
    # (the linear map stores every v under 1/16 of the largest as 1/16 of it)
    band = (rel >= 0.005) & (rel <= 0.05)
    assert band.sum() > 100
    ratio = v[band] / want_v[band]
    assert np.all((ratio > 0.5) & (ratio < 2.0))


def test_checkpoint_resumes_bit_for_bit(rng):
    p, g = _data(rng)
    p0, p1 = p.copy(), p.copy()
    kw = dict(state="4bit-sr", second_state="4bit-dyn", seed=2, num_threads=1)
    with lowbit.Optimizer("adamw", **kw) as a:
        a.add_param(p0)
        for _ in range(3):
            a.step([g])
        blob = a.save()
        p1[:] = p0
        with lowbit.Optimizer("adamw", **kw) as b:
            b.add_param(p1)
            b.load(blob)
            assert b.param_info(0).second_state_format == "4bit-dyn"
            np.testing.assert_array_equal(a.read_moment(0, 1), b.read_moment(0, 1))
            for _ in range(2):
                a.step([g])
                b.step([g])
    np.testing.assert_array_equal(p0, p1)


def test_rank1_second_moment(rng):
    p = rng.standard_normal((50, 100)).astype(np.float32)
    g = (rng.standard_normal((50, 100)) * 10.0 ** rng.uniform(-3, 0, (50, 100))).astype(np.float32)
    with lowbit.Optimizer("adamw", state="4bit-rank1", second_state="4bit-dyn") as opt:
        opt.add_param(p)
        info = opt.param_info(0)
        assert (info.second_state_format, info.second_normalization) == ("4bit-dyn", "rank1")
        opt.step([g])
        v = opt.read_moment(0, 1)
    assert np.all(np.isfinite(v)) and np.all(v > 0)


def test_torch_state_dict_resumes(rng):
    torch = pytest.importorskip("torch")
    import lowbit.torch as lbt

    p, g = _data(rng)
    w0 = torch.nn.Parameter(torch.from_numpy(p.copy()))
    kw = dict(lr=1e-2, state="4bit", second_state="4bit-dyn")
    opt0 = lbt.AdamW([w0], **kw)
    for _ in range(3):
        w0.grad = torch.from_numpy(g.copy())
        opt0.step()
    sd = opt0.state_dict()
    w1 = torch.nn.Parameter(w0.detach().clone())
    opt1 = lbt.AdamW([w1], **kw)
    opt1.load_state_dict(sd)
    for _ in range(2):
        for w, o in ((w0, opt0), (w1, opt1)):
            w.grad = torch.from_numpy(g.copy())
            o.step()
    assert torch.equal(w0, w1)


def test_jax_steps_4bit_dyn(rng):
    jax = pytest.importorskip("jax")
    ljax = pytest.importorskip("lowbit.jax")
    import jax.numpy as jnp

    p, g = _data(rng)
    opt = ljax.adamw(1e-2, weight_decay=0.01, state_format="4bit", second_state_format="4bit-dyn")
    state = opt.init(jnp.asarray(p))
    x = jnp.asarray(p)
    step = jax.jit(opt.step)
    for _ in range(3):
        x, state = step(x, jnp.asarray(g), state)
    assert not np.array_equal(np.asarray(x), p)  # stepped (a layout mismatch would skip every step)
    # the same bits as lowbit.Optimizer
    q = p.copy()
    with lowbit.Optimizer("adamw", lr=1e-2, weight_decay=0.01, state="4bit", second_state="4bit-dyn") as o:
        o.add_param(q)
        for _ in range(3):
            o.step([g])
    np.testing.assert_array_equal(np.asarray(x), q)


def test_the_preset(rng):
    p, _ = _data(rng)
    with lowbit.Optimizer("adamw", state="4bit-sr-dyn") as opt:
        opt.add_param(p.copy())
        info = opt.param_info(0)
        assert (info.state_format, info.second_state_format) == ("4bit-sr", "4bit-dyn")
        assert (info.first_normalization, info.second_normalization) == ("block", "block")
    with pytest.raises(lowbit.LowbitError, match="preset"):
        lowbit.Optimizer("lion", state="4bit-sr-dyn")


def test_same_bits_at_any_thread_count(rng):
    n = 300_000  # enough chunks for every thread to take some
    p = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 0, n)).astype(np.float32)
    out = []
    for threads in (1, 2, 3):
        q = p.copy()
        with lowbit.Optimizer("adamw", state="4bit-sr-dyn", seed=7, num_threads=threads) as opt:
            opt.add_param(q)
            for _ in range(3):
                opt.step([g])
            out.append((q, opt.read_moment(0, 0), opt.read_moment(0, 1)))
    for q, m, v in out[1:]:
        np.testing.assert_array_equal(q, out[0][0])
        np.testing.assert_array_equal(m, out[0][1])
        np.testing.assert_array_equal(v, out[0][2])

"""Shaped parameters from Python (issue 15): lowbit.Optimizer and lowbit.torch
take shapes from the arrays, state="4bit-rank1" (lpmm's 4-bit AdamW: v rank-1)
and "4bit-factor" (v factored), explicit normalisations, checkpoints and
copies of shaped state, and bad shapes. The float64 references of the two
normalisations are the C suite's (tests/c/test_shaped.c); here the Python
layer must reach them with the right shapes and settings."""
import copy

import numpy as np
import pytest

import lowbit

SHAPES = [(7, 129), (3, 5, 33), (300,)]


def _arrays(rng):
    ps = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    gs = [np.zeros_like(p) for p in ps]
    return ps, gs


def _steps(opt, gs, rng, n):
    for _ in range(n):
        for g in gs:
            g[...] = rng.standard_normal(g.shape).astype(np.float32) * np.float32(0.01)
        opt.step()


@pytest.mark.parametrize("state, second", [("4bit-rank1", "rank1"), ("4bit-factor", "factored")])
def test_presets_take_shapes_from_arrays(state, second, rng):
    ps, gs = _arrays(rng)
    with lowbit.Optimizer("adamw", lr=1e-3, state=state, min_quantized_numel=1) as opt:
        for p, g in zip(ps, gs):
            opt.add_param(p, g)
        for pid, s in enumerate(SHAPES):
            info = opt.param_info(pid)
            shaped = len(s) >= 2
            assert info.ndim == (len(s) if shaped else 0)
            assert info.first_normalization == "block"
            assert info.second_normalization == (second if shaped else "block"), (s, info)
        # the same optimizer spelled out gives the same bits
        ps2 = [p.copy() for p in ps]
        gs2 = [np.zeros_like(p) for p in ps]
        with lowbit.Optimizer("adamw", lr=1e-3, state="4bit", second_normalization=second,
                              min_quantized_numel=1) as ref:
            for p, g in zip(ps2, gs2):
                ref.add_param(p, g)
            seed_rng = np.random.default_rng(5)
            _steps(opt, gs, np.random.default_rng(5), 4)
            _steps(ref, gs2, seed_rng, 4)
            for a, b in zip(ps, ps2):
                assert np.array_equal(a, b)


def test_explicit_shape_and_per_param_normalization(rng):
    p = rng.standard_normal(6 * 50).astype(np.float32)  # flat storage of a 6 x 50 matrix
    g = np.zeros_like(p)
    with lowbit.Optimizer("adamw", state="4bit", min_quantized_numel=1) as opt:
        pid = opt.add_param(p, g, shape=(6, 50), second_normalization="rank1")
        info = opt.param_info(pid)
        assert info.ndim == 2 and info.second_normalization == "rank1"
        # a 2-D array registered as 1-D: blocks
        q = rng.standard_normal((4, 64)).astype(np.float32)
        qid = opt.add_param(q, np.zeros_like(q), shape=(), second_normalization="rank1")
        assert opt.param_info(qid).ndim == 0 and opt.param_info(qid).second_normalization == "block"


def test_bad_shapes_change_nothing(rng):
    p = rng.standard_normal(1000).astype(np.float32)
    with lowbit.Optimizer("adamw", state="4bit-factor", min_quantized_numel=1) as opt:
        with pytest.raises(lowbit.InvalidArgumentError, match="shape"):
            opt.add_param(p, shape=(10, 99))
        with pytest.raises(lowbit.InvalidArgumentError, match="shape"):
            opt.add_param(p, shape=(1000, 0))
        with pytest.raises(lowbit.InvalidArgumentError, match="dims"):
            opt.add_param(p, shape=(1,) * 9 + (1000,))
        with pytest.raises(lowbit.InvalidArgumentError, match="(?i)factored"):
            opt.add_param(p, shape=(), second_normalization="factored")  # forced on a 1-D param
        assert opt.num_params == 0
        opt.add_param(p, shape=(10, 100))  # and a good one still registers as id 0
        assert opt.num_params == 1
    with pytest.raises(lowbit.InvalidArgumentError, match="state"):
        lowbit.Optimizer("adamw", state="4bit-rank2")
    with pytest.raises(lowbit.InvalidArgumentError, match="second_normalization"):
        lowbit.Optimizer("adamw", state="4bit", second_normalization="rank2")


@pytest.mark.parametrize("state", ["4bit-rank1", "4bit-factor"])
def test_checkpoint_and_deepcopy_resume_bit_for_bit(state, rng):
    ps, gs = _arrays(rng)
    opt = lowbit.Optimizer("adamw", lr=1e-3, state=state, min_quantized_numel=1)
    for p, g in zip(ps, gs):
        opt.add_param(p, g)
    _steps(opt, gs, rng, 3)
    blob = opt.save("compressed")
    twin = copy.deepcopy((ps, gs, opt))
    ps2, gs2 = [p.copy() for p in ps], [np.zeros_like(p) for p in ps]
    other = lowbit.Optimizer("adamw", lr=1e-3, state=state, min_quantized_numel=1)
    for p, g in zip(ps2, gs2):
        other.add_param(p, g)
    other.load(blob)
    for o, grads in ((opt, gs), (twin[2], twin[1]), (other, gs2)):
        _steps(o, grads, np.random.default_rng(9), 3)
    for a, b, c in zip(ps, twin[0], ps2):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    for o in (opt, twin[2], other):
        o.close()


def test_torch_presets(rng):
    torch = pytest.importorskip("torch")
    import lowbit.torch as lt

    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    y = torch.sin(x @ torch.randn(32, 1) / 4) + 0.3 * torch.randn(4096, 1)  # noisy: losses end near 0.09
    finals, initial = {}, None
    for state in ("fp32", "4bit", "4bit-rank1", "4bit-factor"):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        opt = lt.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, state=state, min_quantized_numel=256)
        for _ in range(150):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            initial = loss.item() if initial is None else initial
        finals[state] = loss.item()
        w = model[0].weight
        info = opt.param_info(w)
        if state in ("4bit-rank1", "4bit-factor"):
            assert info.ndim == 2
            assert info.second_normalization == ("rank1" if state == "4bit-rank1" else "factored")
            sd = opt.state_dict()  # compressed, and back
            opt2 = lt.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, state=state, min_quantized_numel=256)
            opt2.load_state_dict(sd)
            assert opt2.param_info(w).second_normalization == info.second_normalization
            assert torch.equal(opt2.read_moment(w, 1), opt.read_moment(w, 1))
    print(finals)
    # every preset trains (the convergence comparison with fp32 AdamW is the
    # C MLP test's and the demo's, over longer runs)
    for state, loss in finals.items():
        assert np.isfinite(loss) and loss < 0.5 * initial, (initial, finals)

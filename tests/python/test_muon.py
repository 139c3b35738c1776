"""Muon (LOWBIT_ALGORITHM_MUON): lowbit.Optimizer("muon") and lowbit.torch.Muon.

* ns_precision="bf16" is torch.optim.Muon's arithmetic (the update, its norm
  and every Newton-Schulz product rounded to bf16). Against torch.optim.Muon
  itself on the CPU (fp32 state) the params agree to 1e-5 relative after 50
  steps at torch's default lr (1e-3). The two are not bit-identical: torch's
  lerp rounds once (an FMA) where lowbit rounds twice, torch takes
  1 - momentum in double (lowbit's hyper-parameters are float32), and the
  BLAS sums in another order; each such last-bit difference of the input can
  flip a bf16 rounding in the Newton-Schulz products (a relative change of
  ~4e-3 in one element, which the next products spread). At lr 2e-2 the
  params then drift apart by ~1e-4 relative over 50 steps, the distance
  torch.optim.Muon itself moves when its input changes in the last bit
  (test_bf16_drift_is_torchs_own_sensitivity), hence a looser bound there.
* ns_precision="fp32" against a float64 reference of one step (momentum,
  Nesterov, Newton-Schulz, decay, lr adjustment) on square, tall, wide, 1xN
  and 3-D params: within 1e-5 of the update.
* 8-bit / 4-bit momentum: the bytes per element of a 4096 x 4096 param, and
  a small MLP trained 200 steps ends within 1% of fp32 Muon's loss.
* The hybrid (AdamW param groups), checkpoints, torch.optim.Muon state dicts.
* Every test with bf16 products (and the float64 one) runs twice (the
  `products` fixture): LOWBIT_MATMUL=auto (here oneDNN's bf16 matmul and
  OpenBLAS) and LOWBIT_MATMUL=builtin (lowbit's own product, what a CPU
  without AVX-512 runs for bf16, and a host with only the reference BLAS for
  fp32), under the same bounds; test_bf16_products_agree_across_backends
  compares the two runs with each other.
* Refusals: an SGD group registered without momentum refuses one later, and
  a step whose products fail changes nothing (issue 45, items 3 and 4).
"""

import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
import seeding  # noqa: E402

if not hasattr(lowbit.Algorithm, "MUON"):
    pytest.skip("the loaded liblowbit has no Muon (lowbit < 0.7)", allow_module_level=True)

HAVE_TORCH_MUON = hasattr(torch.optim, "Muon")
needs_torch_muon = pytest.mark.skipif(not HAVE_TORCH_MUON, reason="torch.optim.Muon needs torch >= 2.9")

SHAPES_2D = [(64, 64), (96, 32), (32, 96)]
NS = (3.4445, -4.775, 2.0315)


def _f32(x):
    return float(np.float32(x))


def _gen(*salt):
    return torch.Generator().manual_seed(seeding.derive("muon", *salt))


def _rel(a, b):
    """||a - b|| / ||b|| in float64."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


def _step_both(a, b, ta, tb, g):
    """One step of ta over params a and of tb over params b, both given the
    same fresh random grads."""
    for pa, pb in zip(a, b):
        grad = torch.randn(pa.shape, generator=g)
        pa.grad, pb.grad = grad.clone(), grad.clone()
    ta.step()
    tb.step()


def _param_errs(a, b):
    """_rel of each param of b to its twin in a."""
    return [_rel(pb.detach(), pa.detach()) for pa, pb in zip(a, b)]


@pytest.fixture(params=["auto", "builtin"])
def products(request, monkeypatch):
    """Which implementation runs the Newton-Schulz products
    (core/cpu_matmul.hpp; LOWBIT_MATMUL is read at every step)."""
    monkeypatch.setenv("LOWBIT_MATMUL", request.param)
    return request.param


@pytest.fixture(autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


# ----------------------------------------------------------------- against torch.optim.Muon


def _run_pair(shapes, steps, salt, **hp):
    """torch.optim.Muon and lowbit.torch.Muon (fp32 state, bf16 products)
    over copies of the same params, fed the same random grads."""
    g = _gen("pair", *salt)
    init = [torch.randn(s, generator=g) for s in shapes]
    a = [p.clone().requires_grad_() for p in init]
    b = [p.clone().requires_grad_() for p in init]
    ta = torch.optim.Muon(a, **hp)
    tb = lt.Muon(b, ns_precision="bf16", state="fp32", **hp)
    for _ in range(steps):
        _step_both(a, b, ta, tb, g)
    return a, b, ta, tb


@needs_torch_muon
@pytest.mark.parametrize("nesterov,adjust", [(True, None), (False, None), (True, "match_rms_adamw"),
                                             (True, "spectral_unclamped")])
def test_matches_torch_muon(nesterov, adjust, products):
    a, b, ta, tb = _run_pair(SHAPES_2D, 50, (nesterov, str(adjust)), lr=1e-3, nesterov=nesterov,
                             adjust_lr_fn=adjust)
    errs = _param_errs(a, b)
    bufs = [_rel(tb.read_moment(pb), ta.state[pa]["momentum_buffer"]) for pa, pb in zip(a, b)]
    print(f"nesterov={nesterov} adjust_lr_fn={adjust}: param rel diff {errs}, momentum rel diff {bufs}")
    assert max(errs) < 1e-5
    assert max(bufs) < 1e-6  # the momentum buffer is fp32 arithmetic (last-bit differences only)


@needs_torch_muon
def test_matches_torch_muon_at_large_lr(products):
    """lr 2e-2, 50 steps: the bf16 roundings spread last-bit differences of
    the inputs (module docstring); the drift stays at torch's own
    sensitivity (~1e-4), far below what a wrong step gives (~1)."""
    a, b, _, _ = _run_pair(SHAPES_2D, 50, ("large",), lr=2e-2)
    errs = _param_errs(a, b)
    print(f"lr 2e-2: param rel diff {errs}")
    assert max(errs) < 5e-4


@needs_torch_muon
def test_bf16_drift_is_torchs_own_sensitivity():
    """torch.optim.Muon against itself with the momentum given as the
    float32 value lowbit keeps (0.95 -> 0.949999988): the same order of
    drift as lowbit against torch at lr 2e-2."""
    g = _gen("self")
    init = [torch.randn(s, generator=g) for s in SHAPES_2D]
    a = [p.clone().requires_grad_() for p in init]
    b = [p.clone().requires_grad_() for p in init]
    ta, tb = torch.optim.Muon(a, lr=2e-2), torch.optim.Muon(b, lr=2e-2, momentum=_f32(0.95))
    for _ in range(50):
        _step_both(a, b, ta, tb, g)
    errs = _param_errs(a, b)
    print(f"torch.optim.Muon against itself (momentum 0.95 vs float32(0.95)): {errs}")
    assert 1e-6 < max(errs) < 5e-4


# ----------------------------------------------------------------- fp32 against a float64 reference


def _ns64(u, a, b, c, steps, eps):
    x = u.copy()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _ratio(adjust, rows, cols):
    return {"original": math.sqrt(max(1.0, rows / cols)), "match_rms_adamw": 0.2 * math.sqrt(max(rows, cols)),
            "spectral_unclamped": math.sqrt(rows / cols), "none": 1.0}[adjust]


def _reference_step(p, g, m, *, lr, weight_decay, momentum, nesterov, eps, ns_steps, coeffs, adjust):
    """One Muon step in float64 with the float32 hyper-parameters the library
    holds and its two float32 step scalars (the decay factor 1 - lr wd and
    the adjusted lr, lowbit_hparams_t being float32); returns (new param,
    new momentum)."""
    lr, wd, mu, eps = (np.float64(np.float32(v)) for v in (lr, weight_decay, momentum, eps))
    a, b, c = (np.float64(np.float32(v)) for v in coeffs)
    p, g, m = p.astype(np.float64), g.astype(np.float64), m.astype(np.float64)
    m = m + (1 - mu) * (g - m)
    u = m - (m - g) * (1 - mu) if nesterov else m
    rows = p.shape[0]
    cols = p.size // rows
    o = _ns64(u.reshape(rows, cols), a, b, c, ns_steps, eps).reshape(p.shape)
    decay = np.float64(np.float32(1 - lr * wd))
    lr_adjusted = np.float64(np.float32(lr * _ratio(adjust, rows, cols)))
    return p * decay - lr_adjusted * o, m


def _update_error(p0, p, want):
    """(relative error of the update p - p0 against want - p0, the part of it
    that the float32 rounding of the new param alone gives)."""
    delta = np.linalg.norm(want - p0)
    floor = np.linalg.norm(np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)) / delta
    return _rel(p - p0, want - p0), floor


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw", "spectral_unclamped", "none"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_fp32_matches_float64_reference(rng, adjust, nesterov, products):
    shapes = [(48, 48), (80, 24), (24, 80), (1, 300), (8, 4, 6)]
    hp = dict(lr=0.03, weight_decay=0.1, momentum=0.9, nesterov=nesterov, eps=1e-7, ns_steps=5, coeffs=NS,
              adjust=adjust)
    opt = lowbit.Optimizer("muon", lr=hp["lr"], weight_decay=hp["weight_decay"], momentum=hp["momentum"],
                           nesterov=nesterov, eps=hp["eps"], ns_steps=5, ns_coefficients=NS, adjust_lr=adjust,
                           ns_precision="fp32", state="fp32")
    with opt:
        ps, gs, ms = [], [], []
        for s in shapes:
            # weights of a usual magnitude: the fp32 rounding of p (what p_new - p0 cannot resolve)
            # stays far below the update
            p = (0.1 * rng.standard_normal(s)).astype(np.float32)
            g = rng.standard_normal(s).astype(np.float32)
            m = (0.5 * rng.standard_normal(s)).astype(np.float32)
            pid = opt.add_param(p, g)
            assert opt.param_info(pid).ndim == len(s)
            opt.write_moment(pid, 0, m)
            ps.append(p)
            gs.append(g)
            ms.append(m)
        before = [p.copy() for p in ps]
        assert opt.step()
        for pid, (s, p0, p, g, m0) in enumerate(zip(shapes, before, ps, gs, ms)):
            want_p, want_m = _reference_step(p0, g, m0, **hp)
            err, floor = _update_error(p0, p, want_p)
            err_m = _rel(opt.read_moment(pid), want_m)
            print(f"{s}: update rel err {err:.2e} (fp32 rounding of the param: {floor:.2e}), "
                  f"momentum rel err {err_m:.2e}")
            assert err < 1e-5 + floor, f"shape {s}: update off by {err:.2e} relative"
            assert err_m < 1e-6


def test_ns_options_reach_the_step(rng):
    """ns_steps and ns_coefficients change the step as in the reference."""
    p0 = (0.1 * rng.standard_normal((40, 56))).astype(np.float32)
    g = rng.standard_normal((40, 56)).astype(np.float32)
    for steps, coeffs in [(1, NS), (3, (2.0, -1.5, 0.5)), (7, NS)]:
        p = p0.copy()
        with lowbit.Optimizer("muon", lr=0.05, ns_steps=steps, ns_coefficients=coeffs, ns_precision="fp32") as opt:
            opt.add_param(p, g.copy())
            hp = opt.get_hparams(0)
            assert hp["ns_steps"] == steps and np.allclose(hp["ns_coefficients"], coeffs)
            opt.step()
        want, _ = _reference_step(p0, g, np.zeros_like(g), lr=0.05, weight_decay=0.1, momentum=0.95, nesterov=True,
                                  eps=1e-7, ns_steps=steps, coeffs=coeffs, adjust="original")
        err, floor = _update_error(p0, p, want)
        assert err < 1e-5 + floor, (steps, coeffs, err)


def test_low_level_options_and_refusals():
    with lowbit.Optimizer("muon") as opt:
        hp = opt.get_hparams(0)
        assert hp["algorithm"] == "muon" and hp["ns_steps"] == 5 and hp["adjust_lr"] == "original"
        assert hp["ns_precision"] == "default" and hp["nesterov"] and np.float32(hp["momentum"]) == np.float32(0.95)
        assert np.float32(hp["weight_decay"]) == np.float32(0.1) and np.float32(hp["eps"]) == np.float32(1e-7)
        assert np.allclose(hp["ns_coefficients"], NS)
        opt.set_hparams(0, adjust_lr="match_rms_adamw", ns_precision="bf16", ns_steps=3)
        hp = opt.get_hparams(0)
        assert (hp["adjust_lr"], hp["ns_precision"], hp["ns_steps"]) == ("match_rms_adamw", "bf16", 3)
        g = opt.add_group(algorithm="adamw", lr=3e-4)
        hp = opt.get_hparams(g)
        assert hp["algorithm"] == "adamw" and "ns_steps" not in hp
        assert np.float32(hp["weight_decay"]) == np.float32(0.01)  # AdamW's defaults, not Muon's
        with pytest.raises(lowbit.InvalidArgumentError, match="ADAMW|adamw"):
            opt.add_param(np.zeros(16, np.float32))  # 1-D in the Muon group
        assert opt.add_param(np.zeros(16, np.float32), group=g) == 0
        assert opt.workspace_bytes() == 0 or opt.workspace_bytes() > 0  # reported; 0 without Muon params
        opt.add_param(np.zeros((8, 16), np.float32))
        assert opt.workspace_bytes() >= 8 * 16 * 4
        opt.set_hparams(0, ns_steps=100)  # the header's range: 1..100
        assert opt.get_hparams(0)["ns_steps"] == 100
        with pytest.raises(lowbit.InvalidArgumentError, match="ns_steps"):
            opt.set_hparams(0, ns_steps=101)
        with pytest.raises(lowbit.InvalidArgumentError, match="adjust_lr"):
            opt.set_hparams(0, adjust_lr="sqrt")
        with pytest.raises(lowbit.InvalidArgumentError, match="ns_precision"):
            opt.set_hparams(0, ns_precision="fp16")
        with pytest.raises(lowbit.InvalidArgumentError, match="ns_coefficients"):
            opt.set_hparams(0, ns_coefficients=(1.0, 2.0))
    with pytest.raises(lowbit.InvalidArgumentError, match="Muon"):
        lowbit.Optimizer("adamw", ns_steps=3)
    with lowbit.Optimizer("adamw") as opt, pytest.raises(lowbit.InvalidArgumentError, match="Muon"):
        opt.add_group(algorithm="sgd")  # only a Muon optimizer's groups take another algorithm


# ----------------------------------------------------------------- state bytes


@pytest.mark.parametrize("fmt,bound", [("8bit", 1.01), ("4bit", 0.52)])
def test_state_bytes_of_a_large_matrix(fmt, bound):
    """A 4096 x 4096 bf16 matrix: its momentum with rank-1 normalisation (what
    lowbit.torch.Muon gives its 8-bit / 4-bit matrices) takes 1.004 / 0.504
    bytes per element (registered through lowbit.Optimizer: no step, which
    would run Newton-Schulz on a 4096 x 4096 matrix on the CPU). With the
    library's default normalisation (blocks) it takes 1.016 / 0.531."""
    n = 4096
    with lowbit.Optimizer("muon", state=fmt, first_normalization="rank1") as opt:
        pid = opt.add_param(np.zeros((n, n), np.uint16), dtype="bfloat16")  # bf16 bits, no grad
        info = opt.param_info(pid)
        per = opt.state_bytes(pid) / (n * n)
        print(f"{fmt}: {opt.state_bytes(pid)} bytes of state for {n}x{n} ({per:.4f} per element), "
              f"normalisation {info.first_normalization}, workspace {opt.workspace_bytes()} bytes")
        assert info.state_format == fmt and info.second_state_format is None
        assert info.first_normalization == "rank1" and info.param_dtype == "bfloat16"
        assert per <= bound
        assert opt.state_bytes() == opt.state_bytes(pid)


@pytest.mark.parametrize("fmt", ["8bit", "4bit"])
def test_torch_muon_normalises_low_bit_momentum_rank1(fmt):
    w = torch.zeros(256, 384, dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(384, requires_grad=True)
    opt = lt.Muon([{"params": [w]}, {"params": [b], "algorithm": "adamw"}], state=fmt, min_quantized_numel=0)
    w.grad = torch.randn(w.shape, generator=_gen("rank1", fmt)).bfloat16()
    b.grad = torch.ones(384)
    opt.step()
    info = opt.param_info(w)
    assert (info.state_format, info.first_normalization, info.param_dtype) == (fmt, "rank1", "bfloat16")
    assert info.state_bytes / w.numel() <= {"8bit": 1.01, "4bit": 0.52}[fmt] + 8 * (256 + 384) / w.numel()
    assert opt.param_info(b).first_normalization == "block"  # the AdamW group's: the optimizer's own
    explicit = lt.Muon([torch.zeros(64, 64, requires_grad=True)], state=fmt, first_normalization="block")
    p = explicit.param_groups[0]["params"][0]
    p.grad = torch.ones(64, 64)
    explicit.step()
    assert explicit.param_info(p).first_normalization == "block"


# ----------------------------------------------------------------- the hybrid


class _Net(torch.nn.Module):
    def __init__(self, din=16, width=48, dout=4):
        super().__init__()
        self.fc1 = torch.nn.Linear(din, width)
        self.norm = torch.nn.LayerNorm(width)
        self.fc2 = torch.nn.Linear(width, dout)

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


def _groups(model, lr=0.02, adamw_lr=3e-3):
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    return ([{"params": matrices, "lr": lr}],
            [{"params": others, "algorithm": "adamw", "lr": adamw_lr, "weight_decay": 0.0}])


def _task(salt, n=256, din=16, dout=4):
    g = _gen("task", salt)
    x = torch.randn(n, din, generator=g)
    y = (x @ torch.randn(din, dout, generator=g)).argmax(1)
    return x, y


@needs_torch_muon
def test_hybrid_trains_and_matches_torch_muon_plus_adamw(products):
    """lowbit.torch.Muon with an AdamW group against torch.optim.Muon plus
    torch.optim.AdamW over copies of a net's params, fed the grads of the
    torch copy (so that the last-bit differences bf16 roundings spread,
    module docstring, do not feed back into the grads); then the lowbit
    copy trains on its own grads."""
    x, y = _task("hybrid")
    torch.manual_seed(seeding.derive("muon", "hybrid-model"))
    nets = [_Net(), _Net()]
    nets[1].load_state_dict(nets[0].state_dict())
    muon_g, adamw_g = _groups(nets[0], lr=2e-2, adamw_lr=1e-2)
    torch_opts = (torch.optim.Muon(muon_g[0]["params"], lr=2e-2),
                  torch.optim.AdamW(adamw_g[0]["params"], lr=1e-2, weight_decay=0.0))
    muon_g, adamw_g = _groups(nets[1], lr=2e-2, adamw_lr=1e-2)
    opt = lt.Muon(muon_g + adamw_g, ns_precision="bf16")
    assert opt.param_groups[1]["betas"] == (0.9, 0.999) and opt.param_groups[1]["eps"] == 1e-8
    assert opt.param_groups[1]["weight_decay"] == 0.0 and opt.param_groups[0]["weight_decay"] == 0.1
    for _ in range(30):
        for o in torch_opts:
            o.zero_grad()
        torch.nn.functional.cross_entropy(nets[0](x), y).backward()
        for p0, p1 in zip(nets[0].parameters(), nets[1].parameters()):
            p1.grad = p0.grad.clone()
        for o in torch_opts + (opt,):
            o.step()
    for (name, p0), p1 in zip(nets[0].named_parameters(), nets[1].parameters()):
        err = _rel(p1.detach(), p0.detach())
        print(f"  {name}: lowbit vs torch {err:.2e}")
        # AdamW's params: fp32 arithmetic. Muon's: torch.optim.Muon itself moves up to ~6e-4 here when
        # its momentum changes in the last bit (0.95 against float32(0.95)); a wrong step moves ~1e-1
        assert err < (2e-3 if p0.ndim >= 2 else 1e-5), name
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(nets[1](x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"hybrid loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert losses[-1] < 0.6 * losses[0]
    net = nets[1]
    info = {n: opt.param_info(p) for n, p in net.named_parameters()}
    assert info["fc1.bias"].second_state_format == "fp32" and info["fc1.weight"].second_state_format is None
    assert set(opt.state[net.fc1.bias]) == {"step", "exp_avg", "exp_avg_sq"}
    assert set(opt.state[net.fc1.weight]) == {"step", "momentum_buffer"}


def test_one_dim_param_in_a_muon_group_is_refused():
    net = _Net()
    with pytest.raises(ValueError, match="adamw"):
        lt.Muon(net.parameters())
    opt = lt.Muon([net.fc1.weight])
    with pytest.raises(ValueError, match="algorithm"):
        opt.add_param_group({"params": [net.fc1.bias]})
    opt.add_param_group({"params": [net.fc1.bias], "algorithm": "adamw"})
    with pytest.raises(ValueError, match="algorithm"):
        lt.Muon([{"params": [net.fc2.weight], "algorithm": "no_such_algorithm"}])
    with pytest.raises(ValueError, match="ns_steps"):
        lt.Muon([net.fc2.weight], ns_steps=100)
    with pytest.raises(ValueError, match="not supported"):
        lt.Muon([net.fc2.weight], adjust_lr_fn="sqrt")
    with pytest.raises(ValueError):
        lt.Muon([net.fc2.weight], ns_precision="fp16")


def test_adjust_lr_none_and_three_dim_params():
    """adjust_lr_fn="none" steps with the lr as given; a 3-D param is read as
    rows = dim 0, cols = the rest."""
    g = _gen("3d")
    p = torch.randn(6, 4, 5, generator=g).requires_grad_()
    q = p.detach().clone().reshape(6, 20).requires_grad_()
    opt_p = lt.Muon([p], lr=0.1, adjust_lr_fn="none", ns_precision="fp32")
    opt_q = lt.Muon([q], lr=0.1, adjust_lr_fn="none", ns_precision="fp32")
    for _ in range(3):
        grad = torch.randn(6, 4, 5, generator=g)
        p.grad, q.grad = grad.clone(), grad.reshape(6, 20).clone()
        opt_p.step()
        opt_q.step()
    assert torch.equal(p.detach().reshape(6, 20), q.detach())


# ----------------------------------------------------------------- checkpoints


def _trained_muon(salt, state="8bit", steps=5):
    torch.manual_seed(seeding.derive("muon", "ckpt", salt))
    net = _Net(width=96)
    muon_g, adamw_g = _groups(net)
    opt = lt.Muon(muon_g + adamw_g, state=state, min_quantized_numel=0, ns_precision="bf16")
    x, y = _task(f"ckpt-{salt}")
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net, opt, x, y


def _next_step(net, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("state", ["fp32", "8bit", "4bit"])
def test_checkpoint_round_trip_gives_the_same_next_step(state, products):
    net, opt, x, y = _trained_muon(state, state)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    net2 = _Net(width=96)
    net2.load_state_dict(net.state_dict())
    muon_g, adamw_g = _groups(net2)
    opt2 = lt.Muon(muon_g + adamw_g, state=state, min_quantized_numel=0, ns_precision="bf16")
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=False))
    assert opt2.param_info(net2.fc1.weight).state_format == state
    assert opt2.param_info(net2.fc1.weight).step == 5
    a, b = _next_step(net, opt, x, y), _next_step(net2, opt2, x, y)
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)


@needs_torch_muon
def test_torch_muon_state_dict_import(products):
    g = _gen("import")
    init = [torch.randn(s, generator=g) for s in SHAPES_2D]
    a = [p.clone().requires_grad_() for p in init]
    ta = torch.optim.Muon(a, lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw")
    for _ in range(5):
        for p in a:
            p.grad = torch.randn(p.shape, generator=g)
        ta.step()
    b = [p.detach().clone().requires_grad_() for p in a]
    tb = lt.Muon(b, ns_precision="bf16")  # hyper-parameters come from the loaded state dict
    tb.load_state_dict(ta.state_dict())
    assert tb.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw" and tb.param_groups[0]["weight_decay"] == 0.05
    assert tb.param_groups[0]["ns_precision"] == "bf16"  # lowbit's own option stays
    for pa, pb in zip(a, b):
        assert torch.equal(tb.read_moment(pb), ta.state[pa]["momentum_buffer"])
    _step_both(a, b, ta, tb, g)
    errs = _param_errs(a, b)
    print(f"next step after importing torch.optim.Muon's state: rel diff {errs}")
    # one step of lr 2e-2 from the same momentum: a bf16 rounding flipped in
    # Newton-Schulz moves ~1e-5; a momentum lost in the import, ~1e-3
    assert max(errs) < 1e-4

    # and back: torch_state_dict() is torch.optim.Muon's layout
    sd = tb.torch_state_dict()
    assert all(set(s) == {"momentum_buffer"} for s in sd["state"].values())
    assert "ns_precision" not in sd["param_groups"][0] and "state" not in sd["param_groups"][0]
    c = [p.detach().clone().requires_grad_() for p in b]
    tc = torch.optim.Muon(c, lr=0.02)
    tc.load_state_dict(sd)
    for pc, pb in zip(c, b):
        assert torch.equal(tc.state[pc]["momentum_buffer"], tb.read_moment(pb))

    # a torch.optim.Muon state dict is refused by the other optimizers
    with pytest.raises(lowbit.StateMismatchError, match="Muon"):
        lt.SGD([p.detach().clone().requires_grad_() for p in init], momentum=0.9).load_state_dict(ta.state_dict())


# ----------------------------------------------------------------- low-bit momentum trains


def _regression_loss(state, steps=200, lr=0.02, adamw_lr=3e-3):
    """Validation loss of a small MLP (32 -> 64 -> 64 -> 4, GELU) trained on a
    teacher network plus noise (variance 0.25, the floor), minibatches of
    256, Muon on the matrices and AdamW on the biases, lr cosine to 0."""
    g = _gen("regression")
    din, width, dout, n = 32, 64, 4, 8192
    teacher = torch.nn.Sequential(torch.nn.Linear(din, width), torch.nn.Tanh(), torch.nn.Linear(width, dout))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 if p.ndim == 2 else torch.zeros_like(p))
        x, xv = torch.randn(n, din, generator=g), torch.randn(4096, din, generator=g)
        y = teacher(x) + 0.5 * torch.randn(n, dout, generator=g)
        yv = teacher(xv) + 0.5 * torch.randn(4096, dout, generator=g)
    torch.manual_seed(seeding.derive("muon", "regression-init"))
    model = torch.nn.Sequential(torch.nn.Linear(din, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                torch.nn.GELU(), torch.nn.Linear(width, dout))
    muon_g, adamw_g = _groups(model, lr=lr, adamw_lr=adamw_lr)
    opt = lt.Muon(muon_g + adamw_g, state=state, ns_precision="fp32", min_quantized_numel=0)
    order = _gen("regression-batches")
    for step in range(steps):
        for group, base in zip(opt.param_groups, (lr, adamw_lr)):
            group["lr"] = base * 0.5 * (1 + math.cos(math.pi * step / steps))
        idx = torch.randint(0, n, (256,), generator=order)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
        opt.step()
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(xv), yv).item(), opt


def test_low_bit_momentum_trains_like_fp32():
    """8-bit and 4-bit momentum (rank-1 normalised, every tensor quantized)
    end within 1% of fp32 Muon's validation loss (measured over 30 seeds:
    8-bit within +-0.25%, 4-bit within +-0.8%; 4-bit blocks instead of
    rank-1 reach +2.5%)."""
    out, opts = {}, {}
    for fmt in ("fp32", "8bit", "4bit"):
        out[fmt], opts[fmt] = _regression_loss(fmt)
    for fmt in ("8bit", "4bit"):
        w = opts[fmt].param_groups[0]["params"][1]
        assert opts[fmt].param_info(w).state_format == fmt
        assert opts[fmt].param_info(w).first_normalization == "rank1"
    ref = out["fp32"]
    print("validation loss after 200 steps (noise floor 0.25): " + ", ".join(f"{k} {v:.5f}" for k, v in out.items()))
    for fmt in ("8bit", "4bit"):
        gap = (out[fmt] - ref) / ref
        print(f"{fmt}: {100 * gap:+.2f}% against fp32")
        assert abs(gap) < 0.01, f"{fmt} Muon ends {100 * gap:+.2f}% from fp32 Muon's loss"


# ----------------------------------------------------------------- lowbit.torch's other step paths


def test_step_paths_give_the_eager_bits():
    """step_in_backward, CPUOffload (the hybrid group keeps AdamW's defaults
    there too) and torch.compile give the bits of the eager step."""
    x, y = _task("paths")

    def run(make_opt, mode="eager"):
        torch.manual_seed(seeding.derive("muon", "paths-model"))
        net = _Net()
        muon_g, adamw_g = _groups(net, adamw_lr=1e-3)
        opt = make_opt(muon_g + [{k: v for k, v in adamw_g[0].items() if k != "weight_decay"}])
        hooks = lt.step_in_backward(opt) if mode == "in_backward" else None
        step = torch.compile(opt.step, fullgraph=True) if mode == "compiled" else opt.step
        for _ in range(3):
            if hooks is None:
                opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            if hooks is None:
                step()
        return [p.detach().clone() for p in net.parameters()]

    kw = dict(lr=0.02, state="8bit", min_quantized_numel=0)
    eager = run(lambda g: lt.Muon(g, **kw))
    others = {
        "step_in_backward": run(lambda g: lt.Muon(g, **kw), "in_backward"),
        "CPUOffload": run(lambda g: lt.CPUOffload(lt.Muon, g, **kw)),
        "torch.compile": run(lambda g: lt.Muon(g, **kw), "compiled"),
    }
    for name, params in others.items():
        assert all(torch.equal(a, b) for a, b in zip(eager, params)), name


# ----------------------------------------------------------------- the implementations of the products


def _numpy_muon_run(products, monkeypatch, shapes, steps, lr, num_threads=2, salt="agree"):
    """lowbit.Optimizer("muon") (fp32 state, bf16 products) over params of
    `shapes` fed the same fresh grads, its products by LOWBIT_MATMUL=products."""
    monkeypatch.setenv("LOWBIT_MATMUL", products)
    rng = seeding.rng("muon", salt)
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [np.zeros_like(p) for p in params]
    with lowbit.Optimizer("muon", lr=lr, ns_precision="bf16", num_threads=num_threads) as opt:
        for p, g in zip(params, grads):
            opt.add_param(p, g, shape=p.shape)
        for _ in range(steps):
            for g in grads:
                g[...] = rng.standard_normal(g.shape)
            opt.step()
    return params


def test_bf16_products_agree_across_backends(monkeypatch):
    """oneDNN's bf16 matmul (here; "auto") and lowbit's own product
    ("builtin") multiply the same bf16 values with fp32 sums, in other orders:
    the bits differ (a last-bit difference of a sum can flip a bf16
    rounding, which the next products spread), by what two valid orders
    differ by. The bound is the one the bf16 tests hold against
    torch.optim.Muon (test_matches_torch_muon: 1e-5 relative after 50 steps
    at lr 1e-3), which sums in yet another order. lowbit's own product gives
    the same bits on any thread count (its sums' order does not depend on
    the blocking)."""
    print(lowbit.build_info()["cpu_matmul_bf16"])
    auto = _numpy_muon_run("auto", monkeypatch, SHAPES_2D, 50, 1e-3)
    builtin = _numpy_muon_run("builtin", monkeypatch, SHAPES_2D, 50, 1e-3)
    errs = [_rel(b, a) for a, b in zip(auto, builtin)]
    print(f"auto vs builtin, 50 steps at lr 1e-3: param rel diff {errs}")
    assert max(errs) < 1e-5
    shapes = [(130, 130), (200, 70)]  # past the product's threshold for threads
    one = _numpy_muon_run("builtin", monkeypatch, shapes, 3, 2e-2, num_threads=1, salt="threads")
    three = _numpy_muon_run("builtin", monkeypatch, shapes, 3, 2e-2, num_threads=3, salt="threads")
    assert all(np.array_equal(a, b) for a, b in zip(one, three))


def test_bad_matmul_choice_is_refused(monkeypatch):
    monkeypatch.setenv("LOWBIT_MATMUL", "fastest")
    with lowbit.Optimizer("muon") as opt:
        with pytest.raises(lowbit.InvalidArgumentError, match="LOWBIT_MATMUL = 'fastest' is not auto, blas or builtin"):
            opt.add_param(np.zeros((8, 4), np.float32), np.zeros((8, 4), np.float32), shape=(8, 4))
        assert opt.num_params == 0
    assert lowbit.build_info()["cpu_matmul_fp32"].startswith("none: LOWBIT_MATMUL")


# ----------------------------------------------------------------- refusals change nothing


def test_sgd_group_without_momentum_refuses_one_later():
    """An SGD group of a Muon optimizer registered with momentum 0 has no
    momentum buffer: a later momentum is refused, as a plain SGD optimizer
    refuses it (issue 45 item 3: it was accepted, and the step read an
    uninitialised tile), through lowbit.Optimizer and lowbit.torch.Muon; the
    params then step as plain SGD's, bit for bit."""
    rng = seeding.rng("muon", "sgd-group")
    w, b = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal(20).astype(np.float32)
    b2 = b.copy()
    gw, gb, gb2 = np.zeros_like(w), np.zeros_like(b), np.zeros_like(b)
    with lowbit.Optimizer("muon", ns_precision="fp32") as opt, lowbit.Optimizer("sgd", lr=0.05) as plain:
        group = opt.add_group(algorithm="sgd", lr=0.05, momentum=0.0)
        opt.add_param(w, gw, shape=w.shape)
        opt.add_param(b, gb, group=group)
        plain.add_param(b2, gb2)
        for o, gi in ((opt, group), (plain, 0)):
            with pytest.raises(lowbit.InvalidArgumentError, match="registered without momentum"):
                o.set_hparams(gi, momentum=0.9)
            assert o.get_hparams(gi)["momentum"] == 0.0
        for _ in range(4):
            gw[...], gb[...] = rng.standard_normal(gw.shape), rng.standard_normal(gb.shape)
            gb2[...] = gb
            opt.step()
            plain.step()
        assert np.array_equal(b, b2)

    g = _gen("sgd-group-torch")
    wt, bt = torch.randn(16, 8, generator=g).requires_grad_(), torch.randn(20, generator=g).requires_grad_()
    bp = bt.detach().clone().requires_grad_()
    topt = lt.Muon([{"params": [wt]}, {"params": [bt], "algorithm": "sgd", "lr": 0.05, "momentum": 0.0}])
    tplain = lt.SGD([bp], lr=0.05, momentum=0.0)
    wt.grad, bt.grad = torch.randn(16, 8, generator=g), torch.randn(20, generator=g)
    bp.grad = bt.grad.clone()
    topt.step()
    tplain.step()
    before = [wt.detach().clone(), bt.detach().clone()]
    for o in (topt, tplain):
        o.param_groups[-1]["momentum"] = 0.9
        with pytest.raises(lowbit.InvalidArgumentError, match="registered without momentum"):
            o.step()
        o.param_groups[-1]["momentum"] = 0.0
    assert torch.equal(wt.detach(), before[0]) and torch.equal(bt.detach(), before[1])
    topt.step()
    tplain.step()
    assert torch.equal(bt.detach(), bp.detach())


def test_failed_products_change_nothing(monkeypatch):
    """A step whose products cannot run (the test hook
    LOWBIT_TEST_MATMUL_FAIL_AFTER: the first shape's products are readied,
    the second's refused) raises and changes nothing: the state bytes, the
    params, the step counts (issue 45 item 4: the momentum had advanced)."""
    rng = seeding.rng("muon", "failed-products")
    params = [rng.standard_normal(s).astype(np.float32) for s in ((24, 40), (40, 24))]
    grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    with lowbit.Optimizer("muon", ns_precision="bf16", state="8bit", min_quantized_numel=0) as opt:
        for p, g in zip(params, grads):
            opt.add_param(p, g, shape=p.shape)
        opt.step()  # products 1-6
        state, before = opt.save(), [p.copy() for p in params]
        monkeypatch.setenv("LOWBIT_TEST_MATMUL_FAIL_AFTER", "9")
        with pytest.raises(lowbit.InternalError, match="LOWBIT_TEST_MATMUL_FAIL_AFTER = 9: product 10"):
            opt.step()
        monkeypatch.delenv("LOWBIT_TEST_MATMUL_FAIL_AFTER")
        assert opt.save() == state
        assert all(np.array_equal(a, b) for a, b in zip(before, params))
        assert opt.param_info(0).step == 1 and opt.param_info(1).step == 1
        opt.step()
        assert opt.param_info(0).step == 2

"""The CPU engine's thread count reaches the library: lowbit.Optimizer
(``num_threads=``, else LOWBIT_NUM_THREADS, else 0 = all OpenMP threads) and
lowbit.torch (``num_threads=``, else LOWBIT_NUM_THREADS, else
torch.get_num_threads() when the CPU handle is made). The value is read where
the bindings hand it to lowbit_optimizer_create (the C API has no getter), so
nothing here depends on timing or on the machine's core count."""

import numpy as np
import pytest

import lowbit
from lowbit import _optimizer

ENV = "LOWBIT_NUM_THREADS"


@pytest.fixture
def created(monkeypatch):
    """The num_threads of every lowbit_optimizer_create call, in order."""
    seen = []
    real = _optimizer.call

    def spy(name, *args, **kw):
        if name == "lowbit_optimizer_create":
            seen.append(args[1].num_threads)  # the lowbit_optimizer_config_t *
        return real(name, *args, **kw)

    monkeypatch.setattr(_optimizer, "call", spy)
    return seen


def test_optimizer_explicit(created, monkeypatch):
    monkeypatch.setenv(ENV, "5")  # an explicit argument wins over the environment
    with lowbit.Optimizer("adamw", num_threads=3) as opt:
        assert opt.num_threads == 3
    assert created == [3]


def test_optimizer_default_is_all_threads(created, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with lowbit.Optimizer("adamw") as opt:
        assert opt.num_threads == 0
    assert created == [0]


def test_optimizer_environment(created, monkeypatch):
    monkeypatch.setenv(ENV, " 1 ")
    with lowbit.Optimizer("lion") as opt:
        assert opt.num_threads == 1
        w = np.ones(10, np.float32)
        opt.add_param(w, np.full(10, 0.5, np.float32))
        assert opt.step()  # a working optimizer, not just a stored number
    assert created == [1]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "two"])
def test_optimizer_bad_argument(bad):
    with pytest.raises(lowbit.InvalidArgumentError, match="num_threads"):
        lowbit.Optimizer("adamw", num_threads=bad)


@pytest.mark.parametrize("bad", ["-2", "x", "1.5"])
def test_optimizer_bad_environment(bad, monkeypatch):
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(lowbit.InvalidArgumentError, match=ENV):
        lowbit.Optimizer("adamw")


# ----------------------------------------------------------------- lowbit.torch


@pytest.fixture
def torch_threads():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


def _torch_step(torch, lt, **kw):
    p = torch.nn.Parameter(torch.ones(16))
    p.grad = torch.full((16,), 0.5)
    opt = lt.AdamW([p], lr=1e-2, **kw)
    opt.step()
    assert float(p.detach()[0]) < 1.0  # the step ran
    return opt.lowbit_handles()["cpu"].num_threads


def test_torch_follows_torch_threads(created, torch_threads, monkeypatch):
    import lowbit.torch as lt

    monkeypatch.delenv(ENV, raising=False)
    torch = torch_threads
    torch.set_num_threads(1)
    assert _torch_step(torch, lt) == 1
    torch.set_num_threads(2)
    assert _torch_step(torch, lt) == 2
    assert created == [1, 2]


def test_torch_explicit_and_environment(created, torch_threads, monkeypatch):
    import lowbit.torch as lt

    torch = torch_threads
    torch.set_num_threads(1)
    monkeypatch.setenv(ENV, "3")
    assert _torch_step(torch, lt) == 3  # the environment wins over torch's count
    assert _torch_step(torch, lt, num_threads=2) == 2  # an explicit argument over both
    assert _torch_step(torch, lt, num_threads=0) == 0  # 0: all OpenMP threads
    assert created == [3, 2, 0]


def test_torch_bad_argument(torch_threads):
    import lowbit.torch as lt

    p = torch_threads.nn.Parameter(torch_threads.ones(4))
    with pytest.raises(lowbit.InvalidArgumentError, match="num_threads"):
        lt.AdamW([p], num_threads=-1)


# ----------------------------------------------------------------- lowbit.jax


@pytest.fixture
def ljax():
    pytest.importorskip("jax")
    try:
        import lowbit.jax as ljax

        ljax.library_path()
    except ImportError as e:
        pytest.skip(f"liblowbit_jax is not available: {e}")
    return ljax


def test_jax_num_threads_reaches_the_call(ljax, monkeypatch):
    """The resolved count is the FFI call's num_threads attribute."""
    import jax
    import jax.numpy as jnp

    monkeypatch.delenv(ENV, raising=False)
    params = {"w": jnp.ones(8)}

    def attr(opt):
        text = jax.jit(opt.step).lower(params, params, opt.init(params)).as_text()
        return text.count("num_threads = 0 : i32"), text.count("num_threads = 3 : i32")

    assert ljax.adamw(1e-3).config.num_threads == 0
    assert attr(ljax.adamw(1e-3)) == (1, 0)
    assert attr(ljax.adamw(1e-3, num_threads=3)) == (0, 1)
    monkeypatch.setenv(ENV, "3")
    opt = ljax.lion(1e-4)
    assert opt.config.num_threads == 3
    assert attr(opt) == (0, 1)
    with pytest.raises(ValueError, match="num_threads"):
        ljax.adamw(1e-3, num_threads=-2)

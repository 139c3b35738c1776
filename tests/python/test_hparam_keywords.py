"""Issue 46: lowbit.Optimizer's hyper-parameter keywords come from the
algorithm descriptors (lowbit_hparam_info): every field of every algorithm is
a keyword of its constructor (``Optimizer("rmsprop", alpha=..., centered=...)``,
``Optimizer("adagrad", lr_decay=..., initial_accumulator_value=...)``), the
same as set_hparams after a default construction, and a field of other
algorithms only is refused naming it. RMSprop and Adagrad built from keywords
step as torch.optim's in float64 (the float64 reference). Seed:
LOWBIT_TEST_SEED."""

import math

import numpy as np
import pytest

import lowbit
from lowbit._algorithms import algorithm_specs
from lowbit._options import hparam_keywords


def _other_value(h):
    """A value of hyper-parameter `h` inside its bounds and, where they allow
    one, other than its default."""
    if h.type == "flag":
        return (not h.default) if h.lower < h.upper else h.default
    if h.type in ("int", "enum"):
        v = h.default + 1 if h.default + 1 <= h.upper else h.default - 1
        return v if h.lower <= v <= h.upper else h.default

    def real(d):
        if h.upper > 1e30:  # unbounded above
            return d * 2 + 0.25
        mid = (h.lower + h.upper) / 2
        return mid if mid != d else h.lower + (h.upper - h.lower) / 4

    return tuple(real(d) for d in h.default) if h.count > 1 else real(h.default)


def _message(e: Exception) -> str:
    return str(e).split(": ", 1)[-1]  # without the C function's name


CASES = [(spec.name, h) for spec in algorithm_specs().values() for h in spec.hparams]


@pytest.mark.parametrize("algorithm,h", CASES, ids=[f"{a}-{h.name}" for a, h in CASES])
def test_every_descriptor_field_is_a_constructor_keyword(algorithm, h):
    """Optimizer(algorithm, field=value) holds what Optimizer(algorithm) then
    set_hparams(field=value) holds (or both refuse it, naming it)."""
    value = _other_value(h)
    with lowbit.Optimizer(algorithm) as default, lowbit.Optimizer(algorithm) as later:
        try:
            later.set_hparams(0, **{h.name: value})
        except lowbit.InvalidArgumentError as e:
            # the library refuses this field alone (1-bit LAMB's bias correction, ...): so does the constructor
            assert h.name in str(e)
            with pytest.raises(lowbit.InvalidArgumentError) as got:
                lowbit.Optimizer(algorithm, **{h.name: value})
            assert _message(got.value) == _message(e)
            return
        with lowbit.Optimizer(algorithm, **{h.name: value}) as opt:
            assert opt.get_hparams() == later.get_hparams()
            if value != h.default:
                assert opt.get_hparams() != default.get_hparams(), f"{h.name}={value!r} did not arrive"


def test_betas_is_the_pair_of_beta1_and_beta2():
    for name, spec in algorithm_specs().items():
        fields = [h.name for h in spec.hparams]
        assert ("betas" in hparam_keywords(spec.algorithm)) == ("beta1" in fields and "beta2" in fields), name
    with lowbit.Optimizer("lion", betas=(0.5, 0.25)) as a, lowbit.Optimizer("lion", beta1=0.5, beta2=0.25) as b:
        assert a.get_hparams() == b.get_hparams() and a.get_hparams()["betas"] == (0.5, 0.25)


def test_a_keyword_of_other_algorithms_only_is_refused_naming_it():
    specs = algorithm_specs()
    keywords = {name: set(hparam_keywords(spec.algorithm)) for name, spec in specs.items()}
    checked = 0
    for name, mine in keywords.items():
        for other, theirs in keywords.items():
            for field in sorted(theirs - mine):
                value = _other_value(specs[other].hparam(field)) if field != "betas" else (0.5, 0.25)
                with pytest.raises(lowbit.InvalidArgumentError) as e:
                    lowbit.Optimizer(name, lr=0.1, **{field: value})
                text = str(e.value)
                assert f"not hyper-parameters of {name}: {field} " in text, text
                assert f"{specs[other].title}'s" in text, text  # who takes it
                assert f"{name} takes {', '.join(hparam_keywords(specs[name].algorithm))}" in text, text
                checked += 1
    assert checked > 50
    # the cases of issue 46: RMSprop's and Adagrad's fields elsewhere, and back
    for algorithm, kw, named in [("adamw", dict(alpha=0.9), "alpha"), ("sgd", dict(centered=True), "centered"),
                                 ("rmsprop", dict(lr_decay=0.1), "lr_decay"),
                                 ("adagrad", dict(initial_accumulator_value=0.1, momentum=0.9, alpha=0.5),
                                  "momentum, alpha"),
                                 ("adamw", dict(ns_steps=3), "ns_steps")]:
        with pytest.raises(lowbit.InvalidArgumentError, match=rf"not hyper-parameters of {algorithm}: {named} "):
            lowbit.Optimizer(algorithm, **kw)
    with pytest.raises(lowbit.InvalidArgumentError, match="Muon's"):
        lowbit.Optimizer("adamw", ns_steps=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lr_dcay'"):  # no algorithm's
        lowbit.Optimizer("adagrad", lr_dcay=0.1)
    # None: not given (the default), for any name an algorithm has
    with lowbit.Optimizer("sgd", betas=None, alpha=None, lr=None) as opt, lowbit.Optimizer("sgd") as ref:
        assert opt.get_hparams() == ref.get_hparams()


def test_out_of_range_values_are_refused_by_name():
    for algorithm, kw, named in [("rmsprop", dict(alpha=1.5), "alpha"), ("adagrad", dict(lr_decay=-1.0), "lr_decay"),
                                 ("adagrad", dict(initial_accumulator_value=math.nan), "initial_accumulator_value"),
                                 ("rmsprop", dict(momentum=0.9, centered=True), "centered")]:
        with pytest.raises((lowbit.InvalidArgumentError, lowbit.UnsupportedError), match=named):
            lowbit.Optimizer(algorithm, **kw)


RMSPROP_ADAGRAD = [
    ("rmsprop", dict(lr=1e-2, alpha=0.9, eps=1e-6, weight_decay=0.01, centered=True)),
    ("rmsprop", dict(lr=5e-3, alpha=0.95, momentum=0.9)),
    ("adagrad", dict(lr=5e-2, lr_decay=1e-2, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-8)),
]


@pytest.mark.parametrize("algorithm,kw", RMSPROP_ADAGRAD, ids=["rmsprop-centered", "rmsprop-momentum", "adagrad"])
def test_keyword_built_rmsprop_and_adagrad_step_as_torch_in_float64(algorithm, kw, rng):
    torch = pytest.importorskip("torch")
    peer = {"rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad}[algorithm]
    p = rng.standard_normal(4097).astype(np.float32)
    ref = torch.nn.Parameter(torch.from_numpy(p.astype(np.float64)))
    ref_opt = peer([ref], **kw)
    g = np.zeros_like(p)
    with lowbit.Optimizer(algorithm, state="fp32", **kw) as opt:
        opt.add_param(p, grad=g)
        for _ in range(30):
            g[...] = rng.standard_normal(p.shape).astype(np.float32) * 0.3
            ref.grad = torch.from_numpy(g.astype(np.float64))
            opt.step()
            ref_opt.step()
    want = ref.detach().numpy()
    rel = np.abs(p - want).max() / np.abs(want).max()
    assert rel <= 2e-5, f"{algorithm} {kw}: {rel:.3g} from torch.optim's float64 run"

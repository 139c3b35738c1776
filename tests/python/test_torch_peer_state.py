"""State-dict interop of lowbit.torch with bitsandbytes and torchao (installed
from PyPI by scripts/requirements-test.txt; CPU builds) and the export to a
plain torch.optim state dict.

* Decoders (_peer_state.py, written from the formats' descriptions) against
  the libraries' own dequantization: bitsandbytes' ``F.dequantize_blockwise``
  and torchao's ``OptimState*.dequantize()``, exactly.
* load_state_dict of a bitsandbytes Adam8bit / AdamW8bit / Lion8bit /
  PagedAdamW8bit or torchao AdamW8bit / AdamW4bit / AdamWFp8 state dict
  (a 32768-element matrix and a 64-element bias, so both the quantized and
  the small float32 forms) into lowbit optimizers of several formats: the
  moments lowbit then holds are the peer's decoded moments re-encoded in its
  own format (equal to loading the same fp32 moments from a torch-layout
  dict), step counts carried, and training goes on.
* torch_state_dict(): loads into torch.optim.AdamW / SGD, which hold the
  dequantized moments, bit for bit."""

import copy

import pytest

torch = pytest.importorskip("torch")
import lowbit.torch as lt  # noqa: E402
from lowbit.torch._peer_state import peer_kind, to_torch_layout  # noqa: E402


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(64, 512, generator=g)), torch.nn.Parameter(torch.randn(64, generator=g))]


def _train(opt, params, seed, steps=3):
    g = torch.Generator().manual_seed(seed + 7)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def _reference_load(cls, kwargs, params, torch_layout_sd):
    """What a lowbit optimizer holds after loading these fp32 moments."""
    ref = cls([p.detach().clone().requires_grad_() for p in params], **kwargs)
    ref.load_state_dict(torch_layout_sd)
    return ref


def _moments(opt, params, n):
    return [[opt.read_moment(p, k) for k in range(n)] for p in params]


BNB = [("AdamW8bit", lt.AdamW, 2), ("Adam8bit", lt.Adam, 2), ("PagedAdamW8bit", lt.AdamW, 2), ("Lion8bit", lt.Lion, 1)]


@pytest.mark.parametrize("name,cls,n", BNB, ids=[b[0] for b in BNB])
@pytest.mark.parametrize("state", ["8bit", "4bit", "fp32"])
def test_bitsandbytes_state_dict_loads(name, cls, n, state, seed):
    bnb = pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as F

    params = _params(seed)
    peer = getattr(bnb.optim, name)(params, lr=1e-3)
    _train(peer, params, seed)
    sd = peer.state_dict()
    assert peer_kind(sd["state"]) == "bitsandbytes"
    decoded = to_torch_layout(sd["state"], {0: tuple(params[0].shape), 1: tuple(params[1].shape)})
    # the decoder against bitsandbytes' own dequantization of its live state
    live = peer.state[params[0]]
    for k, key in ((1, "exp_avg"), (2, "exp_avg_sq"))[:n]:
        want = F.dequantize_blockwise(live[f"state{k}"], absmax=live[f"absmax{k}"], code=live[f"qmap{k}"],
                                      blocksize=live[f"state{k}"].numel() // live[f"absmax{k}"].numel())
        assert torch.equal(decoded[0][key], want.reshape(params[0].shape).float())
    assert torch.equal(decoded[1]["exp_avg"], peer.state[params[1]]["state1"])  # the small param: fp32
    mine = [p.detach().clone().requires_grad_() for p in params]
    opt = cls(mine, lr=1e-3, state=state, min_quantized_numel=0)
    opt.load_state_dict(sd)
    ref = _reference_load(cls, dict(lr=1e-3, state=state, min_quantized_numel=0), params,
                          {"state": decoded, "param_groups": sd["param_groups"]})
    for a, b in zip(_moments(opt, mine, n), _moments(ref, ref.param_groups[0]["params"], n)):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    assert opt.param_info(mine[0]).step == 3
    _train(opt, mine, seed + 1, steps=1)
    assert opt.param_info(mine[0]).step == 4


TORCHAO = [("AdamW8bit", 8), ("AdamW4bit", 4), ("AdamWFp8", "fp8")]


@pytest.mark.parametrize("name,kind", TORCHAO, ids=[t[0] for t in TORCHAO])
@pytest.mark.parametrize("state", ["8bit", "4bit-sr"])
def test_torchao_state_dict_loads(name, kind, state, seed):
    pytest.importorskip("torchao")
    import torchao.optim

    params = _params(seed)
    peer = getattr(torchao.optim, name)(params, lr=1e-3)
    _train(peer, params, seed)
    sd = peer.state_dict()
    assert peer_kind(sd["state"]) == "torchao"
    decoded = to_torch_layout(sd["state"], {0: tuple(params[0].shape), 1: tuple(params[1].shape)})
    for key in ("exp_avg", "exp_avg_sq"):
        v = peer.state[params[0]][key]
        assert type(v).__name__.startswith("OptimState")
        assert torch.equal(decoded[0][key], v.dequantize().float().reshape(params[0].shape))
    mine = [p.detach().clone().requires_grad_() for p in params]
    opt = lt.AdamW(mine, lr=1e-3, state=state, min_quantized_numel=0)
    opt.load_state_dict(sd)
    ref = _reference_load(lt.AdamW, dict(lr=1e-3, state=state, min_quantized_numel=0), params,
                          {"state": decoded, "param_groups": sd["param_groups"]})
    for a, b in zip(_moments(opt, mine, 2), _moments(ref, ref.param_groups[0]["params"], 2)):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    assert opt.param_info(mine[0]).step == 3


def test_peer_decoders_refuse_non_blockwise_bitsandbytes_state():
    state = {0: {"step": 1, "state1": torch.zeros(300, dtype=torch.uint8), "qmap1": torch.zeros(256),
                 "max1": torch.ones(1)}}
    with pytest.raises(ValueError, match="block_wise=False"):
        to_torch_layout(state, {0: (300,)})


@pytest.mark.parametrize("cls,torch_cls,kwargs", [
    (lt.AdamW, torch.optim.AdamW, dict(state="8bit")),
    (lt.Adam, torch.optim.Adam, dict(state="4bit-sr")),
    (lt.SGD, torch.optim.SGD, dict(state="bf16", momentum=0.9)),
])
def test_export_to_a_plain_torch_state_dict(cls, torch_cls, kwargs, seed):
    params = _params(seed)
    opt = cls(params, lr=1e-3, min_quantized_numel=0, **kwargs)
    _train(opt, params, seed)
    sd = opt.torch_state_dict()
    twins = [p.detach().clone().requires_grad_() for p in params]
    plain = torch_cls(twins, lr=1e-3, **({"momentum": 0.9} if torch_cls is torch.optim.SGD else {}))
    plain.load_state_dict(copy.deepcopy(sd))
    names = cls._moment_names
    for p, q in zip(params, twins):
        for k, name in enumerate(names):
            assert torch.equal(plain.state[q][name], opt.read_moment(p, k).reshape(p.shape))
        if torch_cls is not torch.optim.SGD:
            assert float(plain.state[q]["step"]) == 3.0
    _train(plain, twins, seed + 1, steps=1)  # torch goes on from it
    # and back: the exported dict loads into lowbit again
    again = cls([p.detach().clone().requires_grad_() for p in params], lr=1e-3, min_quantized_numel=0, **kwargs)
    again.load_state_dict(sd)
    with pytest.raises(ValueError, match="no Lion"):
        lt.Lion(params, lr=1e-4).torch_state_dict()

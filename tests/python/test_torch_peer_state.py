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
                                      blocksize=256)
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


# Issue 45 (2): every size class of a bitsandbytes param: under its
# min_8bit_size (fp32 state), uint8 state of one partial block, multiples of
# 256, sizes that are not (4100: 17 blocks where ceil(4100 / 17) = 242 gave
# elements the wrong block), a big one.
BNB_NUMELS = [(100, 4096), (4095, 4096), (100, 0), (4096, 4096), (8192, 4096), (4100, 4096), (5000, 4096),
              (30000, 4096), (65281, 4096), ((1 << 20) + 7, 4096)]


@pytest.mark.parametrize("numel,min_8bit_size", BNB_NUMELS, ids=[f"{n}-min{m}" for n, m in BNB_NUMELS])
@pytest.mark.parametrize("name", ["AdamW8bit", "Lion8bit"])
def test_bitsandbytes_decode_equals_its_dequantize_blockwise_at_every_size(name, numel, min_8bit_size, seed):
    bnb = pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as F

    g = torch.Generator().manual_seed(seed + numel)
    p = torch.nn.Parameter(torch.randn(numel, generator=g))
    peer = getattr(bnb.optim, name)([p], lr=1e-3, min_8bit_size=min_8bit_size)
    _train(peer, [p], seed)
    decoded = to_torch_layout(peer.state_dict()["state"], {0: (numel,)})[0]
    live = peer.state[p]
    for k, key in ((1, "exp_avg"), (2, "exp_avg_sq"))[:2 if name == "AdamW8bit" else 1]:
        if numel < min_8bit_size:
            assert live[f"state{k}"].dtype == torch.float32
            want = live[f"state{k}"]
        else:
            assert live[f"absmax{k}"].numel() == -(-numel // 256)
            want = F.dequantize_blockwise(live[f"state{k}"], absmax=live[f"absmax{k}"], code=live[f"qmap{k}"],
                                          blocksize=256)
        assert decoded[key].dtype == torch.float32
        assert torch.equal(decoded[key], want.float()), f"{key}: {int((decoded[key] != want).sum())} elements differ"


@pytest.mark.parametrize("change", [-1, 1], ids=["one-block-short", "one-block-long"])
def test_a_bitsandbytes_absmax_of_another_block_count_is_refused_and_changes_nothing(change, seed):
    bnb = pytest.importorskip("bitsandbytes")
    params = [torch.nn.Parameter(torch.randn(5000)), torch.nn.Parameter(torch.randn(64))]
    peer = bnb.optim.AdamW8bit(params, lr=1e-3)
    _train(peer, params, seed)
    sd = peer.state_dict()
    q = sd["state"][0]["__bnb_optimizer_quant_state__"]
    absmax = q["absmax2"]
    q["absmax2"] = absmax[:-1] if change < 0 else torch.cat([absmax, absmax[-1:]])
    with pytest.raises(ValueError, match=rf"absmax2 has {absmax.numel() + change} scales for 5000 codes.*"
                                         rf"block of 256 elements, {absmax.numel()} here"):
        to_torch_layout(sd["state"], {0: (5000,), 1: (64,)})
    opt = lt.AdamW([p.detach().clone().requires_grad_() for p in params], lr=1e-3, state="8bit",
                   min_quantized_numel=0)
    _train(opt, opt.param_groups[0]["params"], seed + 3)
    before = opt.state_dict()
    values = [p.detach().clone() for p in opt.param_groups[0]["params"]]
    with pytest.raises(ValueError, match="absmax2 has"):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert all(torch.equal(a["checkpoint"], b["checkpoint"])
               for a, b in zip(before["lowbit"]["handles"], after["lowbit"]["handles"]))
    assert all(torch.equal(a, b) for a, b in zip(values, opt.param_groups[0]["params"]))


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


def _gap_bound(qmap):
    """One quantization step of a map: its largest gap between neighbouring values."""
    v = torch.sort(qmap.float()).values
    return float((v[1:] - v[:-1]).max())


NEXT = [("bitsandbytes", "AdamW8bit", "8bit"), ("torchao", "AdamW8bit", "8bit"), ("torchao", "AdamW4bit", "4bit"),
        ("torchao", "AdamWFp8", "fp8")]


@pytest.mark.parametrize("lib,name,state", NEXT, ids=[f"{a}-{b}" for a, b, _ in NEXT])
def test_the_next_step_after_loading_matches_the_peers_within_one_quantization_step(lib, name, state, seed):
    """After loading a peer's state dict, one more step on the same gradient:
    every moment element of lowbit's state is within one quantization step
    (the block's scale times the largest gap of the peer's map; FP8: an
    e4m3 step of the value) of the peer's own next state."""
    mod = pytest.importorskip(lib)
    if lib == "torchao":
        import torchao.optim as mod
    else:
        mod = mod.optim
    params = _params(seed)
    peer = getattr(mod, name)(params, lr=1e-3)
    _train(peer, params, seed)
    mine = [p.detach().clone().requires_grad_() for p in params]
    opt = lt.AdamW(mine, lr=1e-3, state=state, min_quantized_numel=0)
    opt.load_state_dict(peer.state_dict())
    g = torch.Generator().manual_seed(seed + 99)
    for p, q in zip(params, mine):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    peer.step()
    opt.step()
    after = to_torch_layout(peer.state_dict()["state"], {0: tuple(params[0].shape), 1: tuple(params[1].shape)})[0]
    live = peer.state[params[0]]
    worst = 0.0
    for k, key in enumerate(("exp_avg", "exp_avg_sq")):
        ours = opt.read_moment(mine[0], k).reshape(params[0].shape)
        theirs = after[key]
        if lib == "bitsandbytes":
            scale = live[f"absmax{k + 1}"].float().repeat_interleave(256)[:theirs.numel()].reshape(theirs.shape)
            allowed = scale * _gap_bound(live[f"qmap{k + 1}"])
        elif name == "AdamWFp8":
            allowed = torch.maximum(ours.abs(), theirs.abs()) / 8 + live[key].scale.float().max() * 2.0 ** -9
        else:
            v = live[key]
            block = 256 if name == "AdamW8bit" else 128
            scale = v.scale.float().repeat_interleave(block)[:theirs.numel()].reshape(theirs.shape)
            allowed = scale * _gap_bound(v.qmap)
        ratio = float(((ours - theirs).abs() / allowed.clamp_min(1e-30)).max())
        worst = max(worst, ratio)
        # 1% slack: the bound uses the peer's block scale, lowbit's own may be a little larger
        assert ratio <= 1.01, f"{key}: {ratio:.4f} quantization steps apart"
    print(f"{lib} {name} -> lowbit {state}: the next step's moments within {worst:.4f} quantization steps")


def test_a_peer_state_dict_that_does_not_fit_is_refused_and_changes_nothing(seed):
    bnb = pytest.importorskip("bitsandbytes")
    params = _params(seed)
    lion = bnb.optim.Lion8bit(params, lr=1e-4)
    _train(lion, params, seed)
    opt = lt.AdamW([p.detach().clone().requires_grad_() for p in params], lr=1e-3, state="8bit",
                   min_quantized_numel=0)
    _train(opt, opt.param_groups[0]["params"], seed + 3)
    before = opt.state_dict()

    def unchanged():
        after = opt.state_dict()
        assert all(torch.equal(a["checkpoint"], b["checkpoint"])
                   for a, b in zip(before["lowbit"]["handles"], after["lowbit"]["handles"]))

    with pytest.raises(ValueError, match=r"lacks \['exp_avg_sq'\]"):  # another algorithm (Lion's one moment)
        opt.load_state_dict(lion.state_dict())
    unchanged()
    other = bnb.optim.AdamW8bit([torch.nn.Parameter(torch.randn(64, 512))], lr=1e-3)
    _train(other, other.param_groups[0]["params"], seed)
    with pytest.raises(ValueError, match="has 1 params, this optimizer 2"):  # another parameter count
        opt.load_state_dict(other.state_dict())
    unchanged()
    shaped = [torch.nn.Parameter(torch.randn(32, 512)), torch.nn.Parameter(torch.randn(64))]
    peer = bnb.optim.AdamW8bit(shaped, lr=1e-3)
    _train(peer, shaped, seed)
    with pytest.raises(ValueError, match="16384 elements, the param 32768"):  # another shape
        opt.load_state_dict(peer.state_dict())
    unchanged()

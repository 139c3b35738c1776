"""Issue 46: bitsandbytes' RMSprop and Adagrad state dicts (``RMSprop8bit``,
``RMSprop32bit``, ``RMSprop``, ``Adagrad8bit``, ``Adagrad32bit``, trained on
bitsandbytes' CPU backend in this process) load into lowbit.torch.RMSprop /
Adagrad (_peer_state.py: state1 is torch's ``square_avg`` / ``sum``, the
groups' ``betas`` become torch's names).

* The decoder against bitsandbytes' own ``F.dequantize_blockwise``, exactly,
  at every size class (fp32 under min_8bit_size, partial blocks).
* The loaded moments: exactly the decoded ones with fp32 state; in 8-bit /
  4-bit state, exactly what lowbit makes of the same fp32 moments
  (write_moment) and within one re-encoding (half the largest gap of lowbit's
  unsigned map times the block's scale) of the decoded ones. Step counts and
  hyper-parameters carried.
* Training goes on: from a 32-bit state, 20 more steps equal bitsandbytes'
  own 20 more steps within 1e-5 relative (the rules are the same); from an
  8-bit state, the next step's moments are within one quantization step of
  bitsandbytes' next state.
* What means something else is refused, naming it, and changes nothing:
  momentum (bitsandbytes ignores it and keeps no buffer), max_unorm, a
  second state, another optimizer's betas, a wrong absmax count, a missing
  state1.
* A plain torch.optim.RMSprop / Adagrad state dict loads too (RMSprop
  without momentum keeps square_avg alone), and training goes on as torch's.
Seed: LOWBIT_TEST_SEED."""

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
import bitsandbytes.functional as F  # noqa: E402

import lowbit.torch as lt  # noqa: E402
from lowbit.torch._peer_state import peer_kind, to_torch_layout  # noqa: E402

SHAPES = ((64, 512), (4100,), (64,))  # whole blocks, a partial last block, under min_8bit_size (fp32)
PEERS = {  # bitsandbytes class: (lowbit class, lowbit algorithm, torch's name of state1, its kwargs)
    "RMSprop8bit": (lt.RMSprop, "rmsprop", "square_avg", dict(lr=1e-3, alpha=0.9, weight_decay=0.01)),
    "RMSprop32bit": (lt.RMSprop, "rmsprop", "square_avg", dict(lr=1e-3, alpha=0.95)),
    "RMSprop": (lt.RMSprop, "rmsprop", "square_avg", dict(lr=2e-3, eps=1e-6, optim_bits=8)),
    "Adagrad8bit": (lt.Adagrad, "adagrad", "sum", dict(lr=1e-2, weight_decay=0.01)),
    "Adagrad32bit": (lt.Adagrad, "adagrad", "sum", dict(lr=1e-2, eps=1e-8)),
}
# Half the largest gap of lowbit's unsigned maps (shared/golden/qmaps.json),
# whose top code is 1: one re-encoding moves a value by at most this times
# its block's largest value (test_torch_ecosystem.HALF_GAP, second moment).
HALF_GAP_UNSIGNED = {"8bit": 0.0035157, "4bit": 0.0625}
BLOCK = {"8bit": 256, "4bit": 128}


def _params(seed, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _grads(seed, params, steps):
    g = torch.Generator().manual_seed(seed + 7)
    return [[torch.randn(p.shape, generator=g) * (0.5 + 0.25 * k) for k, p in enumerate(params)]
            for _ in range(steps)]


def _train(opt, params, grads):
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()


def _peer(name, seed, steps=3, shapes=SHAPES, **extra):
    cls, algo, key, kw = PEERS[name]
    params = _params(seed, shapes)
    peer = getattr(bnb.optim, name)(params, **{**kw, **extra})
    _train(peer, params, _grads(seed, params, steps))
    return params, peer


def _shapes(params):
    return {i: tuple(p.shape) for i, p in enumerate(params)}


def _twins(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def _block_max(x: torch.Tensor, block: int) -> torch.Tensor:
    """Each element's block's largest magnitude (blocks of `block` over the flattened tensor)."""
    flat = x.reshape(-1).double().abs()
    n = flat.numel()
    padded = torch.nn.functional.pad(flat, (0, -n % block))
    return padded.reshape(-1, block).amax(dim=1).repeat_interleave(block)[:n].reshape(x.shape)


NUMELS = [(100, 4096), (4095, 4096), (4096, 4096), (4100, 4096), (30000, 4096), (300, 0)]


@pytest.mark.parametrize("numel,min_8bit_size", NUMELS, ids=[f"{n}-min{m}" for n, m in NUMELS])
@pytest.mark.parametrize("name", ["RMSprop8bit", "Adagrad8bit"])
def test_decode_equals_dequantize_blockwise_at_every_size(name, numel, min_8bit_size, seed):
    _, algo, key, _ = PEERS[name]
    params, peer = _peer(name, seed + numel, shapes=((numel,),), min_8bit_size=min_8bit_size)
    sd = peer.state_dict()
    assert peer_kind(sd["state"]) == "bitsandbytes"
    decoded = to_torch_layout(sd["state"], {0: (numel,)}, "bitsandbytes", algo)[0]
    assert sorted(decoded) == sorted(["step", key]) and decoded["step"] == 3
    live = peer.state[params[0]]
    if numel < min_8bit_size:
        assert live["state1"].dtype == torch.float32
        want = live["state1"]
    else:
        assert live["state1"].dtype == torch.uint8 and live["absmax1"].numel() == -(-numel // 256)
        want = F.dequantize_blockwise(live["state1"], absmax=live["absmax1"], code=live["qmap1"], blocksize=256)
    assert decoded[key].dtype == torch.float32
    assert torch.equal(decoded[key], want.float()), f"{int((decoded[key] != want).sum())} elements differ"
    assert float(decoded[key].min()) >= 0.0  # a square average / sum, on bitsandbytes' signed map


@pytest.mark.parametrize("state", ["fp32", "8bit", "4bit"])
@pytest.mark.parametrize("name", list(PEERS))
def test_state_dict_loads(name, state, seed):
    cls, algo, key, kw = PEERS[name]
    params, peer = _peer(name, seed)
    sd = peer.state_dict()
    decoded = to_torch_layout(sd["state"], _shapes(params), "bitsandbytes", algo)
    mine = _twins(params)
    opt = cls(mine, lr=0.5, state=state, min_quantized_numel=0)
    opt.load_state_dict(sd)

    group = opt.param_groups[0]
    assert group["lr"] == kw["lr"] and group["state"] == state  # hyper-parameters from the state dict
    if algo == "rmsprop":
        assert group["alpha"] == kw.get("alpha", 0.99) and group["momentum"] == 0.0 and not group["centered"]
        assert "betas" not in group
    else:
        assert group["lr_decay"] == 0.0 and group["initial_accumulator_value"] == 0.0
    # the reference: the decoded fp32 moments loaded from torch's layout
    ref_params = _twins(params)
    ref = cls(ref_params, state=state, min_quantized_numel=0)
    ref.load_state_dict({"state": decoded, "param_groups": [{**group, "params": [0, 1, 2]}]})
    for i, (p, q) in enumerate(zip(mine, ref_params)):
        assert opt.param_info(p).step == 3
        assert len(opt.state[p]) == 2 and key in opt.state[p]  # step and the one moment
        got = opt.read_moment(p, 0).reshape(p.shape)
        assert torch.equal(got, ref.read_moment(q, 0).reshape(p.shape))
        want = decoded[i][key]
        if state == "fp32":
            assert torch.equal(got, want)
        else:
            bound = HALF_GAP_UNSIGNED[state] * _block_max(want, BLOCK[state]) * 1.001
            err = (got.double() - want.double()).abs()
            assert bool((err <= bound).all()), f"param {i}: {float((err / bound.clamp_min(1e-30)).max()):.3f} bounds"
    _train(opt, mine, _grads(seed + 1, mine, 1))  # training goes on
    assert opt.param_info(mine[0]).step == 4


@pytest.mark.parametrize("name", ["RMSprop32bit", "Adagrad32bit"])
def test_training_goes_on_as_bitsandbytes_does_from_a_32bit_state(name, seed):
    """Same rule: 20 more steps of lowbit (fp32 state) after the import equal
    20 more steps of bitsandbytes itself within 1e-5 relative."""
    cls, _, key, _ = PEERS[name]
    params, peer = _peer(name, seed, steps=5)
    mine = _twins(params)
    opt = cls(mine, state="fp32")
    opt.load_state_dict(peer.state_dict())
    more = _grads(seed + 3, params, 20)
    _train(peer, params, more)
    _train(opt, mine, more)
    for i, (p, q) in enumerate(zip(params, mine)):
        rel = float((p.detach() - q.detach()).abs().max() / p.detach().abs().max())
        assert rel <= 1e-5, f"param {i}: {rel:.3g}"
        theirs = peer.state[p]["state1"]
        ours = opt.read_moment(q, 0).reshape(theirs.shape)
        rel = float((ours - theirs).abs().max() / theirs.abs().max())
        assert rel <= 1e-5, f"{key} of param {i}: {rel:.3g}"
        assert opt.param_info(q).step == peer.state[p]["step"] == 25


@pytest.mark.parametrize("name", ["RMSprop8bit", "Adagrad8bit"])
def test_the_next_step_after_loading_an_8bit_state_is_within_one_quantization_step(name, seed):
    """After the import, one more step on the same gradient: lowbit's 8-bit
    moment is within one quantization step of bitsandbytes' next state (its
    block's scale times the largest gap of its map)."""
    cls, algo, key, _ = PEERS[name]
    params, peer = _peer(name, seed)
    mine = _twins(params)
    opt = cls(mine, state="8bit", min_quantized_numel=0)
    opt.load_state_dict(peer.state_dict())
    step = _grads(seed + 5, params, 1)
    _train(peer, params, step)
    _train(opt, mine, step)
    after = to_torch_layout(peer.state_dict()["state"], _shapes(params), "bitsandbytes", algo)[0]
    live = peer.state[params[0]]
    ours = opt.read_moment(mine[0], 0).reshape(params[0].shape)
    qmap = torch.sort(live["qmap1"].float()).values
    scale = live["absmax1"].float().repeat_interleave(256)[:ours.numel()].reshape(ours.shape)
    allowed = scale * float((qmap[1:] - qmap[:-1]).max())
    ratio = float(((ours - after[key]).abs() / allowed.clamp_min(1e-30)).max())
    print(f"bitsandbytes {name} -> lowbit 8bit: the next step's {key} within {ratio:.4f} quantization steps")
    assert ratio <= 1.01


def _lowbit_opt(cls, seed):
    params = _params(seed + 11)
    opt = cls(params, state="8bit", min_quantized_numel=0)
    _train(opt, params, _grads(seed + 12, params, 2))
    return opt


def _refused(opt, sd, match):
    before = opt.state_dict()
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert all(torch.equal(a["checkpoint"], b["checkpoint"])
               for a, b in zip(before["lowbit"]["handles"], after["lowbit"]["handles"]))
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == \
        [{k: v for k, v in g.items() if k != "params"} for g in groups]


def test_what_does_not_mean_the_same_is_refused_and_changes_nothing(seed):
    rms, ada = _lowbit_opt(lt.RMSprop, seed), _lowbit_opt(lt.Adagrad, seed)
    # bitsandbytes' RMSprop takes momentum and ignores it: no buffer to import
    _, peer = _peer("RMSprop8bit", seed, momentum=0.9)
    sd = peer.state_dict()
    assert sd["param_groups"][0]["betas"][1] == 0.9
    _refused(rms, sd, r"param group 0 .* momentum=0\.9 \(betas\[1\]\), which bitsandbytes' rule ignores")
    # (the documented way out: betas[1] = 0, the RMSprop bitsandbytes ran)
    sd["param_groups"][0]["betas"] = (sd["param_groups"][0]["betas"][0], 0)
    lt.RMSprop(_params(seed), state="8bit", min_quantized_numel=0).load_state_dict(sd)
    # max_unorm: an update-norm clip lowbit's rules have not
    _, peer = _peer("Adagrad8bit", seed)
    sd = peer.state_dict()
    sd["state"][0]["__bnb_optimizer_quant_state__"]["unorm_vec"] = torch.zeros(1)
    _refused(ada, sd, r"param 0: .*max_unorm > 0")
    # a second state: Adam's, not RMSprop's
    params = _params(seed)
    adam = bnb.optim.AdamW8bit(params, lr=1e-3)
    _train(adam, params, _grads(seed, params, 2))
    _refused(rms, adam.state_dict(), r"two moments \(state1 and state2\).*RMSprop keeps one")
    # another optimizer's betas: Lion's into Adagrad, Adagrad's (alpha 0) into RMSprop
    lion = bnb.optim.Lion8bit(params, lr=1e-4)
    _train(lion, params, _grads(seed, params, 2))
    _refused(ada, lion.state_dict(), r"param group 0 has betas=\(0\.9, 0\.99\); bitsandbytes' Adagrad keeps \(0, 0\)")
    _, peer = _peer("Adagrad8bit", seed)
    _refused(rms, peer.state_dict(), r"alpha = betas\[0\] = 0, which bitsandbytes' RMSprop refuses")
    sd = peer.state_dict()
    del sd["param_groups"][0]["betas"]
    _refused(ada, sd, r"param group 0 .* betas=None")


@pytest.mark.parametrize("change", [-1, 1], ids=["one-block-short", "one-block-long"])
def test_a_wrong_absmax_count_or_a_missing_state_is_refused_and_changes_nothing(change, seed):
    rms = _lowbit_opt(lt.RMSprop, seed)
    _, peer = _peer("RMSprop8bit", seed)
    sd = peer.state_dict()
    q = sd["state"][1]["__bnb_optimizer_quant_state__"]  # the 4100-element param: 17 blocks
    absmax = q["absmax1"]
    assert absmax.numel() == 17
    q["absmax1"] = absmax[:-1] if change < 0 else torch.cat([absmax, absmax[-1:]])
    _refused(rms, sd, rf"param 1: bitsandbytes absmax1 has {17 + change} scales for 4100 codes.*"
                      r"block of 256 elements, 17 here")
    sd = peer.state_dict()
    del sd["state"][0]["__bnb_optimizer_quant_state__"]["state1"]
    _refused(rms, sd, r"param 0: this bitsandbytes state lacks state1")
    sd = peer.state_dict()
    del sd["state"][0]["__bnb_optimizer_quant_state__"]["absmax1"]
    _refused(rms, sd, r"param 0: bitsandbytes state1 has codes but no absmax1")


TORCH = [("RMSprop", lt.RMSprop, dict(lr=1e-2, alpha=0.9)), ("RMSprop", lt.RMSprop, dict(lr=5e-3, momentum=0.9)),
         ("RMSprop", lt.RMSprop, dict(lr=5e-3, centered=True, weight_decay=0.01)),
         ("Adagrad", lt.Adagrad, dict(lr=5e-2, lr_decay=1e-2, initial_accumulator_value=0.1))]


@pytest.mark.parametrize("name,cls,kw", TORCH, ids=["rmsprop", "rmsprop-momentum", "rmsprop-centered", "adagrad"])
def test_a_plain_torch_state_dict_loads_and_training_goes_on_as_torch(name, cls, kw, seed):
    """torch.optim.RMSprop / Adagrad state dicts (square_avg alone without
    momentum or centring; momentum_buffer or grad_avg beside it) load into
    fp32 state exactly, and 10 more steps equal torch's within 1e-5."""
    params = _params(seed)
    peer = getattr(torch.optim, name)(params, **kw)
    _train(peer, params, _grads(seed, params, 4))
    mine = _twins(params)
    opt = cls(mine, state="fp32")
    opt.load_state_dict(peer.state_dict())
    for p, q in zip(params, mine):
        theirs = {k: v for k, v in peer.state[p].items() if k != "step"}
        assert sorted(opt.state[q]) == sorted(["step"] + list(theirs)), (sorted(opt.state[q]), sorted(theirs))
        for key, value in theirs.items():
            assert torch.equal(opt.state[q][key], value), key
        assert opt.param_info(q).step == 4
    more = _grads(seed + 3, params, 10)
    _train(peer, params, more)
    _train(opt, mine, more)
    for i, (p, q) in enumerate(zip(params, mine)):
        rel = float((p.detach() - q.detach()).abs().max() / p.detach().abs().max())
        assert rel <= 1e-5, f"param {i}: {rel:.3g}"

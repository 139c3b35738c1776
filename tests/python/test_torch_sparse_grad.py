"""Sparse (torch.sparse_coo) gradients, as nn.Embedding(sparse=True) gives
them, in lowbit.torch: opt.step() and step_in_backward densify each one for
its step (the optimizer's usual step on the dense gradient, zeros in the
absent rows, not SparseAdam), so a model with a sparse embedding gets the
bits of the same model with a dense one; CPUOffload refuses them by name.

Why the tokens of the tied comparisons never repeat within a batch: with a
tied embedding torch's autograd adds the embedding's contribution to the LM
head's dense gradient, a sparse one row entry at a time (head + v1 + v2) and
a dense one after summing its rows (head + (v1 + v2)), so a repeated token
can make torch's two gradients differ in the last bit before lowbit reads
them. Without repeats both are head + v exactly. The untied model's sparse
and dense embedding gradients are compared with repeated tokens (the
gradient lowbit densifies against its dense form, given explicitly)."""

import pytest

torch = pytest.importorskip("torch")
import lowbit.torch as lt  # noqa: E402

V, D = 257, 40  # 10280 embedding elements: quantized state (min_quantized_numel=0 anyway)

STATES = ["8bit", "4bit", "4bit-sr"]


class _LM(torch.nn.Module):
    def __init__(self, sparse: bool, tied: bool, seed: int):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D, sparse=sparse)
        self.mid = torch.nn.Linear(D, D)
        self.head = torch.nn.Linear(D, V, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.emb(x))))


def _batches(seed, n, repeats):
    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(n):
        if repeats:
            x = torch.randint(0, V, (3, 24), generator=g)
        else:
            x = torch.randperm(V, generator=g)[:72].view(3, 24)  # no token twice in a batch
        out.append((x, torch.randint(0, V, (3, 24), generator=g)))
    return out


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _opt(model, state):
    return lt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, state=state, min_quantized_numel=0)


def _train(model, opt, batches, in_backward, bucket_numel=0):
    hooks = lt.step_in_backward(opt, bucket_numel=bucket_numel) if in_backward else None
    for x, y in batches:
        _loss(model, x, y).backward()
        if in_backward:
            assert all(p.grad is None for p in model.parameters()), "the gradients were not freed"
        else:
            if model.emb.sparse and model.head.weight is not model.emb.weight:
                assert model.emb.weight.grad.layout is torch.sparse_coo  # what the test is about
            opt.step()
            assert all(dev.dense_grads is None for dev in opt._devices.values()), "a dense temporary was kept"
            opt.zero_grad(set_to_none=True)
    if hooks is not None:
        hooks.remove()


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("mode", ["step", "in_backward", "in_backward_one_bucket"])
@pytest.mark.parametrize("state", STATES)
def test_sparse_embedding_equals_dense_embedding(state, mode, tied, seed):
    """A model with nn.Embedding(sparse=True) trained with opt.step() or
    step_in_backward (each param at once, or all in one bucket stepped at
    the end of backward) gets the params and state of the same model with a
    dense embedding and opt.step(), bit for bit."""
    batches = _batches(seed, 4, repeats=False)
    ref, model = _LM(False, tied, seed), _LM(True, tied, seed)
    ref_opt, opt = _opt(ref, state), _opt(model, state)
    _train(ref, ref_opt, batches, in_backward=False)
    _train(model, opt, batches, in_backward=mode != "step", bucket_numel=1 << 30 if mode.endswith("bucket") else 0)
    assert _same(ref, model)
    for a, b in zip(ref.parameters(), model.parameters()):
        assert ref_opt.param_info(a).step == opt.param_info(b).step == 4
        for k in range(2):
            assert torch.equal(ref_opt.read_moment(a, k), opt.read_moment(b, k))


@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in_backward"])
@pytest.mark.parametrize("state", ["8bit", "4bit"])
def test_repeated_tokens_step_on_the_densified_gradient(state, in_backward, seed):
    """Untied, tokens repeated: each step equals the step on the sparse
    gradient's dense form (duplicates summed) given as a dense .grad."""
    ref, model = _LM(False, False, seed), _LM(True, False, seed)
    ref_opt, opt = _opt(ref, state), _opt(model, state)
    hooks = lt.step_in_backward(opt) if in_backward else None
    for x, y in _batches(seed, 4, repeats=True):
        assert x.flatten().unique().numel() < x.numel()  # some token repeats
        # the reference's gradients: the sparse model's, densified
        probe = _LM(True, False, seed)
        probe.load_state_dict(ref.state_dict())
        _loss(probe, x, y).backward()
        assert probe.emb.weight.grad.layout is torch.sparse_coo
        for p, q in zip(ref.parameters(), probe.parameters()):
            p.grad = q.grad.to_dense()
        ref_opt.step()
        ref_opt.zero_grad()
        _loss(model, x, y).backward()
        if not in_backward:
            opt.step()
            opt.zero_grad()
        assert _same(ref, model)
    if hooks is not None:
        hooks.remove()


def test_a_nonfinite_sparse_gradient_skips_the_step(seed):
    """A NaN in a sparse gradient's entries skips the whole step (as a dense
    NaN does, skip_nonfinite); its rows absent elsewhere do not matter."""
    model = _LM(True, False, seed)
    opt = _opt(model, "8bit")
    batches = _batches(seed, 2, repeats=True)
    x, y = batches[0]
    _loss(model, x, y).backward()
    opt.step()
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches[1]
    model.emb.weight.register_hook(lambda g: g * float("nan"))  # sparse: NaN in its entries only
    _loss(model, x, y).backward()
    opt.step()
    assert opt.last_step_skipped
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
    assert all(opt.param_info(p).step == 1 for p in model.parameters())


def test_cpu_offload_refuses_sparse_gradients(seed):
    """CPUOffload copies each gradient into a dense host buffer as it
    arrives: a sparse one is refused, the param named, the reason given."""
    model = _LM(True, False, seed)
    off = lt.CPUOffload(lt.AdamW, model.parameters(), lr=1e-2, state="8bit")
    try:
        x, y = _batches(seed, 1, repeats=True)[0]
        with pytest.raises(RuntimeError, match=r"CPUOffload: the gradient of param 0 of group 0 \(shape "
                                               r"\(257, 40\)\) is sparse .*nn.Embedding\(sparse=True\).*sparse=False"):
            _loss(model, x, y).backward()
    finally:
        off.close()


def test_compiled_step_with_a_sparse_gradient_falls_back_to_eager(seed):
    """torch.compile'd opt.step() with a sparse grad: dynamo does not take
    sparse tensors and runs the step eagerly (no fullgraph), same bits."""
    pytest.importorskip("torch._dynamo")
    batches = _batches(seed, 2, repeats=False)
    ref, model = _LM(False, False, seed), _LM(True, False, seed)
    ref_opt, opt = _opt(ref, "8bit"), _opt(model, "8bit")
    step = torch.compile(opt.step)
    for x, y in batches:
        _loss(ref, x, y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        _loss(model, x, y).backward()
        step()
        opt.zero_grad()
    assert _same(ref, model)

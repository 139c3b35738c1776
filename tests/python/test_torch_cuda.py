"""lowbit.torch on a CUDA device (skipped without one): the CUDA engine gives
the CPU engine's bits, steps follow the current (non-default) stream, and a
step captured in a CUDA graph replays as eager steps do."""

import pytest
import torch

import lowbit.torch as lt
from seeding import derive

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# A 2-D weight over several 8-bit blocks and 4-bit blocks with a ragged end, a
# vector at the quantization threshold, one below it (fp32 state) and a long row.
SHAPES = [(257, 129), (4096,), (33,), (3, 7000)]


def _params(dtype, device, salt):
    g = torch.Generator().manual_seed(derive("torch_cuda", salt))
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.05).to(dtype).to(device)) for s in SHAPES]


def _grads(params, step, salt):
    g = torch.Generator().manual_seed(derive("torch_cuda_grad", salt, step))
    return [(torch.randn(p.shape, generator=g) * 1e-2).to(p.dtype) for p in params]


def _set_grads(params, step, salt, device):
    for p, grad in zip(params, _grads(params, step, salt)):
        p.grad = grad.to(device)


def _make(cls, params, **kw):
    return cls(params, lr=1e-2, weight_decay=0.01, **kw)


CASES = [
    ("adamw", "8bit", torch.bfloat16, {}),
    ("adamw", "4bit", torch.bfloat16, {}),
    ("adamw", "fp8", torch.bfloat16, {}),
    ("adamw", "fp32", torch.float32, {}),
    ("adamw", "bf16", torch.bfloat16, {"stochastic_rounding": True}),
    ("adamw", "8bit", torch.float16, {"error_correction": True}),
    ("lion", "8bit", torch.bfloat16, {}),
]


@pytest.mark.parametrize("algo,state,dtype,extra", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_cuda_step_equals_cpu_bit_for_bit(algo, state, dtype, extra):
    cls = lt.AdamW if algo == "adamw" else lt.Lion
    salt = f"{algo}-{state}-{dtype}"
    cpu, gpu = _params(dtype, "cpu", salt), _params(dtype, "cuda", salt)
    o_cpu = _make(cls, cpu, state=state, seed=7, **extra)
    o_gpu = _make(cls, gpu, state=state, seed=7, **extra)
    for step in range(5):
        _set_grads(cpu, step, salt, "cpu")
        _set_grads(gpu, step, salt, "cuda")
        o_cpu.step()
        o_gpu.step()
    torch.cuda.synchronize()
    for i, (pc, pg) in enumerate(zip(cpu, gpu)):
        assert torch.equal(pc.detach(), pg.detach().cpu()), f"param {i} {tuple(pc.shape)}: CUDA != CPU"
        for m in range(2 if algo == "adamw" else 1):
            assert torch.equal(o_cpu.read_moment(pc, m), o_gpu.read_moment(pg, m)), f"param {i} moment {m}"


def test_steps_follow_the_current_stream():
    salt = "stream"
    ref, side = _params(torch.bfloat16, "cuda", salt), _params(torch.bfloat16, "cuda", salt)
    o_ref = _make(lt.AdamW, ref, state="8bit")
    o_side = _make(lt.AdamW, side, state="8bit")
    s = torch.cuda.Stream()
    for step in range(4):
        _set_grads(ref, step, salt, "cuda")
        o_ref.step()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            _set_grads(side, step, salt, "cuda")
            # a slow kernel ahead of the step on this stream: a step enqueued on
            # another stream would read the grads before they are written
            torch.cuda._sleep(2_000_000)
            for p in side:
                p.grad.mul_(1.0)
            o_side.step()
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for pr, ps in zip(ref, side):
        assert torch.equal(pr.detach(), ps.detach())


def test_captured_step_replays_like_eager_steps():
    salt = "graph"
    eager, graphed = _params(torch.bfloat16, "cuda", salt), _params(torch.bfloat16, "cuda", salt)
    o_eager = _make(lt.AdamW, eager, state="8bit")
    o_graph = _make(lt.AdamW, graphed, state="8bit")
    _set_grads(eager, 0, salt, "cuda")
    _set_grads(graphed, 0, salt, "cuda")
    static_grads = [p.grad for p in graphed]
    # torch's rule: warm up on a side stream before capture (registers the params)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o_graph.step()
    torch.cuda.current_stream().wait_stream(s)
    o_eager.step()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_graph.step()
    for step in range(1, 5):
        _set_grads(eager, step, salt, "cuda")
        o_eager.step()
        for dst, grad in zip(static_grads, _grads(graphed, step, salt)):
            dst.copy_(grad)  # the graph reads the grads at the addresses it captured
        g.replay()
    torch.cuda.synchronize()
    for pe, pg in zip(eager, graphed):
        assert torch.equal(pe.detach(), pg.detach())
    assert o_graph.param_info(graphed[0]).step == o_eager.param_info(eager[0]).step == 5

"""lowbit.torch under torch.compile: inside a compiled region opt.step() is
the custom op lowbit::step (bindings/lowbit/torch/_compile.py).

What must hold (PyTorch's recipe for compiled optimizers: torch.compile over
a function that calls opt.step(), the lr a tensor in the param groups):
* 0 graph breaks and one graph for `opt.step()` (also with an lr scheduler
  attached, whose step wrapper torch.compile never traces), fullgraph=True
  compiles;
* no recompilation over 50 steps of a cosine schedule writing the lr tensors;
* the compiled steps give the eager steps' bits (first compiled call = first
  step included: registration happens inside the op), with the eager
  backend (the op gets the params themselves) and aot_eager (it gets copies,
  functionalized without re-inplacing) and inductor (re-inplaced);
* a whole training step compiled with compiled autograd adds no graph break
  of lowbit's own (torch.optim.AdamW's in the same setup as the reference);
  with the backward traced into the graph the whole step is one graph;
* the op is tagged cudagraph_unsafe (mode="reduce-overhead" runs it outside
  the captured CUDA graphs); the CUDA check itself needs a GPU.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import lowbit.torch as lt  # noqa: E402
import seeding  # noqa: E402
from lowbit.torch import _compile  # noqa: E402

pytestmark = pytest.mark.skipif(_compile.step_op is None, reason="torch.library.custom_op needs torch >= 2.4")

CUDA = torch.cuda.is_available()
SHAPES = [(64, 48), (5000,), (7,), (3, 5, 7)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _params(dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seeding.derive("torch_compile.params"))
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device=device, dtype=dtype)) for s in SHAPES]


def _set_grads(step, *param_lists, none=()):
    """The same grads (fresh tensors) for each list; params at `none` get None."""
    g = torch.Generator().manual_seed(seeding.derive("torch_compile.grads", step))
    grads = [torch.randn(p.shape, generator=g) * 1e-1 for p in param_lists[0]]
    for params in param_lists:
        for i, (p, gr) in enumerate(zip(params, grads)):
            p.grad = None if i in none else gr.to(device=p.device, dtype=p.dtype, copy=True)


def _groups(params, lr):
    """Two groups, the second with its own lr (a tensor when lr is one)."""
    lr2 = lr * 3 if not isinstance(lr, torch.Tensor) else (lr * 3).clone()
    return [{"params": params[:2]}, {"params": params[2:], "lr": lr2}]


OPTIMIZERS = {
    "adamw-8bit": lambda ps, lr: lt.AdamW(_groups(ps, lr), lr=lr, weight_decay=0.1, state="8bit"),
    "adam-4bit-sr": lambda ps, lr: lt.Adam(_groups(ps, lr), lr=lr, state="4bit-sr"),
    "lion-4bit": lambda ps, lr: lt.Lion(_groups(ps, lr), lr=lr, state="4bit"),
    "sgd-momentum": lambda ps, lr: lt.SGD(_groups(ps, lr), lr=lr, momentum=0.9, nesterov=True),
}


class _Counting:
    """A backend that counts the graphs it compiles."""

    def __init__(self, inner="eager"):
        self.inner, self.graphs = inner, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.inner == "eager":
            return gm.forward
        return torch._dynamo.backends.registry.lookup_backend(self.inner)(gm, example_inputs)


def _breaks():
    return sum(torch._dynamo.utils.counters["graph_break"].values())


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_has_no_graph_break(name):
    params = _params()
    opt = OPTIMIZERS[name](params, torch.tensor(0.01))
    _set_grads(0, params)

    def fn():
        opt.step()

    explained = torch._dynamo.explain(fn)()
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1
    torch._dynamo.reset()
    torch.compile(fn, backend="eager", fullgraph=True)()  # fullgraph raises at any graph break


def test_scheduler_attached_adds_no_graph_break():
    """torch's lr schedulers wrap opt.step in a function torch.compile skips
    (torch.optim.AdamW breaks there); lowbit's step is marked as wrapped and
    notes the call itself, so the scheduler checks still see it."""
    params = _params()
    opt = lt.AdamW(params, lr=torch.tensor(0.01))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    backend = _Counting()
    fn = torch.compile(lambda: opt.step(), backend=backend)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" would be an error here
        for step in range(3):
            _set_grads(step, params)
            fn()
            sched.step()
    assert _breaks() == 0, dict(torch._dynamo.utils.counters["graph_break"])
    assert backend.graphs == 1
    assert opt._opt_called


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_no_recompile_over_50_cosine_steps(inner):
    params = _params()
    opt = lt.AdamW(_groups(params, torch.tensor(0.01)), lr=torch.tensor(0.01), state="8bit")
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
    backend = _Counting(inner)
    fn = torch.compile(lambda: opt.step(), backend=backend)
    lrs = []
    for step in range(50):
        _set_grads(step, params)
        fn()
        sched.step()
        lrs.append(float(opt.param_groups[0]["lr"]))
    assert len(set(lrs)) > 40  # the lr did change
    assert backend.graphs == 1
    assert not torch._dynamo.utils.counters["recompiles"]
    assert _breaks() == 0


def _compare(name, inner, steps=12, dtype=torch.float32, lr=None, none_at=None, **kw):
    """Eager steps against compiled ones on equal params and grads, an lr
    scheduler on each; returns the two param lists."""
    lr = torch.tensor(0.01) if lr is None else lr
    eager_p, comp_p = _params(dtype), _params(dtype)
    eager = OPTIMIZERS[name](eager_p, lr if not isinstance(lr, torch.Tensor) else lr.clone())
    comp = OPTIMIZERS[name](comp_p, lr if not isinstance(lr, torch.Tensor) else lr.clone())
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps) for o in (eager, comp)]
    fn = torch.compile(lambda: comp.step(), backend=_Counting(inner))
    for step in range(steps):
        _set_grads(step, eager_p, comp_p, none=(1,) if step == none_at else ())
        eager.step()
        fn()
        for s in scheds:
            s.step()
    return eager, comp, eager_p, comp_p


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_gives_eager_bits(name, inner):
    eager, comp, eager_p, comp_p = _compare(name, inner)
    for a, b in zip(eager_p, comp_p):
        assert torch.equal(a, b)
    assert eager.state_dict()["state"].keys() == comp.state_dict()["state"].keys()
    for a, b in zip(eager_p, comp_p):
        for m in range(len(eager._moment_names)):
            assert torch.equal(eager.read_moment(a, m), comp.read_moment(b, m))


def test_compiled_step_bf16_stochastic_rounding_and_a_missing_grad():
    eager, comp, eager_p, comp_p = _compare("adamw-8bit", "aot_eager", dtype=torch.bfloat16, none_at=4)
    for a, b in zip(eager_p, comp_p):
        assert torch.equal(a, b)
    assert eager.param_info(eager_p[1]).step == comp.param_info(comp_p[1]).step == 11


def test_float_lr_works():
    """A float lr works (torch.compile specialises on it: a changed float
    recompiles, as with torch's optimizers; a tensor lr does not)."""
    _, _, eager_p, comp_p = _compare("lion-4bit", "eager", lr=1e-3, steps=4)
    for a, b in zip(eager_p, comp_p):
        assert torch.equal(a, b)


def test_closure_and_param_group_added_later():
    eager_p, comp_p = _params(), _params()
    eager = lt.AdamW(eager_p[:2], lr=torch.tensor(0.01))
    comp = lt.AdamW(comp_p[:2], lr=torch.tensor(0.01))
    fn = torch.compile(lambda: comp.step(), backend="eager")
    closure_fn = torch.compile(lambda: comp.step(lambda: torch.zeros(())), backend="eager")
    for step in range(6):
        if step == 3:
            eager.add_param_group({"params": eager_p[2:], "lr": torch.tensor(0.02)})
            comp.add_param_group({"params": comp_p[2:], "lr": torch.tensor(0.02)})
        _set_grads(step, eager_p, comp_p)
        eager.step()
        (closure_fn if step % 2 else fn)()  # with a closure: the eager path
    for a, b in zip(eager_p, comp_p):
        assert torch.equal(a, b)


def test_whole_training_step_with_compiled_autograd():
    """loss.backward(); opt.step() compiled with compiled autograd: the graph
    breaks are torch's (Tensor.backward, torch.optim.Optimizer.zero_grad), no
    more than torch.optim.AdamW gets in the same setup, none in lowbit's
    code; the params equal eager training's."""
    def run(make):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        g = torch.Generator().manual_seed(seeding.derive("torch_compile.model"))
        x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
        models = []
        for _ in range(2):
            torch.manual_seed(seeding.derive("torch_compile.init"))
            models.append(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
        opts = [make(m.parameters()) for m in models]

        def train_step(model, opt):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        with torch._dynamo.config.patch(compiled_autograd=True):
            compiled = torch.compile(train_step, backend="aot_eager")
            for _ in range(4):
                compiled(models[0], opts[0])
                train_step(models[1], opts[1])
        reasons = dict(torch._dynamo.utils.counters["graph_break"])
        same = all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))
        return reasons, same

    ours, same = run(lambda ps: lt.AdamW(ps, lr=torch.tensor(0.01), state="8bit"))
    theirs, _ = run(lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01)))
    assert same
    assert sum(ours.values()) <= sum(theirs.values())
    assert set(ours) <= set(theirs)
    for reason in ours:
        assert "lowbit" not in reason and "Lowbit" not in reason, reason


@pytest.mark.skipif(not hasattr(torch._dynamo.config, "trace_autograd_ops"), reason="no trace_autograd_ops here")
def test_traced_backward_and_step_one_graph():
    """With the backward traced into the graph the grads the op gets are
    values of the graph (p.grad is written after it): still the eager bits,
    one graph, no break."""
    g = torch.Generator().manual_seed(seeding.derive("torch_compile.model"))
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
    models = []
    for _ in range(2):
        torch.manual_seed(seeding.derive("torch_compile.init"))
        models.append(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opts = [lt.AdamW(m.parameters(), lr=torch.tensor(0.01), state="4bit") for m in models]

    def train_step(model, opt):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    backend = _Counting("aot_eager")
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(train_step, backend=backend)
        for _ in range(4):
            compiled(models[0], opts[0])
            train_step(models[1], opts[1])
            for o in opts:
                o.zero_grad()
    assert _breaks() == 0, dict(torch._dynamo.utils.counters["graph_break"])
    assert backend.graphs == 1
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_inductor_gives_eager_bits():
    """The default backend (inductor re-inplaces the op onto the params)."""
    eager, comp, eager_p, comp_p = _compare("adamw-8bit", "inductor", steps=6)
    for a, b in zip(eager_p, comp_p):
        assert torch.equal(a, b)


def test_op_is_cudagraph_unsafe_and_subclasses_with_their_own_step_stay_eager():
    if hasattr(torch.Tag, "cudagraph_unsafe"):
        assert torch.Tag.cudagraph_unsafe in torch.ops.lowbit.step.default.tags
        # what inductor asks of a node of its post-grad graph (where the
        # functionalized op is the op again) to partition or skip CUDA graphs
        from torch._inductor import utils as inductor_utils
        if hasattr(inductor_utils, "is_cudagraph_unsafe_fx_node"):
            graph = torch.fx.Graph()
            node = graph.call_function(torch.ops.lowbit.step.default, (1, [], [], []))
            assert inductor_utils.is_cudagraph_unsafe_fx_node(node)
    assert lt.AdamW._compilable_step and lt.SGD._compilable_step
    assert not lt.OneBitAdam._compilable_step  # its own step(): errors agreed over the ranks


def test_optimizer_gone():
    params = _params()
    opt = lt.SGD(params, lr=torch.tensor(0.1))
    key = opt._compile_key
    del opt
    import gc
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer exists"):
        torch.ops.lowbit.step(key, params, [None] * len(params), [torch.tensor(0.1)])


def test_op_checks_every_argument_before_writing_anything():
    """Issue 45 (5): the op copied its params into the optimizer's one by
    one, so a mis-shaped third param raised after params 0 and 1 were
    overwritten, and same-shaped foreign tensors were copied in silently.
    Every refused call leaves the params and the state bytes as they were; a
    copy of the params (what aot_eager hands the op) still steps."""
    params = _params()
    opt = OPTIMIZERS["adamw-8bit"](params, 0.01)
    _set_grads(0, params)
    opt.step()
    _set_grads(1, params)
    grads = [p.grad for p in params]
    lrs = [torch.tensor(0.01), torch.tensor(0.03)]

    def snapshot():
        return [p.detach().clone() for p in params], [h.save() for h in opt.lowbit_handles().values()]

    before = snapshot()
    foreign = [torch.zeros_like(p) for p in params]
    nan_param = params[1].detach().clone()
    nan_param[0] = float("nan")
    bad = [
        (params[:2] + [torch.zeros(8)] + params[3:], grads, lrs, r"params\[2\] is a torch.float32 tensor of shape \(8,\)"),
        (params[:3] + [params[3].double()], grads, lrs, r"params\[3\] is a torch.float64 tensor"),
        (foreign, grads, lrs, r"params\[0\] is neither the optimizer's param 0 nor a copy of it \(its values differ"),
        ([params[0], nan_param] + params[2:], grads, lrs, r"params\[1\] is neither"),
        (params, grads[:3] + [torch.zeros(3)], lrs, r"grads\[3\] is a torch.strided torch.float32 tensor of shape \(3,\)"),
        (params, grads[:3] + [grads[3].double()], lrs, r"grads\[3\] is a torch.strided torch.float64"),
        (params, grads[:3], lrs, "3 grads for 4 params"),
        (params, grads, [lrs[0], torch.tensor(float("nan"))], r"lrs\[1\] = nan .* must be finite and >= 0"),
        (params, grads, [torch.tensor(-0.1), lrs[1]], r"lrs\[0\] = -0.1"),
        (params, grads, [torch.tensor(1e39, dtype=torch.float64), lrs[1]], r"lrs\[0\] = 1e\+39"),
        (params, grads, [torch.tensor([0.1, 0.2]), lrs[1]], r"lrs\[0\] is a torch.float32 tensor of 2 elements"),
    ]
    for ps, gs, ls, message in bad:
        with pytest.raises(RuntimeError, match=message):
            torch.ops.lowbit.step(opt._compile_key, ps, gs, ls)
        now = snapshot()
        assert all(torch.equal(a, b) for a, b in zip(now[0], before[0])), message
        assert now[1] == before[1], message
    assert all(torch.equal(f, torch.zeros_like(f)) for f in foreign)
    # the params themselves, or copies of them, step (a copy gets the result)
    copies = [p.detach().clone() for p in params]
    torch.ops.lowbit.step(opt._compile_key, copies, grads, lrs)
    assert all(torch.equal(c, p) for c, p in zip(copies, params))
    assert not torch.equal(params[0], before[0][0]) and opt.param_info(params[0]).step == 2


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_reduce_overhead_gives_eager_bits():
    """mode="reduce-overhead": the op (host-side hyper-parameters and step
    counts) runs outside the captured CUDA graphs; the params equal the eager
    steps' over steps whose lr changes each time."""
    steps = 8
    eager_p, comp_p = _params(device="cuda"), _params(device="cuda")
    eager = lt.AdamW(eager_p, lr=torch.tensor(0.01), state="8bit")
    comp = lt.AdamW(comp_p, lr=torch.tensor(0.01), state="8bit")
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps) for o in (eager, comp)]

    @torch.compile(mode="reduce-overhead")
    def fn(scale):
        for p in comp_p:
            p.grad.mul_(scale)  # graph work around the op, for the CUDA graph to capture
        comp.step()

    for step in range(steps):
        _set_grads(step, eager_p, comp_p)
        for p in eager_p:
            p.grad.mul_(0.5)
        eager.step()
        fn(torch.tensor(0.5, device="cuda"))
        for s in scheds:
            s.step()
    torch.cuda.synchronize()
    for a, b in zip(eager_p, comp_p):
        assert torch.equal(a, b)
    assert math.isclose(float(comp.param_groups[0]["lr"]), float(eager.param_groups[0]["lr"]))


@pytest.mark.parametrize("name", ["adamw-8bit", "lion-4bit"])
def test_captured_op_takes_lr_from_tensors_on_the_engine(name, monkeypatch):
    """The op's path inside a CUDA graph capture (_step_captured), run on the
    CPU with the capture simulated: the lr tensors go into the engine's copy of
    the hyper-parameters (lr_address; host memory here, device memory on
    CUDA) and nothing is pushed from the host, so steps whose lr tensors change
    give the bits of eager steps with those lrs."""
    from lowbit.torch import _base

    steps = 4
    eager_p, op_p = _params(), _params()
    eager = OPTIMIZERS[name](eager_p, 0.01)
    opt = OPTIMIZERS[name](op_p, 0.01)
    _set_grads(0, eager_p, op_p)
    eager.step()
    opt.step()  # registration happens before any capture
    lrs = [torch.tensor(0.01), torch.tensor(0.03)]
    monkeypatch.setattr(_base, "_capturing", lambda params: True)
    for step in range(1, steps):
        lr = 0.01 * (1 + step)
        for gi, group in enumerate(eager.param_groups):
            group["lr"] = lr * (3 if gi else 1)
            lrs[gi].fill_(lr * (3 if gi else 1))  # what a scheduler writes between replays
        _set_grads(step, eager_p, op_p)
        eager.step()
        torch.ops.lowbit.step(opt._compile_key, op_p, [p.grad for p in op_p], lrs)
        for a, b in zip(eager_p, op_p):
            assert torch.equal(a, b), step
        # the host side kept its lr: the engine's copy holds the tensor's
        assert float(opt.param_groups[0]["lr"]) == 0.01
    monkeypatch.undo()
    # an eager step after the "replays" pushes the groups' hyper-parameters again
    for group, g2 in zip(opt.param_groups, eager.param_groups):
        group["lr"] = g2["lr"]
    _set_grads(steps, eager_p, op_p)
    eager.step()
    opt.step()
    for a, b in zip(eager_p, op_p):
        assert torch.equal(a, b)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_op_captured_in_a_cuda_graph_replays_with_new_lrs():
    """The op captured in a CUDA graph (torch.cuda.graph around it): each
    replay takes the lr tensors' values of that moment and the params equal
    eager steps with those lrs (the GPU round's check of issue 34's capture)."""
    steps = 6
    eager_p, cap_p = _params(device="cuda"), _params(device="cuda")
    eager = lt.AdamW(eager_p, lr=0.01, weight_decay=0.1, state="8bit")
    cap = lt.AdamW(cap_p, lr=0.01, weight_decay=0.1, state="8bit")
    _set_grads(0, eager_p, cap_p)
    eager.step()
    cap.step()
    lr = torch.tensor(0.01, device="cuda")
    grads = [torch.zeros_like(p) for p in cap_p]  # static inputs of the graph
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph):
            torch.ops.lowbit.step(cap._compile_key, cap_p, grads, [lr])
    torch.cuda.current_stream().wait_stream(side)
    # capturing ran nothing: the params are still those of step 0
    for step in range(1, steps):
        value = 0.01 * (1 + step)
        eager.param_groups[0]["lr"] = value
        lr.fill_(value)
        _set_grads(step, eager_p, cap_p)
        for g, p in zip(grads, cap_p):
            g.copy_(p.grad)
        eager.step()
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager_p, cap_p):
        assert torch.equal(a, b)

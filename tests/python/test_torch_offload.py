"""lowbit.torch.CPUOffload with CPU params (the pipeline runs: host copies,
gradient hooks, host steps on the worker thread, copies back): the params
get the bits of the plain optimizer's opt.step(), with two param groups and
an lr scheduler, with gradient clipping by global norm (against
torch.nn.utils.clip_grad_norm_), across a checkpoint round trip in both
directions, with gradient accumulation and params written outside the
optimizer; a NaN skips what the plain optimizer skips (with clipping) or its
bucket (without); moved params are refused before anything changes;
memory_report adds up."""

import copy

import pytest

torch = pytest.importorskip("torch")
import lowbit.torch as lt  # noqa: E402


def _model(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                            torch.nn.Linear(64, 5))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m.to(dtype)


def _batches(seed, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(32, 24, generator=g).to(dtype), torch.randint(0, 5, (32,), generator=g)) for _ in range(n)]


def _groups(m):
    ps = list(m.parameters())
    return [{"params": ps[:4]}, {"params": ps[4:], "lr": 3e-3, "weight_decay": 0.0}]


def _sched(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


CASES = [
    (lt.AdamW, dict(state="8bit", min_quantized_numel=0), torch.float32),
    (lt.AdamW, dict(state="4bit-sr", min_quantized_numel=0), torch.float32),
    (lt.Lion, dict(state="4bit", min_quantized_numel=0), torch.float32),
    (lt.SGD, dict(momentum=0.9, state="bf16", stochastic_rounding=True), torch.bfloat16),
]
IDS = [f"{c.__name__}-{k['state']}" for c, k, _ in CASES]


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x).float(), y)


def _plain_step(model, opt, sched, x, y, clip):
    _loss(model, x, y).backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad()
    if sched is not None:
        sched.step()


def _offload_step(model, off, sched, x, y):
    _loss(model, x, y).backward()
    off.step()
    off.zero_grad()
    if sched is not None:
        sched.step()


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip0.5"])
@pytest.mark.parametrize("cls,kwargs,dtype", CASES, ids=IDS)
def test_offload_equals_plain_optimizer(cls, kwargs, dtype, clip, seed):
    ref_model, model = _model(seed, dtype), _model(seed, dtype)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=clip, bucket_numel=2000, **kwargs)
    ref_sched, sched = _sched(ref), _sched(off)
    clipped = False
    for x, y in _batches(seed, 5, dtype):
        _plain_step(ref_model, ref, ref_sched, x, y, clip)
        _offload_step(model, off, sched, x, y)
        if clip is not None:
            clipped = clipped or float(off.last_grad_norm) > clip
    assert _same(ref_model, model)
    assert clip is None or clipped, "the clipping never clipped: the test shows nothing"
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert ref.param_info(a).step == off.param_info(b).step == 5
        assert torch.equal(off.host_param(b), b)
    assert off.param_groups[1]["lr"] == ref.param_groups[1]["lr"] != 3e-3  # the scheduler reached both
    off.close()


@pytest.mark.parametrize("bucket_numel", [0, 1 << 30])
def test_bucket_sizes(bucket_numel, seed):
    cls, kwargs, dtype = CASES[1]
    ref_model, model = _model(seed), _model(seed)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, bucket_numel=bucket_numel, num_threads=1, **kwargs)
    for x, y in _batches(seed, 3):
        _plain_step(ref_model, ref, None, x, y, None)
        _offload_step(model, off, None, x, y)
    assert _same(ref_model, model)


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip0.5"])
@pytest.mark.parametrize("cls,kwargs,dtype", [CASES[1], CASES[3]], ids=[IDS[1], IDS[3]])
def test_checkpoint_round_trip(cls, kwargs, dtype, clip, seed):
    batches = _batches(seed, 5, dtype)
    ref_model = _model(seed, dtype)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    ref_sched = _sched(ref)
    for x, y in batches:  # 5 steps without interruption
        _plain_step(ref_model, ref, ref_sched, x, y, clip)

    # 3 steps offloaded, then a checkpoint
    model = _model(seed, dtype)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=clip, **kwargs)
    sched = _sched(off)
    for x, y in batches[:3]:
        _offload_step(model, off, sched, x, y)
    saved = copy.deepcopy(off.state_dict())
    saved_sched = sched.state_dict()
    weights = copy.deepcopy(model.state_dict())
    assert "lowbit" in saved and saved["lowbit"]["handles"][0]["device"] == "cpu"

    # ... loaded into the plain optimizer, 2 more steps
    m1 = _model(seed + 7, dtype)
    m1.load_state_dict(weights)
    plain = cls(_groups(m1), lr=1e-2, **kwargs)
    s1 = _sched(plain)  # built before the loads, as usual: a scheduler's constructor sets the lr
    plain.load_state_dict(saved)
    s1.load_state_dict(saved_sched)
    for x, y in batches[3:]:
        _plain_step(m1, plain, s1, x, y, clip)
    assert _same(ref_model, m1)

    # ... and into a fresh offloaded one
    m2 = _model(seed + 7, dtype)
    m2.load_state_dict(weights)
    off2 = lt.CPUOffload(cls, _groups(m2), lr=1e-2, clip_grad_norm=clip, **kwargs)
    s2 = _sched(off2)
    off2.load_state_dict(saved)
    s2.load_state_dict(saved_sched)
    for x, y in batches[3:]:
        _offload_step(m2, off2, s2, x, y)
    assert _same(ref_model, m2)

    # a plain optimizer's checkpoint into an offloaded one
    m3 = _model(seed, dtype)
    plain3 = cls(_groups(m3), lr=1e-2, **kwargs)
    s3 = _sched(plain3)
    for x, y in batches[:3]:
        _plain_step(m3, plain3, s3, x, y, clip)
    m4 = _model(seed + 9, dtype)
    m4.load_state_dict(m3.state_dict())
    off4 = lt.CPUOffload(cls, _groups(m4), lr=1e-2, clip_grad_norm=clip, **kwargs)
    s4 = _sched(off4)
    off4.load_state_dict(plain3.state_dict())
    s4.load_state_dict(s3.state_dict())
    for x, y in batches[3:]:
        _offload_step(m4, off4, s4, x, y)
    assert _same(ref_model, m4)
    assert off4.param_groups[1]["lr"] == ref.param_groups[1]["lr"]


def test_state_dict_bytes_equal_plain(seed):
    cls, kwargs, _ = CASES[0]
    ref_model, model = _model(seed), _model(seed)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, **kwargs)
    for x, y in _batches(seed, 2):
        _plain_step(ref_model, ref, None, x, y, None)
        _offload_step(model, off, None, x, y)
    a, b = ref.state_dict(), off.state_dict()
    assert a["state"] == b["state"] and a["param_groups"] == b["param_groups"]
    assert torch.equal(a["lowbit"]["handles"][0]["checkpoint"], b["lowbit"]["handles"][0]["checkpoint"])
    for p, q in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(ref.state[p]["exp_avg"], off.state[q]["exp_avg"])


def test_gradient_accumulation_and_params_written_outside(seed):
    cls, kwargs, _ = CASES[0]
    ref_model, model = _model(seed), _model(seed)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=1.0, **kwargs)
    batches = _batches(seed, 6)
    for k in range(0, 6, 2):
        for x, y in batches[k:k + 2]:
            _loss(ref_model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 1.0)
        ref.step()
        ref.zero_grad()
        with off.accumulating():
            _loss(model, *batches[k]).backward()
        _loss(model, *batches[k + 1]).backward()
        off.step()
        off.zero_grad()
    assert _same(ref_model, model)
    # weights loaded into the model after the optimizer was built: copied to
    # the host again at the next backward
    other = _model(seed + 3).state_dict()
    ref_model.load_state_dict(other)
    model.load_state_dict(other)
    x, y = batches[0]
    _plain_step(ref_model, ref, None, x, y, 1.0)
    _offload_step(model, off, None, x, y)
    assert _same(ref_model, model)
    # two backward passes without a step between them (outside accumulating())
    _loss(model, x, y).backward()
    with pytest.raises(RuntimeError, match="second gradient before step"):
        _loss(model, x, y).backward()


def test_nonfinite_gradient(seed):
    cls, kwargs, _ = CASES[0]
    x, y = _batches(seed, 1)[0]
    # with clipping: the whole step is skipped, as the plain optimizer skips it
    ref_model, model = _model(seed), _model(seed)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=0.5, **kwargs)
    for m in (ref_model, model):
        list(m.parameters())[-2].register_hook(lambda g: g * float("nan"))
    _plain_step(ref_model, ref, None, x, y, 0.5)
    _offload_step(model, off, None, x, y)
    assert ref.last_step_skipped and off.last_step_skipped
    assert _same(ref_model, model) and _same(ref_model, _model(seed))
    assert off.param_info(next(model.parameters())).step == 0
    # without: the NaN's bucket only
    model = _model(seed)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, bucket_numel=0, **kwargs)
    before = [p.detach().clone() for p in model.parameters()]
    list(model.parameters())[-2].register_hook(lambda g: g * float("nan"))
    _offload_step(model, off, None, x, y)
    after = list(model.parameters())
    assert off.last_step_skipped
    assert torch.equal(after[-2], before[-2]) and not torch.equal(after[0], before[0])


def _snapshot(model, off):
    sd = off.state_dict()
    return ([p.detach().clone() for p in model.parameters()], [off.host_param(p).clone() for p in model.parameters()],
            sd["state"], sd["lowbit"]["handles"][0]["checkpoint"].clone())


def _unchanged(model, off, snap):
    params, hosts, state, blob = snap
    sd = off.state_dict()
    return (all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
            and all(torch.equal(off.host_param(p), h) for p, h in zip(model.parameters(), hosts))
            and sd["state"] == state and torch.equal(sd["lowbit"]["handles"][0]["checkpoint"], blob))


MOVED = r"param 2 of group 0 \(shape \(64, 64\)\) moved to another device after CPUOffload was built.*build it again"


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip0.5"])
def test_moved_param_is_refused_and_nothing_changes(clip, seed):
    cls, kwargs, _ = CASES[0]
    batches = _batches(seed, 3)
    model = _model(seed)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=clip, **kwargs)
    _offload_step(model, off, None, *batches[0])
    moved = list(model.parameters())[2]
    moved.data = moved.data.clone()  # what model.to(another device) does to each param
    snap = _snapshot(model, off)
    with pytest.raises(RuntimeError, match=MOVED):  # at the first gradient of the backward
        _loss(model, *batches[1]).backward()
    assert _unchanged(model, off, snap)

    # moved between backward and step(): with clipping step() refuses before any step
    model = _model(seed)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=clip, **kwargs)
    _offload_step(model, off, None, *batches[0])
    _loss(model, *batches[1]).backward()
    moved = list(model.parameters())[2]
    if clip is not None:
        moved.data = moved.data.clone()
        snap = _snapshot_without_state_dict(model, off)
        with pytest.raises(RuntimeError, match=MOVED):
            off.step()
        assert _unchanged_without_state_dict(model, off, snap)
    else:
        # the steps ran inside backward; step() still says so
        moved.data = moved.data.clone()
        with pytest.raises(RuntimeError, match=MOVED):
            off.step()


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip0.5"])
def test_step_after_close_raises_and_nothing_changes(clip, seed):
    """Issue 45 (12): after close() (hooks removed, worker stopped) a
    backward only accumulates the gradients; step() did nothing, silently."""
    cls, kwargs, _ = CASES[0]
    batches = _batches(seed, 2)
    model = _model(seed)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, clip_grad_norm=clip, **kwargs)
    _offload_step(model, off, None, *batches[0])
    off.close()
    snap = _snapshot(model, off)
    _loss(model, *batches[1]).backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(RuntimeError, match=r"CPUOffload: step\(\) after close\(\).*nothing would be stepped"):
        off.step()
    assert _unchanged(model, off, snap)
    off.close()  # again: nothing to do
    with pytest.raises(RuntimeError, match=r"add_param_group\(\) after close\(\)"):
        off.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    assert len(off.param_groups) == 2 and _unchanged(model, off, snap)


def _snapshot_without_state_dict(model, off):
    return ([p.detach().clone() for p in model.parameters()], [off.host_param(p).clone() for p in model.parameters()],
            [off.param_info(p).step for p in model.parameters()],
            [off.read_moment(p, k) for p in model.parameters() for k in (0, 1)])


def _unchanged_without_state_dict(model, off, snap):
    params, hosts, steps, moments = snap
    return (all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
            and all(torch.equal(off.host_param(p), h) for p, h in zip(model.parameters(), hosts))
            and [off.param_info(p).step for p in model.parameters()] == steps
            and all(torch.equal(a, b) for a, b in zip([off.read_moment(p, k) for p in model.parameters()
                                                        for k in (0, 1)], moments)))


def test_memory_report(seed):
    model = _model(seed)
    off = lt.CPUOffload(lt.AdamW, _groups(model), lr=1e-2, state="8bit", min_quantized_numel=0)
    _offload_step(model, off, None, *_batches(seed, 1)[0])
    report = lt.memory_report(off)
    assert set(report) == {"cpu"}
    r = report["cpu"]
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert r["host_param_bytes"] == r["host_grad_bytes"] == nbytes
    assert 0 < r["state_bytes"] == off.state_bytes() == off.inner.state_bytes()
    # 8-bit moments: about 2 bytes per element, plus the blocks' scales
    numel = sum(p.numel() for p in model.parameters())
    assert 2 * numel <= r["state_bytes"] < 3 * numel
    assert r["pinned_bytes"] == 0  # CPU params: nothing is pinned
    plain = lt.AdamW(_model(seed).parameters(), state="8bit", min_quantized_numel=0)
    assert lt.memory_report(plain) == {}
    # frozen params get no host copy
    frozen = _model(seed)
    frozen[0].weight.requires_grad_(False)
    off3 = lt.CPUOffload(lt.AdamW, frozen.parameters(), state="8bit")
    assert off3.memory_report()["cpu"]["host_param_bytes"] == nbytes - frozen[0].weight.numel() * 4


def test_refusals_and_threads(seed, monkeypatch):
    model = _model(seed)
    with pytest.raises(TypeError, match="lowbit.torch optimizer class"):
        lt.CPUOffload(torch.optim.AdamW, model.parameters())
    with pytest.raises(TypeError, match="1-bit"):
        lt.CPUOffload(lt.OneBitAdam, model.parameters())
    with pytest.raises(ValueError, match="clip_grad_norm"):
        lt.CPUOffload(lt.AdamW, model.parameters(), clip_grad_norm=-1)
    off = lt.CPUOffload(lt.AdamW, model.parameters(), state="8bit")
    scaler = torch.amp.GradScaler("cpu")
    x, y = _batches(seed, 1)[0]
    scaler.scale(_loss(model, x, y)).backward()
    with pytest.raises(RuntimeError, match="does not support GradScaler"):
        scaler.step(off)
    monkeypatch.delenv("LOWBIT_NUM_THREADS", raising=False)
    import os
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    n = lt.default_host_threads()
    assert n == max(1, min((os.cpu_count() or 1) // 4, len(os.sched_getaffinity(0))))
    off2 = lt.CPUOffload(lt.AdamW, _model(seed).parameters())
    assert next(iter(off2.inner.lowbit_handles().values())).num_threads == n


def test_steps_overlap_backward_without_clipping_only(seed):
    cls, kwargs, _ = CASES[0]
    x, y = _batches(seed, 1)[0]
    model = _model(seed)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, bucket_numel=0, **kwargs)
    _loss(model, x, y).backward()
    assert len(off._futures) == 6  # one host step per param, submitted inside backward
    off.step()
    model = _model(seed)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, bucket_numel=0, clip_grad_norm=0.5, **kwargs)
    _loss(model, x, y).backward()
    assert not off._futures and len(off._norms) == 6  # waiting for the total norm
    off.step()
    assert off.param_info(next(model.parameters())).step == 1


def test_add_param_group(seed):
    cls, kwargs, _ = CASES[1]
    ref_model, model = _model(seed), _model(seed)
    ref_groups, groups = _groups(ref_model), _groups(model)
    ref = cls([ref_groups[0]], lr=1e-2, **kwargs)
    ref.add_param_group(ref_groups[1])
    off = lt.CPUOffload(cls, [groups[0]], lr=1e-2, **kwargs)
    off.add_param_group(groups[1])
    for x, y in _batches(seed, 3):
        _plain_step(ref_model, ref, None, x, y, None)
        _offload_step(model, off, None, x, y)
    assert _same(ref_model, model)
    assert off.param_groups[1]["lr"] == 3e-3


@pytest.mark.parametrize("case", ["noclip", "clip"])
def test_ddp_offload_equals_plain_optimizer(case, seed):
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from torchrun_launch import launch

    result = launch(Path(__file__).parent / "torch_offload_worker.py", 2, case, seed, timeout=300)
    assert result["equal"], result
    assert result["steps"] == 4
    assert result["threads"] == result["expected_threads"] == max(1, min((os.cpu_count() or 1) // 2,
                                                                         len(os.sched_getaffinity(0))))


def test_free_grads(seed):
    cls, kwargs, _ = CASES[0]
    ref_model, model = _model(seed), _model(seed)
    ref = cls(_groups(ref_model), lr=1e-2, **kwargs)
    off = lt.CPUOffload(cls, _groups(model), lr=1e-2, free_grads=True, clip_grad_norm=0.5, **kwargs)
    for x, y in _batches(seed, 3):
        _plain_step(ref_model, ref, None, x, y, 0.5)
        _loss(model, x, y).backward()
        assert all(p.grad is None for p in model.parameters())
        off.step()
    assert _same(ref_model, model)

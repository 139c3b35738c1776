"""lowbit.torch with DTensor parameters: FSDP2 (fully_shard) on the CPU with
gloo, 2 and 3 processes (tests/python/torch_dist_worker.py, each run bounded
in time).

- FSDP2 + lowbit AdamW 8-bit trains like the same model unsharded in one
  process: the library steps each rank's local shards, quantized per block of
  the flattened local shard. Where the shards split the tensor on whole
  256-element blocks (fc1, fc2 over 2 ranks) the blocks are the unsharded
  run's, and the params agree to float32 rounding of the gradient reduction;
  fc3 (960 elements, 480 per rank) is blocked differently, and agrees within
  the 8-bit quantization's effect (REQUANT).
- A NaN/Inf in one rank's shard of the grads skips the step on every rank.
- state_dict() with DTensor params holds materialised fp32 moments as
  DTensors with the param's mesh and placements (Shard(0) from FSDP2,
  Shard(1) from distribute_tensor).
- torch.distributed.checkpoint: saved on 2 ranks, loaded on 3 (and on 2;
  the 3-rank launch is marked exhaustive: scripts/test.sh --all),
  the moments after the load are the saved ones re-quantized per block of
  the new local shards (fp32 state: exactly; 8-bit: within the map's largest
  distance to a code times the block absmax), and the next step agrees with
  continuing on 2 ranks (fp32 state: SAME_MATH, measured bit-identical;
  8-bit: REQUANT). Re-quantizing a dequantized 8-bit first moment is not
  exact even with the same blocks (2 ranks): the signed dynamic map holds
  +1 but not -1, so a block whose largest magnitude is negative comes back
  with a scale 0.7% smaller (measured ~0.6% of lr on the next step).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip(f"torch {torch.__version__} was built without torch.distributed / gloo", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2, torch >= 2.6)
    from torch.distributed.tensor import DTensor  # noqa: F401
except ImportError as e:
    pytest.skip(f"torch {torch.__version__} has no FSDP2 / DTensor: {e}", allow_module_level=True)

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
import seeding  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch_dist_worker as W  # noqa: E402

TIMEOUT = 120  # seconds for one multi-process run
# How far two runs may drift apart per step, as a fraction of lr (an Adam
# update moves an element by about lr):
# - SAME_MATH: the same state blocks, grads reduced in another order (float32
#   rounding); Adam normalises the grads, so where a grad is tiny its rounding
#   shows, and an 8-bit code may round the other way (a gap of the map near
#   1 is 1.4%); measured ~0.3% of lr per step.
# - REQUANT: moments quantized with other block boundaries (or re-quantized
#   after a reshard): one 8-bit quantization error in the moments; measured
#   ~3% of lr per step.
SAME_MATH = 0.01
REQUANT = 0.1
# the largest distance from a value in [-1, 1] ([0, 1]) to the nearest code of
# the 8-bit first (second) moment map, as in test_torch_ecosystem.py
HALF_GAP_8BIT = (0.0070313, 0.0035157)


def _launch(scenario, world, outdir):
    env = dict(os.environ)
    paths = [str(Path(lowbit.__file__).resolve().parents[1]), str(HERE.parents[1] / "tests" / "common")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env["PYTHONPATH"]] if env.get("PYTHONPATH") else paths)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["LOWBIT_TEST_SEED"] = str(seeding.seed())
    procs = [subprocess.Popen([sys.executable, str(HERE / "torch_dist_worker.py"), scenario, str(r), str(world),
                               str(outdir)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{scenario} on {world} ranks did not finish in {TIMEOUT} s")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"{scenario}: rank {r} of {world} failed:\n{out[-4000:]}"


def _load(path):
    return torch.load(path, weights_only=False)


def _reference(state, steps):
    """The same model and batches, unsharded, in this process."""
    model = W.make_model()
    opt = W.make_opt(model.parameters(), state)
    for step in range(steps):
        W.train_step(model, opt, step, 0, 1)
    return model, opt


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch on 2 ranks (train, skip, Shard(1), DCP save, load on 2)."""
    outdir = tmp_path_factory.mktemp("dtensor")
    _launch("two", 2, outdir)
    return outdir


@pytest.fixture(scope="module")
def runs_load3(runs):
    """Then one launch on 3 ranks: the DCP load of the 2-rank checkpoint."""
    _launch("load", 3, runs)
    return runs


def test_fsdp2_trains_like_the_unsharded_model(runs):
    got = _load(runs / "train_params.pt")
    ref, _ = _reference("8bit", W.STEPS)
    for name, p in ref.named_parameters():
        tol = (REQUANT if name == "fc3.weight" else SAME_MATH) * W.LR * W.STEPS
        diff = (got["params"][name] - p.detach()).abs().max().item()
        assert diff <= tol, (name, diff)
    start = W.make_model()
    moved = (got["params"]["fc1.weight"] - start.fc1.weight.detach()).abs().max().item()
    assert moved > 0.5 * W.LR * W.STEPS  # it did train, far beyond the tolerances
    # the local shards of the weights are 8-bit (>= 256 elements), the biases fp32
    assert got["formats"]["fc1.weight"] == "8bit" and got["formats"]["fc3.weight"] == "8bit"
    assert got["formats"]["fc1.bias"] == "fp32"
    assert (got["params"]["shift"] != 0).all()  # the root module's own param trained too


def test_nonfinite_grad_on_one_rank_skips_the_step_on_all(runs):
    skip = _load(runs / "skip.pt")
    assert skip["skipped"] == [1.0, 1.0]  # the inf was in rank 0's shard only
    assert skip["unchanged"]
    assert set(skip["steps"].values()) == {float(W.STEPS)}


def test_state_dict_moments_are_dtensors_placed_like_the_param(runs):
    s1 = _load(runs / "shard1.pt")
    assert s1["same_as_param"], s1["placements"]
    assert "Shard(dim=1)" in s1["placements"] and s1["shape"] == (6, 10) and s1["step"] == 2.0
    w = torch.nn.Parameter(s1["w0"].clone())
    o = lt.AdamW([w], lr=W.LR, num_threads=1)
    for g in s1["grads"]:
        w.grad = g.clone()
        o.step()
    # no reduction here: each rank steps its columns with the same grads
    torch.testing.assert_close(s1["w"], w.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(s1["exp_avg"], o.state[w]["exp_avg"], rtol=0, atol=1e-7)
    torch.testing.assert_close(s1["exp_avg_sq"], o.state[w]["exp_avg_sq"], rtol=0, atol=1e-9)


@pytest.mark.parametrize("load_world", [pytest.param(3, marks=pytest.mark.exhaustive), 2])
def test_dcp_save_on_2_ranks_load_on_n(request, load_world):
    runs = request.getfixturevalue("runs_load3" if load_world == 3 else "runs")
    for state in W.FORMATS:
        saved = _load(runs / f"save-{state}.pt")
        loaded = _load(runs / f"load{load_world}-{state}.pt")
        assert loaded["lr"] == W.LR
        assert loaded["empty"] == ([[], [], ["shift"]] if load_world == 3 else [[], []])
        for name, s in saved["moments"].items():
            got = loaded["moments"][name]
            assert got["step"].item() == s["step"].item() == W.STEPS
            quantized = loaded["formats"].get(name) == "8bit"
            assert quantized == (state == "8bit" and "weight" in name), (name, loaded["formats"].get(name))
            for k, key in enumerate(("exp_avg", "exp_avg_sq")):
                want = s[key]
                if quantized:
                    bound = HALF_GAP_8BIT[k] * want.abs().max().item() * 1.001
                    assert (got[key] - want).abs().max().item() <= bound, (name, key)
                else:
                    assert torch.equal(got[key], want), (name, key)
        for name, p in saved["params"].items():
            tol = (REQUANT if state == "8bit" else SAME_MATH) * W.LR  # one step since the save
            diff = (loaded["params"][name] - p).abs().max().item()
            assert diff <= tol, (state, name, diff)


@pytest.fixture
def one_rank(tmp_path):
    """A 1-rank gloo process group in this process, and its device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_state_dict_layouts_and_bad_input_on_one_rank(one_rank):
    from torch.distributed.tensor import Shard, distribute_tensor

    g = torch.Generator().manual_seed(seeding.derive("torch_dtensor.one_rank"))
    w0, grad = torch.randn(40, 30, generator=g), torch.randn(40, 30, generator=g)
    w = torch.nn.Parameter(distribute_tensor(w0.clone(), one_rank, [Shard(0)]))
    opt = lt.AdamW([w], lr=1e-2, state="fp32")  # fp32: moments move between layouts exactly
    w.grad = distribute_tensor(grad.clone(), one_rank, [Shard(0)])
    opt.step()
    sd = opt.state_dict()
    assert sd["lowbit"]["materialized"] and set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    m = sd["state"][0]["exp_avg"]
    assert isinstance(m, DTensor) and m.placements == w.placements and m.shape == w.shape
    assert m.dtype == torch.float32 and sd["state"][0]["step"].item() == 1.0

    # plain params: compressed state; it cannot go into DTensor params
    p = torch.nn.Parameter(w0.clone())
    plain = lt.AdamW([p], lr=1e-2, state="fp32")
    p.grad = grad.clone()
    plain.step()
    with pytest.raises(ValueError, match="compressed per-device lowbit checkpoints"):
        opt.load_state_dict(plain.state_dict())
    # a torch-layout state dict with full (plain) moments goes into DTensor params...
    full = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": plain.state[p]["exp_avg"],
                          "exp_avg_sq": plain.state[p]["exp_avg_sq"]}},
            "param_groups": sd["param_groups"]}
    opt.load_state_dict(full)
    assert torch.equal(opt.state[w]["exp_avg"].full_tensor(), plain.state[p]["exp_avg"])
    # ...and DTensor moments into plain params
    plain.load_state_dict(sd)
    assert torch.equal(plain.state[p]["exp_avg_sq"], sd["state"][0]["exp_avg_sq"].full_tensor())
    # a moment of the wrong size names what was wrong
    bad = {"state": {0: {**full["state"][0], "exp_avg": torch.zeros(40, 29)}}, "param_groups": sd["param_groups"]}
    with pytest.raises(ValueError, match="exp_avg of param 0 has 1160 elements"):
        opt.load_state_dict(bad)
    assert torch.equal(opt.state[w]["exp_avg"].full_tensor(), plain.state[p]["exp_avg"])  # unchanged

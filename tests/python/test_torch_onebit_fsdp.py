"""The 1-bit optimizers of lowbit.torch (OneBitAdam, ZeroOneAdam, OneBitLamb)
and DTensor params, under torchrun on the CPU with gloo
(torch_onebit_fsdp_worker.py does the work; docs/ONEBIT_SHARDED.md says why).

- Sharded DTensors (FSDP2's fully_shard, distribute_tensor with Shard(0) or
  Shard(1)) are refused with a ValueError naming the param, when the
  optimizer is made and by add_param_group, nothing changed: the 1-bit
  exchange averages every rank's local tensors, which on shards are
  different pieces of a param.
- The compressed reduce-scatter of the C API through lowbit.Communicator
  over the ProcessGroup transport (its rule, bytes and error feedback).
- Replicated DTensors step bit for bit as plain params (2 ranks, across the
  freeze), and so does an FSDP2 model on a mesh of one rank (world size 1)
  against the same model unsharded.

One launch of 2 ranks (sharded, replicated, reduce_scatter) and one of 1
rank (world1),
about 10 s each; the 3-rank launch is marked exhaustive."""
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

from torchrun_launch import launch  # noqa: E402

WORKER = Path(__file__).with_name("torch_onebit_fsdp_worker.py")
TIMEOUT = 180
OPTIMIZERS = ("OneBitAdam", "ZeroOneAdam", "OneBitLamb")
_runs = {}


def result(nproc, cases, seed):
    key = (nproc, cases, seed)
    if key not in _runs:
        try:
            _runs[key] = launch(WORKER, nproc, cases, seed, TIMEOUT)
        except BaseException as e:  # pytest.fail() included
            _runs[key] = e
            raise
    if isinstance(_runs[key], BaseException):
        pytest.fail(f"the launch of {cases} on {nproc} ranks failed (see the first of its tests)")
    return _runs[key]


@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_sharded_dtensor_params_are_refused(nproc, name, seed):
    out = result(nproc, "sharded,replicated,reduce_scatter", seed)["sharded"]
    for kind, param in (("fsdp", "param 0 of param group 0 (shape (32, 16))"),
                        ("fsdp_named", "param '0.weight' (shape (32, 16))"),
                        ("S(0)", "param 0 of param group 0 (shape"), ("S(1)", "param 0 of param group 0 (shape"),
                        ("add_param_group", "param 0 of param group 1 (shape")):
        err = out[f"{name}/{kind}"]
        assert err is not None and err.startswith(f"ValueError: {name}: {param}"), (kind, err)
        assert "is a sharded DTensor" in err and f"of {nproc} ranks" in err and "nothing was changed" in err, err
    # the refused add_param_group changed nothing: the groups, and the next
    # step's bits against a twin that never saw the sharded param
    assert out[f"{name}/groups_after"] == 1
    assert out[f"{name}/unchanged"] and out[f"{name}/steps"] == 2


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_replicated_dtensor_params_step_as_plain_params(name, seed):
    out = result(2, "sharded,replicated,reduce_scatter", seed)["replicated"]
    assert out[f"{name}/equal"] and out[f"{name}/same_on_all_ranks"], out
    assert out[f"{name}/steps"] == 7 and out[f"{name}/moved"] > 0, out  # across the freeze (step 3)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fsdp2_on_one_rank_steps_as_the_unsharded_model(name, seed):
    out = result(1, "world1", seed)["world1"]
    assert out[f"{name}/placements"][0] == "(Shard(dim=0),)"  # DTensors, whole on their one rank
    assert out[f"{name}/equal"] and out[f"{name}/steps"] == 7, out


@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.exhaustive)])
def test_compressed_reduce_scatter_over_a_process_group(nproc, seed):
    """lowbit.Communicator.compressed_reduce_scatter over torch.distributed
    (gloo): the rule (a float64 model, to fp32 rounding; the bits are
    tests/comm/test_comm_reduce_scatter.c's), the bytes (the all-to-all
    only, (W-1) (4 + C/8) per call, as the library counts them) and the
    error feedback: after T calls on a fixed input the running mean of the
    outputs is off the true mean by exactly mean_j(e_j) / T."""
    out = result(nproc, "sharded,replicated,reduce_scatter", seed)["reduce_scatter"]
    assert out["offset_ok"], out
    assert out["worst_vs_model"] < 1e-6, out
    assert out["alltoall_bytes"] == out["expected_bytes"] == out["lib_bytes"] and out["allgather_bytes"] == 0, out
    assert abs(out["running_error"] - out["feedback_bound"]) <= 1e-4 * out["feedback_bound"] + 1e-6, out
    assert out["running_error"] < out["first_error"] / 4, out

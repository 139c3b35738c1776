"""lowbit.torch.FSDPOneBitAdam (design (b) of docs/ONEBIT_SHARDED.md: FSDP2's
gradient reduce-scatter compressed after a warm-up, the shards stepped with
a frozen variance), under torchrun on the CPU with gloo, 2 ranks
(torch_fsdp_onebit_worker.py does the work).

- Warm-up: bit for bit FSDP2 + lowbit AdamW, and torch AdamW to 1e-7.
- After the freeze: every compressed reduce-scatter output (one group
  padded from 66 to 72 elements per rank) equals a float64 simulation of its
  rule with per-group worker error feedback, and a fresh Communicator's own
  result, bit for bit; the bytes are the library's count; each shard update
  is the frozen-variance Adam of a float64 reference, and v does not move.
- A short run: the loss falls and ends within 5% of FSDP2 + lowbit AdamW for
  every error_format; the error bytes per element (4, 2, about 1 + 1/64, plus
  the server error the communicator allocates, 1/W of that).
- Param groups and an lr scheduler (read at every step, in both stages).
- A NaN after the freeze: the step skipped on every rank, nothing changed.
- Refusals by name, nothing installed; DCP save / load at 2 ranks, the
  errors restarting at zero unless error_state() is loaded; resharded from
  2 to 3 ranks (marked exhaustive: two more launches, about 20 s).

One launch of 2 ranks, about 20 s on 2 cores."""
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip(f"torch {torch.__version__} was built without torch.distributed / gloo", allow_module_level=True)
try:
    from torch.distributed.fsdp import FSDPModule  # noqa: F401  (FSDP2)
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # noqa: F401
except ImportError as e:
    pytest.skip(f"torch {torch.__version__} has no FSDP2 set_custom_reduce_scatter: {e}", allow_module_level=True)

from torchrun_launch import launch  # noqa: E402

WORKER = Path(__file__).with_name("torch_fsdp_onebit_worker.py")
TIMEOUT = 240
CASES = "exact,train,refusals,nonfinite,groups,dcp"
_runs = {}


def result(nproc, seed):
    key = (nproc, seed)
    if key not in _runs:
        try:
            _runs[key] = launch(WORKER, nproc, CASES, seed, TIMEOUT)
        except BaseException as e:  # pytest.fail() included
            _runs[key] = e
            raise
    if isinstance(_runs[key], BaseException):
        pytest.fail(f"the launch on {nproc} ranks failed (see the first of its tests)")
    return _runs[key]


def test_warmup_is_fsdp2_adamw_bit_for_bit(seed):
    out = result(2, seed)["exact"]
    assert out["warmup_bitwise"] == [True, True, True], out
    assert max(out["warmup_vs_torch"]) < 1e-6, out
    assert out["compressed_flags"] == [False] * 3 + [True] * 4, out
    assert out["fp32_calls"] == [3, 3] and out["calls"] == [4, 4] and out["steps"] == 7, out


def test_compressed_reduce_scatter_matches_its_rule_with_feedback(seed):
    out = result(2, seed)["exact"]
    assert out["padded"] == [[272, 272], [66, 72]], out  # the second group's shards padded to a multiple of 8
    assert out["sim_worst"] == 0.0, out  # the float64 simulation, bit for bit
    assert out["replay_equal"], out  # a fresh Communicator given the same inputs
    assert out["lowbit_bytes"] == out["expected_bytes"] > 0, out


def test_frozen_variance_update(seed):
    out = result(2, seed)["exact"]
    assert len(out["update_vs_f64"]) == 4 and max(out["update_vs_f64"]) < 1e-5, out


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8"])
def test_short_run_ends_near_fsdp2_adamw(fmt, seed):
    out = result(2, seed)["train"]
    ref, r = out["ref"], out[fmt]
    assert r["compressed"] and r["calls"] == [130, 130], r
    assert r["final"] < 0.7 * r["first"], r  # it learns
    assert r["final"] < 1.05 * ref["final"], (r, ref)
    assert r["compressed_bytes"] == r["expected_bytes"], r
    W, n = result(2, seed)["world_size"], r["input_numel"]
    per_element = r["error_bytes"] / (n * (1 + 1 / W))  # worker error + the (unused) server error of 1/W
    want = {"fp32": (4, 4), "bf16": (2, 2), "int8": (1, 1.05)}[fmt]
    assert want[0] <= per_element <= want[1], (fmt, per_element)
    # the bytes the communicators really keep: their error blobs, a 64-byte header each besides
    assert sum(r["blob_bytes"]) == r["error_bytes"] + 64 * len(r["blob_bytes"]), r


@pytest.mark.parametrize("what,needle", [
    ("not_fsdp", "holds no FSDP2 module with params"),
    ("not_module", "takes the FSDP2 module"),
    ("unmanaged", "param '2.weight' (shape (4, 32)) is not managed by an FSDP2 module"),
    ("freeze0", "freeze_step=0 is not an int >= 1"),
    ("format", "error_format='int4'"),
    ("bf16_reduce", "MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)"),
    ("twice", "already has a custom reduce-scatter"),
    ("hsdp", "2-D mesh (1, 2) (HSDP"),
])
def test_refusals(what, needle, seed):
    out = result(2, seed)["refusals"]
    err = out[what]
    assert err is not None and needle in err, (what, err)
    if what not in ("not_module", "freeze0", "format"):
        assert "nothing was changed" in err, err
    assert out["unmanaged_untouched"] and out["hsdp_untouched"], out


def test_dcp_checkpoint_and_worker_errors(seed):
    out = result(2, seed)["dcp"]
    # a warm-up checkpoint resumes bit for bit (across the freeze after it)
    assert out["warmup/steps_after_load/False"] == 2 and out["warmup/equal/False"], out
    # a compressed-stage one: bit for bit with the per-rank errors loaded;
    # without them the errors restart at zero and the run departs
    assert out["compressed/steps_after_load/True"] == 5 and out["compressed/equal/True"], out
    assert not out["compressed/equal/False"] and out["compressed/diff/False"] > 0, out
    assert "saved by rank" in out["wrong_rank"] and "nothing was changed" in out["wrong_rank"], out


@pytest.mark.exhaustive
def test_dcp_reshard_from_2_to_3_ranks(seed, tmp_path):
    """A checkpoint after the freeze, saved at 2 ranks, loaded at 3: the
    params and moments equal what was saved; the worker errors start at zero
    (the per-group error blobs are per rank and layout: none carried); the
    3-rank layout (shards padded 187 -> 192 and 66 -> 72) trains on."""
    env = {"LOWBIT_FSDP_ONEBIT_DIR": str(tmp_path)}
    assert launch(WORKER, 2, "reshard_save", seed, TIMEOUT, env=env)["reshard_save"]["steps"] == 5
    out = launch(WORKER, 3, "reshard_load", seed, TIMEOUT, env=env)["reshard_load"]
    assert out["equal"] and out["steps"] == 5 and out["compressed"], out
    assert out["errors_before"] == [[0, 0], [0, 0]], out
    assert out["steps_after"] == 7 and out["finite"] and out["padded"] == [[187, 192], [66, 72]], out


def test_nonfinite_gradient_after_the_freeze_skips_the_step_on_every_rank(seed):
    out = result(2, seed)["nonfinite"]
    # freeze 2; the NaN is in step 4's batch of the last rank
    assert out["skipped"] == [False, False, False, True, False, False, False], out
    assert out["steps"] == [1, 2, 3, 3, 4, 5, 6], out
    assert out["equal"], out  # nothing changed: bit for bit the twin that skipped that batch


def test_param_groups_and_an_lr_scheduler(seed):
    out = result(2, seed)["groups"]
    assert out["wd"] == [0.01, 0.0], out
    assert out["warmup_bitwise"] == [True] * 3, out  # FSDP2 + lowbit AdamW with the same groups and schedule
    assert out["bias_still"] == [True] * 3 and out["weight_moved"] == [True] * 3, out  # lr 0 after the freeze
    # bias_correction=False in both stages
    assert out["nobc_warmup_bitwise"] == [True] * 3, out
    assert len(out["nobc_update_vs_f64"]) == 2 and max(out["nobc_update_vs_f64"]) < 1e-5, out


@pytest.mark.exhaustive
def test_three_ranks_padding_and_an_empty_shard(seed):
    """3 ranks: the first group's shards (187 elements) padded to 192, the
    second's to 72, with rank 2 holding no rows of the 4 x 32 weight (its
    shard is FSDP2's padding only): the warm-up, the reduce-scatter against
    its float64 simulation and the NaN skip, as at 2 ranks."""
    out = launch(WORKER, 3, "exact,nonfinite", seed, TIMEOUT)
    ex, nf = out["exact"], out["nonfinite"]
    assert ex["padded"] == [[187, 192], [66, 72]], ex
    assert ex["warmup_bitwise"] == [True] * 3 and max(ex["warmup_vs_torch"]) < 1e-6, ex
    assert ex["sim_worst"] == 0.0 and ex["replay_equal"] and ex["lowbit_bytes"] == ex["expected_bytes"], ex
    assert max(ex["update_vs_f64"]) < 1e-5, ex
    assert nf["skipped"][3] and nf["steps"] == [1, 2, 3, 3, 4, 5, 6] and nf["equal"], nf

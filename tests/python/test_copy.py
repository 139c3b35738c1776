"""Copies of handle-holding objects (defect 3): copy.copy() of an Optimizer
used to share its library handle, so closing the copy freed the original's.
Now copy.copy and pickling refuse with a TypeError, and copy.deepcopy makes an
independent optimizer (its own handle, the same settings, groups and state,
over deep copies of the arrays). The Communicator cases are in test_comm.py."""

import copy
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lowbit

ml_dtypes = pytest.importorskip("ml_dtypes")


def _trained(rng):
    """Two groups, per-param formats, a bf16 param with error correction, a
    param without a grad, three steps."""
    opt = lowbit.Optimizer("adamw", lr=1e-2, weight_decay=0.05, state="8bit", min_quantized_numel=64, seed=7)
    opt.add_group(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.0)
    params = [rng.standard_normal(300).astype(np.float32), rng.standard_normal(17).astype(np.float32),
              rng.standard_normal(257).astype(ml_dtypes.bfloat16), rng.standard_normal(40).astype(np.float32)]
    grads = [rng.standard_normal(p.size).astype(np.float32) for p in params[:3]] + [None]
    opt.add_param(params[0], grads[0], state="4bit")
    opt.add_param(params[1], grads[1], group=1)
    opt.add_param(params[2], grads[2], group=1, error_correction=True)
    opt.add_param(params[3], None)
    for _ in range(3):
        opt.step()
    return opt, params, grads


def test_shallow_copy_and_pickle_refuse():
    with lowbit.Optimizer("adamw") as opt:
        opt.add_param(np.zeros(4, np.float32))
        with pytest.raises(TypeError, match="deepcopy"):
            copy.copy(opt)
        with pytest.raises(TypeError, match="save"):
            pickle.dumps(opt)
        assert not opt.closed and opt.num_params == 1


def test_deepcopy_is_independent(rng):
    opt, params, grads = _trained(rng)
    twin = copy.deepcopy(opt)
    assert twin.handle != opt.handle and twin.num_params == opt.num_params == 4
    assert twin.save() == opt.save()  # same settings, groups, state and step counts
    assert twin.num_groups == 2 and twin.get_hparams(1) == opt.get_hparams(1)
    for i in range(4):
        assert twin.param_info(i) == opt.param_info(i)
        assert twin.param(i) is not params[i] and np.array_equal(twin.param(i), params[i])

    # the copy's arrays are its own: its grads are copies too, so new values
    # written into the original's grads reach only the original
    twin_grads = [twin._grads[i].owner for i in range(3)]
    for g in grads[:3]:
        g[...] = rng.standard_normal(g.size)
    opt.step()
    for g, tg in zip(grads[:3], twin_grads):
        tg[...] = g
    twin.step()
    for i in range(4):
        assert np.array_equal(twin.param(i), params[i])  # the same step, the same bits
    assert twin.save() == opt.save()

    # closing the copy leaves the original whole (it used to free it)
    twin.close()
    opt.step()
    assert opt.param_info(0).step == 5
    before = opt.read_moment(0, 1)
    twin2 = copy.deepcopy(opt)
    twin2.step()
    assert np.array_equal(opt.read_moment(0, 1), before) and twin2.param_info(0).step == 6
    twin2.close()
    opt.close()


def test_deepcopy_keeps_arrays_paired_through_the_memo(rng):
    opt, params, grads = _trained(rng)
    params2, opt2 = copy.deepcopy((params, opt))
    for i in range(4):
        assert opt2.param(i) is params2[i]
    opt2.step()
    assert not np.array_equal(params2[0], params[0])  # the copy updated its own arrays only
    opt.close(), opt2.close()


def test_deepcopy_of_a_closed_optimizer_is_invalid_state():
    opt = lowbit.Optimizer("sgd")
    opt.close()
    with pytest.raises(lowbit.InvalidStateError, match="closed"):
        copy.deepcopy(opt)


def test_deepcopy_refuses_what_the_library_cannot_give_back():
    with lowbit.Optimizer("onebit_adam") as opt:
        opt.add_param(np.zeros(8, np.float32))
        opt.set_momentum_mask(0, np.ones(8, np.uint8))
        with pytest.raises(TypeError, match="momentum masks"):
            copy.deepcopy(opt)


def test_the_old_crash_now_raises(tmp_path):
    """The repro of defect 3 (copy, close the copy, use the original), in a
    child interpreter so a crash could not take pytest down."""
    script = tmp_path / "repro.py"
    script.write_text(
        "import copy, numpy as np, lowbit\n"
        "opt = lowbit.Optimizer('adamw')\n"
        "opt.add_param(np.ones(1000, np.float32), np.ones(1000, np.float32))\n"
        "try:\n"
        "    c = copy.copy(opt)\n"
        "    c.close()\n"
        "except TypeError as e:\n"
        "    print('refused:', e)\n"
        "opt.step(); opt.step()\n"
        "print('step', opt.param_info(0).step)\n")
    env = None
    import os

    env = dict(os.environ, PYTHONPATH=str(Path(lowbit.__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "refused: copy.copy() of a lowbit.Optimizer" in proc.stdout and "step 2" in proc.stdout

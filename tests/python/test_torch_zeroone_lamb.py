"""0/1 Adam and 1-bit LAMB: lowbit.Optimizer("zeroone_adam" / "onebit_lamb")
(options, status, bad arguments) and lowbit.torch.ZeroOneAdam / OneBitLamb
over torch.distributed (gloo, CPU) under torchrun with DDP and
onebit_ddp_comm_hook: training against uncompressed references of the same
algorithms, parameters identical on every rank, the schedules step by step,
bytes on the wire, bit-identical resume, non-finite gradients and
mismatched sizes on one rank (torch_zeroone_lamb_worker.py does the
distributed work; every launch is bounded by a timeout).

The torchrun training runs (4 tests over one launch per world size, 15-50 s
each) and the 3-rank variants are marked exhaustive (scripts/test.sh runs them
with --all); the fast set keeps the one-process tests and the 2-rank "robust"
launch (resume, NaN, mismatched sizes under DDP with the hook)."""
import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
from torchrun_launch import launch as _launch  # noqa: E402

WORKER = Path(__file__).with_name("torch_zeroone_lamb_worker.py")
TIMEOUT = 400  # seconds; the longest launch ("train" on 3 ranks) takes about 40-50 s on 2 idle cores
# 2 ranks, and 3 under the exhaustive marker
RANKS = [2, pytest.param(3, marks=pytest.mark.exhaustive)]


def launch(nproc, case, seed):
    return _launch(WORKER, nproc, case, seed, TIMEOUT)


_results = {}


def result(nproc, case, seed):
    """One torchrun launch per (nproc, case), shared by the tests that read it."""
    key = (nproc, case, seed)
    if key not in _results:
        _results[key] = launch(nproc, case, seed)
    return _results[key]


# ----------------------------------------------------------------- one process


def loopback_communicator():
    """A one-rank communicator over Python callbacks (copies)."""

    def copy(send, recv, m, stream):
        ctypes.memmove(recv, send, m)

    def noop(data, n, stream):
        pass

    return lowbit.Communicator.from_transport(rank=0, world_size=1, alltoall=copy, allgather=copy,
                                              allreduce_sum=noop)


@pytest.mark.parametrize("name,algorithm", [("zeroone_adam", lowbit.Algorithm.ZEROONE_ADAM),
                                            ("0/1_adam", lowbit.Algorithm.ZEROONE_ADAM),
                                            ("onebit_lamb", lowbit.Algorithm.ONEBIT_LAMB),
                                            ("1bit_lamb", lowbit.Algorithm.ONEBIT_LAMB)])
def test_algorithm_names(name, algorithm):
    with lowbit.Optimizer(name) as opt:
        assert opt.algorithm == algorithm


def test_onebit_options_defaults_and_errors():
    with lowbit.Optimizer("zeroone_adam") as opt:
        assert opt.onebit_options() == pytest.approx(dict(
            var_update_scaler=16, local_step_scaler=32678, local_step_clipper=16, max_coeff=10.0, min_coeff=0.01,
            coeff_beta=0.9, factor_max=4.0, factor_min=0.5, factor_threshold=0.1))
        opt.set_onebit_options(var_update_scaler=4, local_step_clipper=8)
        assert opt.onebit_options()["var_update_scaler"] == 4 and opt.onebit_options()["local_step_clipper"] == 8
        assert opt.onebit_options()["local_step_scaler"] == 32678
        with pytest.raises(lowbit.InvalidArgumentError, match="unknown 1-bit option 'var_freeze_step'"):
            opt.set_onebit_options(var_freeze_step=3)
        with pytest.raises(lowbit.InvalidArgumentError, match="local_step_scaler=1.5 must be an int"):
            opt.set_onebit_options(local_step_scaler=1.5)
        with pytest.raises(lowbit.InvalidArgumentError, match="max_coeff='big' must be a real number"):
            opt.set_onebit_options(max_coeff="big")
        # values out of range: the library refuses them and nothing changes
        for bad in (dict(var_update_scaler=0), dict(local_step_clipper=-1), dict(min_coeff=0.0),
                    dict(max_coeff=0.001), dict(coeff_beta=1.0), dict(factor_min=5.0), dict(factor_threshold=-0.1)):
            with pytest.raises(lowbit.InvalidArgumentError):
                opt.set_onebit_options(**bad)
            assert opt.onebit_options()["var_update_scaler"] == 4
    with lowbit.Optimizer("adamw") as opt:
        with pytest.raises(lowbit.InvalidArgumentError, match="adamw optimizer has no 1-bit options"):
            opt.set_onebit_options(var_update_scaler=4)


def test_bias_correction_is_refused():
    for name in ("zeroone_adam", "onebit_lamb"):
        with pytest.raises(lowbit.InvalidArgumentError):
            lowbit.Optimizer(name, bias_correction=True)


def test_status_follows_the_zeroone_schedule(rng):
    """One rank: the status before and after every step is the documented
    schedule (torch_zeroone_lamb_worker.ZeroOneSchedule), with the exchange
    it announces; v changes on the variance steps only."""
    from torch_zeroone_lamb_worker import ZeroOneSchedule

    schedule = dict(var_freeze_step=20, var_update_scaler=3, local_step_scaler=4, local_step_clipper=4)
    comm = loopback_communicator()
    w = np.linspace(-1, 1, 300, dtype=np.float32)
    g = np.zeros_like(w)
    opt = lowbit.Optimizer("zeroone_adam", lr=1e-2, freeze_step=schedule["var_freeze_step"])
    opt.set_onebit_options(**{k: v for k, v in schedule.items() if k != "var_freeze_step"})
    opt.add_param(w, g)
    opt.set_comm(comm)
    ref = ZeroOneSchedule(**schedule)
    st = opt.onebit_status()
    assert (st.step, st.phase, st.next_full_average) == (0, 0, True)
    for _ in range(40):
        g[:] = rng.standard_normal(w.size).astype(np.float32)
        v0 = opt.read_moment(0, 1)
        variance = ref.next_variance()
        assert opt.onebit_status().next_exchange == ("average" if variance else
                                                     "1bit" if not ref.next_phase2() or ref.next_sync() else "none")
        assert opt.step()
        ref.advance()
        st = opt.onebit_status()
        assert st.step == ref.t
        fields = ref.fields()
        assert (st.var_interval, st.var_counter, st.local_step_interval, st.local_step_counter,
                st.next_full_average) == tuple(fields.values()), (ref.t, st, fields)
        assert st.phase == int(ref.next_phase2())  # 1 once the next step is in phase 2
        assert np.array_equal(opt.read_moment(0, 1), v0) != variance
    opt.close()
    comm.close()


# ----------------------------------------------------------------- lowbit.torch, one process


def test_torch_constructors_check_their_arguments():
    comm = loopback_communicator()
    p = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match="bias_correction=True is not supported"):
        lt.ZeroOneAdam(p, bias_correction=True, communicator=comm)
    with pytest.raises(ValueError, match="bias_correction=True is not supported"):
        lt.OneBitLamb(p, bias_correction=True, communicator=comm)
    # the library checks the values (its message), the constructor names its arguments as given
    with pytest.raises(ValueError, match=r"ZeroOneAdam\(.*var_update_scaler=0[,)].*: .*var_update_scaler"):
        lt.ZeroOneAdam(p, var_update_scaler=0, communicator=comm)
    with pytest.raises(ValueError, match="var_freeze_step=-1"):
        lt.ZeroOneAdam(p, var_freeze_step=-1, communicator=comm)
    with pytest.raises(ValueError, match=r"OneBitLamb\(.*max_coeff=0\.001.*: .*max_coeff"):
        lt.OneBitLamb(p, max_coeff=0.001, communicator=comm)
    with pytest.raises(ValueError, match="factor_threshold"):
        lt.OneBitLamb(p, factor_threshold=1.0, communicator=comm)
    with pytest.raises(ValueError, match="freeze_step=0"):
        lt.OneBitLamb(p, freeze_step=0, communicator=comm)
    with pytest.raises(ValueError, match=r"freeze_step=0.*1-bit Adam needs at least one warm-up step"):
        lt.OneBitAdam(p, freeze_step=0, communicator=comm)
    with pytest.raises(ValueError, match="process_group or communicator"):
        lt.ZeroOneAdam(p, communicator=comm, process_group=object())
    with pytest.raises(ValueError, match="bias_correction=True"):
        lt.ZeroOneAdam(p, communicator=comm).add_param_group(
            {"params": [torch.nn.Parameter(torch.zeros(2))], "bias_correction": True})
    opt = lt.OneBitLamb(p, lr=0.1, freeze_step=7, max_coeff=5.0, communicator=comm)
    assert opt.freeze_step == 7 and opt.onebit_options["max_coeff"] == 5.0
    assert lt.ZeroOneAdam(p, var_freeze_step=9, communicator=comm).var_freeze_step == 9
    with pytest.raises(lowbit.InvalidArgumentError, match="is not a lowbit.torch OneBitAdam, ZeroOneAdam or OneBitLamb"):
        lt.onebit_ddp_comm_hook(lt.AdamW(p))
    comm.close()


@pytest.mark.parametrize("cls", [lt.ZeroOneAdam, lt.OneBitLamb])
def test_torch_optimizers_refuse_other_backends(cls, monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "ucc")
    monkeypatch.setattr(dist, "group", type("G", (), {"WORLD": object()}))
    with pytest.raises(lowbit.UnsupportedError, match="backend 'ucc'"):
        cls([torch.nn.Parameter(torch.zeros(3))])


@pytest.mark.parametrize("cls", [lt.ZeroOneAdam, lt.OneBitLamb])
def test_torch_optimizers_need_an_initialized_group(cls, monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(lowbit.InvalidStateError, match="init_process_group"):
        cls([torch.nn.Parameter(torch.zeros(3))])


def test_torch_state_dict_resumes_bit_for_bit_on_one_rank(seed):
    """One rank: save, step, load into a fresh optimizer, step again: the
    same params, status and error buffers (through phase 1 and phase 2 of
    0/1 Adam, warm-up and compression of 1-bit LAMB)."""
    torch.manual_seed(seed)
    makers = [lambda p, c: lt.ZeroOneAdam(p, lr=1e-2, var_freeze_step=5, var_update_scaler=2, local_step_scaler=3,
                                          local_step_clipper=4, communicator=c),
              lambda p, c: lt.OneBitLamb(p, lr=1e-2, freeze_step=4, communicator=c)]
    for make in makers:
        comm = loopback_communicator()
        w = torch.nn.Parameter(torch.randn(50))
        b = torch.nn.Parameter(torch.randn(7))
        opt = make([w, b], comm)
        for t in range(14):
            w.grad, b.grad = torch.randn(50), torch.randn(7)
            sd = opt.state_dict()
            saved = (w.detach().clone(), b.detach().clone(), w.grad.clone(), b.grad.clone())
            opt.step()
            comm2 = loopback_communicator()
            w2, b2 = torch.nn.Parameter(saved[0].clone()), torch.nn.Parameter(saved[1].clone())
            opt2 = make([w2, b2], comm2)
            if t:
                w2.grad, b2.grad = torch.zeros(50), torch.zeros(7)
                opt2.load_state_dict(sd)
            w2.grad, b2.grad = saved[2].clone(), saved[3].clone()
            opt2.step()
            assert torch.equal(w, w2) and torch.equal(b, b2), (type(opt).__name__, t)
            assert opt2.onebit_status() == opt.onebit_status()
            assert comm2.save_errors() == comm.save_errors()
            del opt2
            comm2.close()
        del opt
        comm.close()


# ----------------------------------------------------------------- torchrun


def relative(out, a, b):
    return out[a] / out[b] - 1


@pytest.mark.exhaustive
@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_zeroone_adam_trains_like_its_uncompressed_reference(nproc, seed):
    """DDP + ZeroOneAdam against the same algorithm with exact averages
    (phase 1: every step on averaged gradients, v on the variance steps;
    phase 2: local steps, exact averages at the synchronisations): the same
    schedules step by step, the same params on every rank, and a final loss
    close to the reference's (see the next test for the 2% target)."""
    out = result(nproc, "train", seed)
    print(json.dumps(out, indent=1))
    assert out["ref_zeroone_same"] and out["zeroone_same"], "params differ between ranks"
    assert out["zeroone_schedule_mismatches"] == [], out["zeroone_schedule_mismatches"]
    assert out["zeroone_loss"] < 0.25 * out["initial_loss"], out
    assert out["zeroone_tail_synchronised"], "the last 8 tail steps should be synchronisations"


@pytest.mark.exhaustive
@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_zeroone_adam_within_2_percent_of_its_reference(nproc, seed):
    """Issue 16's 2% target, under DeepSpeed's recipe for 0/1 Adam (lr
    warm-up until var_freeze_step at 10% of the steps, then exponential lr
    decay; local_step_scaler at 29% of the steps after the freeze; see
    ZO_TRAIN in the worker), the same lr schedule for the reference.
    0/1 Adam's local-step policy is tied to a decaying lr: the 1-bit
    exchanges' error (and its error feedback) moves the params by lr-sized
    steps, and with a frozen v those steps are large where v is small. At a
    constant lr the same schedule ends 3% below to 138% above the reference,
    with the recipe over 640 steps +0.7% to +4.7% (bench/NOTES.md).

    How the 2% is read here: the final loss is the mean over the last 8
    synchronisations (ZO_TAIL, the same for both), and the bound is one-sided
    ("no more than 2% above", as for 1-bit LAMB below). Measured over 1280
    steps for seeds 11 to 88 on 2 and 3 ranks: -5.8% to +0.7% (the single
    last step: -6.2% to +3.0%; 3 of 8 seeds at 2 ranks end more than 2%
    *below* the reference, seed 66 at 3 ranks 3.0% above on its last step
    alone). For information (out["adam_loss"]): 0/1 Adam ends 10% to 21%
    below DDP + torch.optim.Adam under the same lr schedule (bias-corrected)."""
    out = result(nproc, "train", seed)
    assert relative(out, "zeroone_tail_loss", "ref_zeroone_tail_loss") <= 0.02, out


@pytest.mark.exhaustive
@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_onebit_lamb_trains_like_lamb(nproc, seed):
    """DDP + OneBitLamb against plain LAMB (no bias correction, trust ratio
    per tensor) on averaged gradients, and against 1-bit LAMB with exact
    averages (RefOneBitLambExact): no more than 2% above either (measured,
    seeds 11 to 44 on 2 and 3 ranks: 3.7% to 9.5% below plain LAMB, 2.0% to
    6.2% below the exact-average form)."""
    out = result(nproc, "train", seed)
    print(json.dumps(out, indent=1))
    assert out["ref_lamb_same"] and out["lamb_same"], "params differ between ranks"
    assert out["lamb_averaged_ok"], "the hook's averaging does not follow the warm-up"
    assert relative(out, "lamb_loss", "ref_lamb_loss") <= 0.02, out
    assert relative(out, "lamb_loss", "ref_lamb_exact_loss") <= 0.02, out
    assert out["lamb_loss"] < 0.25 * out["initial_loss"], out


@pytest.mark.exhaustive
@pytest.mark.parametrize("nproc", [2, 3])
def test_bytes_on_the_wire(nproc, seed):
    """From the transport's counters (the optimizer's exchanges and the
    hook's all-reduces), per step, against DDP's fp32 ring all-reduce."""
    out = result(nproc, "train", seed)
    ddp = out["ddp_fp32_bytes_per_step"]
    b = out["bytes_per_step"]
    print(json.dumps({"ddp_fp32": ddp, **b}, indent=1))
    # warm-up: DDP's fp32 all-reduce through the hook plus the 128-byte agreement
    assert ddp <= b["lamb_warmup"] <= ddp + 2 * 128, b
    assert ddp <= b["onebit_adam_warmup"] <= ddp + 2 * 128, b
    # compressed stages: one 1-bit exchange per step (LAMB, 1-bit Adam)
    assert b["lamb_compressed"] * 10 < ddp, b
    assert b["onebit_adam_compressed"] * 10 < ddp, b
    # 0/1 Adam, late phase 1 (steps 113-128): 1-bit gradients and a variance step (fp32) every 8 steps
    assert b["zeroone_phase1"] * 4 < ddp, b
    # 0/1 Adam, phase 2 with a local interval of 8: a 1-bit exchange every 8 steps
    assert b["zeroone_phase2"] * 40 < ddp, b


@pytest.mark.parametrize("nproc", RANKS)
def test_resume_is_bit_identical(nproc, seed):
    out = result(nproc, "robust", seed)
    for name in ("zeroone_resume", "lamb_resume"):
        assert out[name] and all(out[name].values()), (name, out[name])
    assert {k.split("@")[0] for k in out["zeroone_resume"]} == {
        "variance1", "variance", "onebit_gradient", "first_phase2", "sync1", "sync", "local"}
    assert {k.split("@")[0] for k in out["lamb_resume"]} == {"warmup", "last_warmup", "first_compressed",
                                                             "compressed"}


@pytest.mark.parametrize("nproc", RANKS)
def test_nan_on_one_rank_skips_on_every_rank(nproc, seed):
    out = result(nproc, "robust", seed)
    for name, kinds in (("zeroone_nonfinite", 7), ("lamb_nonfinite", 4)):
        r = out[name]
        assert len(r["poisoned"]) == kinds, r
        assert r["same"] and r["finite"], r
        for rank_checks in r["checks"]:
            assert len(rank_checks) == kinds, r
            assert all(c["skipped"] and c["unchanged"] and c["status_unchanged"] for c in rank_checks), r
    # every skipped step is one step fewer
    assert out["zeroone_nonfinite"]["step"] == 60 - 7 and out["lamb_nonfinite"]["step"] == 30 - 4


@pytest.mark.parametrize("nproc", RANKS)
def test_mismatched_sizes_fail_on_every_rank(nproc, seed):
    out = result(nproc, "robust", seed)
    for name in ("zeroone_bad_sizes", "lamb_bad_sizes"):
        r = out[name]
        assert all(e is not None and "numel" in e for e in r["errors"]), (name, r["errors"])
        assert all(r["unchanged"]), (name, r)

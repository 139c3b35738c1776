"""save/load (bytes and files) through the package: resuming gives the same
next steps bit for bit; materialized checkpoints convert between formats;
bad checkpoints raise and change nothing. (Moments written through the C API,
as lowbit.torch imports them: test_moments.py.)"""

import struct
import zlib

import numpy as np
import pytest

import lowbit

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16

SIZES = (5000, 300, 7)


def _setup(rng, state, algorithm="adamw", dtype=np.float32, **kw):
    params = [rng.standard_normal(n).astype(dtype) for n in SIZES]
    opt = lowbit.Optimizer(algorithm, lr=1e-2, state=state, seed=1234, **kw)
    opt.add_group(lr=3e-2, weight_decay=0.2)
    for i, p in enumerate(params):
        opt.add_param(p, group=i % 2)
    return opt, params


def _grads(rng, k):
    return [[rng.standard_normal(n).astype(np.float32) for n in SIZES] for _ in range(k)]


@pytest.mark.parametrize(
    "state, dtype, flags",
    [
        ("fp32", np.float32, {}),
        ("bf16", np.float32, {}),
        ("8bit", np.float32, {}),
        ("4bit", BF16, {"stochastic_rounding": True}),
        ("fp8", BF16, {"error_correction": True}),
    ],
)
@pytest.mark.parametrize("how", ["bytes", "file"])
def test_resume_gives_identical_next_steps(state, dtype, flags, how, rng, tmp_path):
    before, after = _grads(rng, 4), _grads(rng, 4)
    opt, params = _setup(rng, state, dtype=dtype, **flags)
    start = [p.copy() for p in params]
    with opt:
        for g in before:
            opt.step(g)
        mid = [p.copy() for p in params]
        if how == "bytes":
            blob = opt.save()
        else:
            path = tmp_path / "opt.lowbit"
            opt.save_file(path)
        for g in after:
            opt.step(g)
        final = [p.copy() for p in params]

    # a fresh optimizer over copies of the mid-run params
    params2 = [m.copy() for m in mid]
    with lowbit.Optimizer("adamw", lr=0.5, state=state, seed=99, **flags) as opt2:
        opt2.add_group(lr=0.5)
        for i, p in enumerate(params2):
            opt2.add_param(p, group=i % 2)
        if how == "bytes":
            opt2.load(blob)
        else:
            opt2.load_file(str(path))
        assert opt2.get_hparams(1)["weight_decay"] == pytest.approx(0.2)  # groups restored
        assert opt2.param_info(0).step == 4
        for g in after:
            opt2.step(g)
    for a, b, s in zip(params2, final, start):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
        assert not np.array_equal(a, s)


def test_load_accepts_any_buffer(rng):
    opt, params = _setup(rng, "8bit")
    with opt:
        opt.step(_grads(rng, 1)[0])
        blob = opt.save()
        for buf in (bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8).copy()):
            opt.load(buf)
        assert opt.save() == blob


def test_materialized_checkpoint_converts_between_formats(rng):
    opt, params = _setup(rng, "fp32")
    with opt:
        for g in _grads(rng, 5):
            opt.step(g)
        moments = [(opt.read_moment(i, 0), opt.read_moment(i, 1)) for i in range(len(SIZES))]
        blob = opt.save("fp32")
    with lowbit.Optimizer("adamw", state="8bit") as q:
        q.add_group()
        for i, p in enumerate(params):
            q.add_param(p.copy(), group=i % 2)
        q.load(blob)
        m, v = q.read_moment(0, 0), q.read_moment(0, 1)
        assert q.param_info(0).state_format == "8bit"
        # 8-bit dynamic map: relative L2 error of one quantization is well under 2%
        assert np.linalg.norm(m - moments[0][0]) / np.linalg.norm(moments[0][0]) < 0.02
        assert np.linalg.norm(v - moments[0][1]) / np.linalg.norm(moments[0][1]) < 0.02
        # small params keep fp32 state: exact
        assert np.array_equal(q.read_moment(2, 1), moments[2][1])


def _refresh(blob: bytearray) -> bytes:
    struct.pack_into("<I", blob, len(blob) - 4, zlib.crc32(blob[:-4]))
    return bytes(blob)


def test_bad_checkpoints_raise_and_change_nothing(rng, tmp_path):
    opt, params = _setup(rng, "8bit")
    with opt:
        opt.step(_grads(rng, 1)[0])
        good = opt.save()
        snap = [p.copy() for p in params]

        flipped = bytearray(good)
        flipped[len(flipped) // 2] ^= 0xFF
        truncated = good[:-10]
        version = bytearray(good)
        struct.pack_into("<I", version, 8, 99)
        cases = [
            (bytes(flipped), lowbit.CorruptDataError, "checksum"),
            (truncated, lowbit.CorruptDataError, "truncated"),
            (b"NOTLOWBIT" + good[9:], lowbit.CorruptDataError, "magic"),
            (_refresh(version), lowbit.VersionMismatchError, "version"),
            (b"", lowbit.CorruptDataError, ""),
        ]
        for data, exc, word in cases:
            with pytest.raises(exc) as info:
                opt.load(data)
            assert word in info.value.message
            assert opt.save() == good
            for a, b in zip(params, snap):
                assert np.array_equal(a, b)

        with pytest.raises(lowbit.LowbitIOError) as info:
            opt.load_file(tmp_path / "missing.lowbit")
        assert "missing.lowbit" in info.value.message
        with pytest.raises(lowbit.LowbitIOError):
            opt.save_file(tmp_path / "no" / "such" / "dir" / "x.lowbit")
        assert opt.save() == good

    # same algorithm, other params
    with lowbit.Optimizer("adamw", state="8bit") as other:
        other.add_param(np.zeros(10, np.float32))
        with pytest.raises(lowbit.StateMismatchError) as info:
            other.load(good)
        assert "params" in info.value.message
    # other algorithm
    with lowbit.Optimizer("lion", state="8bit") as other:
        other.add_group()
        for i, p in enumerate(params):
            other.add_param(p.copy(), group=i % 2)
        with pytest.raises(lowbit.StateMismatchError) as info:
            other.load(good)
        assert "algorithm" in info.value.message

"""Shaped parameters in lowbit.jax (capi/lowbit.h "Shaped parameters"): the
presets "4bit-rank1" (lpmm 4-bit AdamW) and "4bit-factor" (4-bit Factor) and
the explicit normalisations, on 2-D and 3-D leaves of awkward sizes and a 1-D
leaf (which falls back to blocks): same bits as the C library driven
directly with the same shapes, state sizes as planned, the layout record
refusing a state made with another normalisation or shape, and clear errors."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")

from jax_reference import ALGORITHMS, CapiOptimizer, _tensor  # noqa: E402
from lowbit._ffi import ffi  # noqa: E402

import seeding  # noqa: E402

from expect_errors import ON_GPU, fails, refused  # noqa: E402

NORM = {"default": 0, "block": 1, "rank1": 2, "factored": 3}
PRESET = {"4bit-rank1": 1, "4bit-factor": 2}  # lowbit_preset_t
HP = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
LION_HP = dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1)
SHAPES = {"a": (7, 129), "b": (3, 5, 33), "c": (1000,), "d": (65, 130)}


class CapiShaped(CapiOptimizer):
    """CapiOptimizer with shaped params (lowbit_param_config_t.ndim / shape),
    presets and normalisations."""

    def __init__(self, lib, algo, hparams, params, preset=None, first_normalization="default",
                 second_normalization="default", state_format=None, min_quantized_numel=4096, **config):
        self.lib = lib
        self.h = None
        cfg = ffi.new("lowbit_optimizer_config_t *")
        if preset is not None:
            self._ok(lib.lowbit_optimizer_config_preset(cfg, PRESET[preset]))
            cfg.algorithm = ALGORITHMS[algo]
        else:
            self._ok(lib.lowbit_optimizer_config_init_sized(cfg, ffi.sizeof(cfg[0]), ALGORITHMS[algo]))
        if state_format is not None:
            cfg.state_format = state_format
        if first_normalization != "default":
            cfg.first_normalization = NORM[first_normalization]
        if second_normalization != "default":
            cfg.second_normalization = NORM[second_normalization]
        cfg.min_quantized_numel = min_quantized_numel
        for k, v in config.items():
            setattr(cfg, k, v)
        hp = ffi.new("lowbit_hparams_t *")
        self._ok(lib.lowbit_hparams_init(hp, ALGORITHMS[algo]))
        for k, v in hparams.items():
            setattr(hp, k, v)
        handle = ffi.new("lowbit_optimizer_t *")
        self._ok(lib.lowbit_optimizer_create(handle, cfg, hp))
        self.h = handle[0]
        self.params = [np.array(p, copy=True, order="C").reshape(-1) for p in params]
        for p, src in zip(self.params, params):
            pc = ffi.new("lowbit_param_config_t *")
            self._ok(lib.lowbit_param_config_init_sized(pc, ffi.sizeof(pc[0])))
            pc.param = _tensor(p)
            pc.ndim = src.ndim
            for k, d in enumerate(src.shape):
                pc.shape[k] = d
            pid = ffi.new("int64_t *")
            self._ok(lib.lowbit_optimizer_add_param(self.h, pc, pid))


def bits(x):
    x = np.asarray(x)
    return x.view({4: np.uint32, 2: np.uint16}[x.dtype.itemsize])


CASES = {
    # name: (algo, jax kwargs, C kwargs, expected normalisations of a 2-D leaf[, param dtype])
    "adamw-4bit-rank1": ("adamw", dict(state_format="4bit-rank1"), dict(preset="4bit-rank1"), (1, 2)),
    "adamw-4bit-factor": ("adamw", dict(state_format="4bit-factor"), dict(preset="4bit-factor"), (1, 3)),
    "adam-4bit-factor": ("adam", dict(state_format="4bit-factor"), dict(preset="4bit-factor"), (1, 3)),
    "adamw-8bit-rank1-both": ("adamw", dict(state_format="8bit", first_normalization="rank1",
                                            second_normalization="rank1"),
                              dict(state_format=3, first_normalization="rank1", second_normalization="rank1"),
                              (2, 2)),
    "adamw-4bit-rank1-bf16-ecc": ("adamw", dict(state_format="4bit-rank1", error_correction=True),
                                  dict(preset="4bit-rank1", error_correction=1), (1, 2), ml_dtypes.bfloat16),
    "adamw-4bit-factor-fp16-sr": ("adamw", dict(state_format="4bit-factor", stochastic_rounding=True, seed=77),
                                  dict(preset="4bit-factor", stochastic_rounding=1, seed=77), (1, 3), np.float16),
    "lion-8bit-rank1": ("lion", dict(state_format="8bit", first_normalization="rank1"),
                        dict(state_format=3, first_normalization="rank1"), (2, 0)),
}


def make(ljax, algo, lr, kw, min_q):
    if algo == "lion":
        return ljax.lion(lr, b1=LION_HP["beta1"], b2=LION_HP["beta2"], weight_decay=LION_HP["weight_decay"],
                         min_quantized_numel=min_q, **kw)
    f = ljax.adamw if algo == "adamw" else ljax.adam
    return f(lr, b1=HP["beta1"], b2=HP["beta2"], eps=HP["eps"], weight_decay=HP["weight_decay"],
             min_quantized_numel=min_q, **kw)


@pytest.mark.parametrize("min_q", [0, 4096])
@pytest.mark.parametrize("case", list(CASES))
def test_same_bits_as_c_api(ljax, capi, case, min_q, seed):
    algo, jkw, ckw, norms2d = CASES[case][:4]
    dtype = CASES[case][4] if len(CASES[case]) > 4 else np.float32
    rng = seeding.rng("shaped", case, min_q, base=seed)
    names = sorted(SHAPES)
    params = [rng.standard_normal(SHAPES[k]).astype(dtype) for k in names]
    lrs = np.array([1e-2, 5e-3, 2.5e-3, 1.25e-3], np.float32)
    opt = make(ljax, algo, lambda count: jnp.asarray(lrs)[count], jkw, min_q)
    p_jax = {k: jnp.asarray(p) for k, p in zip(names, params)}
    state = opt.init(p_jax)
    step = jax.jit(opt.step)
    ref = CapiShaped(capi, algo, LION_HP if algo == "lion" else HP, params, min_quantized_numel=min_q, **ckw)
    try:
        for t in range(4):
            grads = [rng.standard_normal(p.shape).astype(dtype) for p in params]
            ref.set_lr(lrs[t])
            ref.step(grads)
            p_jax, state = step(p_jax, {k: jnp.asarray(g) for k, g in zip(names, grads)}, state)
        assert int(state.count) == 4
        mu, nu = ljax.moments(state, p_jax)
        layout = np.asarray(state.layout)
        for i, k in enumerate(names):
            np.testing.assert_array_equal(bits(p_jax[k]).reshape(-1), bits(ref.params[i]), err_msg=f"param {k}")
            info = ref.info(i)
            row = layout[i]
            assert (info.state_format, info.second_state_format) == (row[0], row[1]), k
            assert (info.first_normalization, info.second_normalization) == (row[3], row[4]), k
            quantized = min_q == 0 or np.prod(SHAPES[k]) >= min_q
            # rank-1 needs a quantized moment (the size threshold); factored
            # replaces v of any leaf of >= 2 dims; 1-D leaves keep blocks
            want = tuple(0 if n == 0 else n if len(SHAPES[k]) >= 2 and (quantized or n == 3) else 1 for n in norms2d)
            assert (row[3], row[4]) == want, (k, row)
            shaped = any(n in (2, 3) for n in want)
            assert row[5] == (len(SHAPES[k]) if shaped else 0), (k, row)
            assert tuple(row[6:6 + row[5]]) == (SHAPES[k] if shaped else ()), (k, row)
            nbytes = sum(np.asarray(x[k]).nbytes for x in (state.mu, state.mu_scale, state.nu, state.nu_scale,
                                                            state.ecc) if x[k] is not None)
            assert nbytes == info.state_bytes, (k, nbytes, info.state_bytes)
            for m, tree in enumerate((mu, nu)):
                if tree[k] is None:  # Lion: one moment
                    assert m == 1 and algo == "lion"
                    continue
                assert tree[k].shape == SHAPES[k]
                np.testing.assert_array_equal(bits(np.asarray(tree[k]).reshape(-1)), bits(ref.read_moment(i, m)),
                                              err_msg=f"param {k} moment {m}")
    finally:
        ref.close()


def test_plan_normalization(ljax):
    from lowbit._plan import Normalization, plan_param_state
    from lowbit._ffi import Algorithm, Dtype, StateFormat

    common = dict(state_format=StateFormat.BIT4, second_state_format=StateFormat.BIT4,
                  first_normalization=Normalization.BLOCK)
    n = 4096 * 4096
    p = plan_param_state(Algorithm.ADAMW, n, Dtype.FLOAT32, shape=(4096, 4096),
                         second_normalization=Normalization.FACTORED, **common)
    assert p.normalization == (Normalization.BLOCK, Normalization.FACTORED)
    assert p.formats[1] == StateFormat.FP32 and p.scale_count[1] == 0
    assert p.data_bytes[1] == 4 * (4096 + 4096 + 1)
    assert p.state_bytes / n < 0.6
    p = plan_param_state(Algorithm.ADAMW, 7 * 129, Dtype.FLOAT32, shape=(7, 129), min_quantized_numel=0,
                         second_normalization=Normalization.RANK1, **common)
    assert p.normalization == (Normalization.BLOCK, Normalization.RANK1)
    assert p.scale_count[1] == 2 * (7 + 129) and p.block_size[1] == 0
    p = plan_param_state(Algorithm.ADAMW, 1000, Dtype.FLOAT32, shape=(1000,), min_quantized_numel=0,
                         second_normalization=Normalization.FACTORED, **common)
    assert p.normalization == (Normalization.BLOCK, Normalization.BLOCK)  # 1-D: blocks
    # the jax optimizer's state has the planned sizes
    s = ljax.adamw(1e-3, state_format="4bit-factor").init({"w": jnp.zeros((256, 96)), "v": jnp.zeros((9000,))})
    assert s.nu["w"].dtype == jnp.float32 and s.nu["w"].shape == (256 + 96 + 1,) and s.nu_scale["w"] is None
    assert s.nu["v"].dtype == jnp.uint8 and s.nu["v"].shape == (4500,)
    s = ljax.adamw(1e-3, state_format="4bit-rank1").init({"w": jnp.zeros((256, 96))})
    assert s.nu["w"].shape == (256 * 96 // 2,) and s.nu_scale["w"].shape == (2 * (256 + 96),)


def test_bad_names(ljax):
    with pytest.raises(ValueError, match=r"state_format='4bit-rank2' is not one of .*4bit-factor"):
        ljax.adamw(1e-3, state_format="4bit-rank2")
    with pytest.raises(ValueError, match=r"state_format='4bit-rank1' is a preset of AdamW"):
        ljax.lion(1e-4, state_format="4bit-rank1")
    with pytest.raises(ValueError, match=r"second_normalization='rank2' is not one of"):
        ljax.adamw(1e-3, state_format="4bit", second_normalization="rank2")
    with pytest.raises(ValueError, match=r"first_normalization=7 is not one of"):
        ljax.sgd(0.1, momentum=0.9, first_normalization=7)
    with pytest.raises(ValueError, match=r"first_normalization='factored': only the second moment"):
        ljax.lion(1e-4, state_format="4bit", first_normalization="factored")


def test_layout_refuses_other_normalization_or_shape(ljax):
    params = {"w": jnp.zeros((64, 96)) + 0.5}
    grads = {"w": jnp.ones((64, 96))}
    state = ljax.adamw(1e-3, state_format="4bit-factor").init(params)
    # the same sizes, another shape (transposed): the layout tells them apart
    t_params, t_grads = {"w": params["w"].T}, {"w": grads["w"].T}
    refused(r"state was created with .*factored.*shape: \(64, 96\).* \(96, 64\)",
            lambda: ljax.adamw(1e-3, state_format="4bit-factor").step(t_params, t_grads, state), t_params, state)
    # another normalisation of the same moment
    rank1 = ljax.adamw(1e-3, state_format="4bit-rank1")
    # (on CUDA, where the layout is checked on the device, the state's sizes give it away first)
    fails(r"state nu is float32\(\d+,\) but the 4bit rank1 format" if ON_GPU else
          r"state was created with .*factored.* but this optimizer uses .*rank1",
          lambda: rank1.step(params, grads, state))
    # the right one works and changes the params
    new, _ = ljax.adamw(1e-3, state_format="4bit-factor").step(params, grads, state)
    assert not np.array_equal(np.asarray(new["w"]), np.asarray(params["w"]))

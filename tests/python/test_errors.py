"""Library errors become LowbitError subclasses carrying the library's
message, and a failed call changes nothing (params, moments, step counts and
the whole checkpoint are identical before and after). Also the raw C calls
for the cases the Python layer cannot produce (NULL handles, unknown
struct_size, unknown enum values), and handle lifetime."""

import gc
import re
import weakref

import numpy as np
import pytest

import lowbit
from lowbit._ffi import ffi
from lowbit._lib import LIB, error_for

# ----------------------------------------------------------------- exception types


def test_exception_hierarchy_keyed_by_status():
    for status, base in [
        (lowbit.Status.ERROR_INVALID_ARGUMENT, ValueError),
        (lowbit.Status.ERROR_NULL_POINTER, ValueError),
        (lowbit.Status.ERROR_UNSUPPORTED, NotImplementedError),
        (lowbit.Status.ERROR_OUT_OF_MEMORY, MemoryError),
        (lowbit.Status.ERROR_INVALID_STATE, RuntimeError),
        (lowbit.Status.ERROR_CUDA, RuntimeError),
        (lowbit.Status.ERROR_IO, OSError),
        (lowbit.Status.ERROR_CORRUPT_DATA, ValueError),
        (lowbit.Status.ERROR_VERSION_MISMATCH, ValueError),
        (lowbit.Status.ERROR_STATE_MISMATCH, ValueError),
        (lowbit.Status.ERROR_BUFFER_TOO_SMALL, ValueError),
        (lowbit.Status.ERROR_NONFINITE, FloatingPointError),
        (lowbit.Status.ERROR_COMMUNICATION, RuntimeError),
        (lowbit.Status.ERROR_INTERNAL, RuntimeError),
    ]:
        e = error_for(status, "the message", "lowbit_x")
        assert isinstance(e, lowbit.LowbitError) and isinstance(e, base)
        assert e.status == status and e.message == "the message" and e.function == "lowbit_x"
        assert "lowbit_x: the message" in str(e) and status.name in str(e)
        # the library knows every status too
        assert lowbit.status_string(status) not in ("", "unknown status")
    assert lowbit.status_string(9999) == "unknown status"


# ----------------------------------------------------------------- invariants


def _trained(rng, state="8bit", algorithm="adamw"):
    opt = lowbit.Optimizer(algorithm, lr=1e-2, state=state, min_quantized_numel=1)
    params = [rng.standard_normal(n).astype(np.float32) for n in (300, 17)]
    grads = [rng.standard_normal(p.size).astype(np.float32) for p in params]
    for p, g in zip(params, grads):
        opt.add_param(p, g)
    for _ in range(3):
        opt.step()
    return opt, params, grads


def _snapshot(opt, params):
    moments = []
    for i in range(len(params)):
        moments.append(opt.read_moment(i, 0))
    return ([p.copy() for p in params], moments, [opt.param_info(i).step for i in range(len(params))],
            opt.save(), [opt.get_hparams(g) for g in range(opt.num_groups)], opt.num_params)


def _assert_unchanged(opt, params, snap):
    now = _snapshot(opt, params)
    for a, b in zip(now[0], snap[0]):
        assert np.array_equal(a, b)
    for a, b in zip(now[1], snap[1]):
        assert np.array_equal(a, b)
    assert now[2:] == snap[2:]


# (call, exception, words the message must contain)
FAILING_CALLS = [
    (lambda o, p: o.set_lr(-1.0), lowbit.InvalidArgumentError, ["lr"]),
    (lambda o, p: o.set_lr(float("nan")), lowbit.InvalidArgumentError, ["lr"]),
    (lambda o, p: o.set_lr(float("inf")), lowbit.InvalidArgumentError, ["lr"]),
    (lambda o, p: o.set_hparams(0, betas=(1.0, 0.9)), lowbit.InvalidArgumentError, ["beta1"]),
    (lambda o, p: o.set_hparams(0, betas=(0.9, -0.1)), lowbit.InvalidArgumentError, ["beta2"]),
    (lambda o, p: o.set_hparams(0, eps=0.0), lowbit.InvalidArgumentError, ["eps"]),
    (lambda o, p: o.set_hparams(0, weight_decay=-1e-3), lowbit.InvalidArgumentError, ["weight_decay"]),
    (lambda o, p: o.set_hparams(7, lr=0.1), lowbit.InvalidArgumentError, ["group"]),
    (lambda o, p: o.set_lr(0.1, group=-1), lowbit.InvalidArgumentError, ["group"]),
    (lambda o, p: o.get_hparams(3), lowbit.InvalidArgumentError, ["group"]),
    (lambda o, p: o.add_group(lr=-1.0), lowbit.InvalidArgumentError, ["lr"]),
    (lambda o, p: o.add_param(np.zeros(0, np.float32)), lowbit.InvalidArgumentError, ["numel"]),
    (lambda o, p: o.add_param(p[0]), lowbit.InvalidArgumentError, ["param"]),  # registered twice
    (lambda o, p: o.add_param(p[0][100:200]), lowbit.InvalidArgumentError, ["param"]),  # overlaps
    (lambda o, p: o.add_param(np.zeros(5, np.float32), group=4), lowbit.InvalidArgumentError, ["group"]),
    (lambda o, p: o.set_grad(0, np.zeros(299, np.float32)), lowbit.InvalidArgumentError, ["numel"]),
    (lambda o, p: o.set_grad(5, np.zeros(299, np.float32)), lowbit.InvalidArgumentError, ["param"]),
    (lambda o, p: o.read_moment(0, 2), lowbit.InvalidArgumentError, ["moment"]),
    (lambda o, p: o.param_info(9), lowbit.InvalidArgumentError, ["param"]),
    (lambda o, p: o.state_bytes(9), lowbit.InvalidArgumentError, ["param"]),
    (lambda o, p: o.save("nonsense"), lowbit.InvalidArgumentError, ["mode"]),
    (lambda o, p: o.add_param(np.zeros(5, np.float32), state="3bit"), lowbit.InvalidArgumentError, ["state"]),
    (lambda o, p: o.add_param(np.zeros(5, np.float32), state=17), lowbit.InvalidArgumentError, ["state"]),
]


@pytest.mark.parametrize("case", range(len(FAILING_CALLS)))
def test_failed_call_raises_with_message_and_changes_nothing(case, rng):
    call, exc, words = FAILING_CALLS[case]
    opt, params, _ = _trained(rng=rng)
    with opt:
        snap = _snapshot(opt, params)
        with pytest.raises(exc) as info:
            call(opt, params)
        msg = info.value.message
        for w in words:
            assert w in msg, f"message {msg!r} lacks {w!r}"
        _assert_unchanged(opt, params, snap)
        opt.step()  # still usable


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(lr=-0.1), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(betas=(1.0, 0.9)), "beta1"),
        (dict(betas=(0.9, 1.5)), "beta2"),
        (dict(eps=-1e-8), "eps"),
        (dict(weight_decay=-0.01), "weight_decay"),
        (dict(state="7bit"), "state"),
        (dict(algorithm="no_such_algorithm"), "algorithm"),
        (dict(algorithm=99), "algorithm"),
    ],
)
def test_create_rejects_bad_config(kwargs, word):
    kwargs = dict(kwargs)
    algorithm = kwargs.pop("algorithm", "adamw")
    with pytest.raises(lowbit.InvalidArgumentError) as info:
        lowbit.Optimizer(algorithm, **kwargs)
    assert word in info.value.message


def test_nonfinite_lr_from_create_is_reported_by_the_library():
    with pytest.raises(lowbit.InvalidArgumentError) as info:
        lowbit.Optimizer("adamw", lr=float("inf"))
    assert info.value.function == "lowbit_optimizer_create" and "lr" in info.value.message


def test_step_without_params_is_invalid_state():
    with lowbit.Optimizer("adamw") as opt:
        with pytest.raises(lowbit.InvalidStateError) as info:
            opt.step()
        assert info.value.status == lowbit.Status.ERROR_INVALID_STATE and info.value.message


@pytest.mark.parametrize("ids", [[1.5], ["0"], [True], [np.False_], [0, 1.0], [None]], ids=repr)
def test_step_params_refuses_ids_that_are_not_integers(ids, rng):
    """Issue 45 (13): int() made 1.5 param 1 and "0" param 0."""
    opt, params, grads = _trained(rng=rng)
    with opt:
        snap = _snapshot(opt, params)
        bad = next(i for i in ids if type(i) is not int)
        with pytest.raises(TypeError, match=r"ids\[\d\] = " + re.escape(repr(bad)) + " is not an integer"):
            opt.step_params(ids, [grads[0]] * len(ids))
        with pytest.raises(TypeError, match="is not an integer"):
            opt.step_params(ids)  # the registered grads
        _assert_unchanged(opt, params, snap)
        assert opt.step_params([np.int64(1), 0])  # numpy integers are integers


def test_sgd_hparams_are_checked():
    with pytest.raises(lowbit.InvalidArgumentError, match="nesterov"):
        lowbit.Optimizer("sgd", momentum=0.0, nesterov=True)
    with pytest.raises(lowbit.InvalidArgumentError, match="momentum"):
        lowbit.Optimizer("sgd", momentum=1.5)


# ----------------------------------------------------------------- raw C calls


def _fn(name):
    return LIB.fn(name)


def test_raw_null_pointers():
    st = _fn("lowbit_optimizer_step")(ffi.NULL, ffi.NULL)
    assert st == lowbit.Status.ERROR_NULL_POINTER
    cfg = ffi.new("lowbit_optimizer_config_t *")
    hp = ffi.new("lowbit_hparams_t *")
    assert _fn("lowbit_optimizer_config_init_sized")(cfg, ffi.sizeof(cfg[0]), lowbit.Algorithm.ADAMW) == 0
    assert _fn("lowbit_hparams_init")(hp, lowbit.Algorithm.ADAMW) == 0
    st = _fn("lowbit_optimizer_create")(ffi.NULL, cfg, hp)
    assert st == lowbit.Status.ERROR_NULL_POINTER and lowbit._lib.last_error()
    h = ffi.new("lowbit_optimizer_t *")
    assert _fn("lowbit_optimizer_create")(h, ffi.NULL, hp) == lowbit.Status.ERROR_NULL_POINTER
    assert "config" in lowbit._lib.last_error()
    assert _fn("lowbit_optimizer_destroy")(ffi.NULL) == 0  # destroy accepts NULL
    assert _fn("lowbit_optimizer_last_error")(ffi.NULL) != ffi.NULL
    assert _fn("lowbit_build_info")(ffi.NULL) == lowbit.Status.ERROR_NULL_POINTER


def _copy_struct(ctype, src):
    dst = ffi.new(ctype)
    ffi.memmove(dst, src, ffi.sizeof(src[0]))
    return dst


def test_raw_unknown_struct_size_and_enum():
    cfg = ffi.new("lowbit_optimizer_config_t *")
    hp = ffi.new("lowbit_hparams_t *")
    _fn("lowbit_optimizer_config_init_sized")(cfg, ffi.sizeof(cfg[0]), lowbit.Algorithm.ADAMW)
    # The plain-named init is the 0.2 entry point: it fills the 0.2 struct (48 bytes).
    _fn("lowbit_hparams_init")(hp, lowbit.Algorithm.ADAMW)
    assert cfg.struct_size == ffi.sizeof(cfg[0]) and hp.struct_size == 48 < ffi.sizeof(hp[0])
    h = ffi.new("lowbit_optimizer_t *")
    create = _fn("lowbit_optimizer_create")
    for field, value in [("struct_size", 3), ("algorithm", 42), ("state_format", 42), ("device", 7)]:
        bad = _copy_struct("lowbit_optimizer_config_t *", cfg)
        setattr(bad, field, value)
        assert create(h, bad, hp) == lowbit.Status.ERROR_INVALID_ARGUMENT
        assert field in lowbit._lib.last_error() and h[0] == ffi.NULL
    info = ffi.new("lowbit_build_info_t *")
    info.struct_size = ffi.sizeof(info[0]) + 8
    assert _fn("lowbit_build_info")(info) == lowbit.Status.ERROR_INVALID_ARGUMENT
    assert "struct_size" in lowbit._lib.last_error()

    with lowbit.Optimizer("adamw") as opt:
        pc = ffi.new("lowbit_param_config_t *")
        _fn("lowbit_param_config_init_sized")(pc, ffi.sizeof(pc[0]))
        arr = np.zeros(8, np.float32)
        data = ffi.cast("void *", arr.ctypes.data)
        handle = ffi.cast("lowbit_optimizer_t", opt.handle)
        out = ffi.new("int64_t *", -1)
        pc.param = {"data": data, "numel": 8, "dtype": 77, "device": lowbit.Device.CPU, "device_index": 0}
        st = _fn("lowbit_optimizer_add_param")(handle, pc, out)
        assert st == lowbit.Status.ERROR_INVALID_ARGUMENT
        assert "dtype" in lowbit._lib.last_error(opt.handle)
        pc.param = {"data": ffi.NULL, "numel": 8, "dtype": lowbit.Dtype.FLOAT32, "device": lowbit.Device.CPU}
        st = _fn("lowbit_optimizer_add_param")(handle, pc, out)
        assert st == lowbit.Status.ERROR_NULL_POINTER
        pc.param = {"data": data, "numel": 8, "dtype": lowbit.Dtype.FLOAT32, "device": lowbit.Device.CPU}
        pc.struct_size = 5
        st = _fn("lowbit_optimizer_add_param")(handle, pc, out)
        assert st == lowbit.Status.ERROR_INVALID_ARGUMENT
        assert "struct_size" in lowbit._lib.last_error(handle)
        assert opt.num_params == 0
        got = ffi.new("int32_t *", -1)
        assert _fn("lowbit_optimizer_last_step_skipped")(handle, got) == 0 and got[0] == 0


# ----------------------------------------------------------------- lifetime


def test_context_manager_closes_and_closed_handle_is_invalid_state():
    with lowbit.Optimizer("adamw") as opt:
        assert not opt.closed
    assert opt.closed
    with pytest.raises(lowbit.InvalidStateError, match="closed"):
        opt.step()
    with pytest.raises(lowbit.InvalidStateError):
        opt.handle
    opt.close()  # idempotent
    assert "closed" in repr(opt)


def test_garbage_collection_frees_the_handle(monkeypatch):
    freed = []
    import lowbit._optimizer as mod

    real = mod._destroy
    monkeypatch.setattr(mod, "_destroy", lambda h: (freed.append(h), real(h)))
    opt = lowbit.Optimizer("adamw")
    handle = opt.handle
    ref = weakref.ref(opt)
    del opt
    gc.collect()
    assert ref() is None
    assert freed == [handle]


def test_close_frees_exactly_once(monkeypatch):
    freed = []
    import lowbit._optimizer as mod

    real = mod._destroy
    monkeypatch.setattr(mod, "_destroy", lambda h: (freed.append(h), real(h)))
    opt = lowbit.Optimizer("adamw")
    h = opt.handle
    opt.close()
    opt.close()
    del opt
    gc.collect()
    assert freed == [h]


def test_registered_arrays_stay_alive_while_registered():
    opt = lowbit.Optimizer("sgd", lr=1.0)
    p = np.ones(1000, np.float32)
    g = np.ones(1000, np.float32)
    pref, gref = weakref.ref(p), weakref.ref(g)
    opt.add_param(p, g)
    del p, g
    gc.collect()
    assert pref() is not None and gref() is not None  # the optimizer holds them
    opt.step()
    assert np.all(opt.param(0) == 0.0)
    opt.close()
    gc.collect()
    assert pref() is None and gref() is None  # released with the handle

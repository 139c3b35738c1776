"""Arrays crossing into the library: what is accepted (numpy, DLPack,
__cuda_array_interface__) and every rejection (wrong dtype, wrong device,
non-contiguous, read-only, unknown objects), which must never copy."""

import numpy as np
import pytest

import lowbit
from lowbit import ArrayError, Device
from lowbit._arrays import as_array_ref


@pytest.fixture
def opt():
    with lowbit.Optimizer("sgd", lr=0.5) as o:
        yield o


class DLPackOnly:
    """Exposes an array through DLPack alone (as torch/cupy/jax objects do)."""

    def __init__(self, arr, device=None):
        self.arr = arr
        self.device = device
        self.exported = 0

    def __dlpack__(self, **kwargs):
        self.exported += 1
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device if self.device is not None else self.arr.__dlpack_device__()


class FakeCudaArray:
    """A __cuda_array_interface__ object (numba style); never dereferenced."""

    def __init__(self, shape=(16,), typestr="<f4", strides=None, readonly=False, ptr=0x7F0000001000):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, readonly), "strides": strides, "version": 3,
        }


# ----------------------------------------------------------------- accepted


def test_numpy_param_is_updated_in_place(opt):
    p = np.ones(8, np.float32)
    g = np.full(8, 2.0, np.float32)
    opt.add_param(p, g)
    opt.step()
    np.testing.assert_array_equal(p, np.zeros(8, np.float32))


def test_dlpack_object_is_used_without_a_copy(opt):
    base = np.ones(8, np.float32)
    wrapped = DLPackOnly(base)
    grad = DLPackOnly(np.full(8, 2.0, np.float32))
    opt.add_param(wrapped, grad)
    assert wrapped.exported == 1
    opt.step()
    np.testing.assert_array_equal(base, np.zeros(8, np.float32))  # the producer's own memory changed


def test_read_only_grad_is_accepted_because_it_is_only_read(opt):
    p = np.ones(4, np.float32)
    g = np.full(4, 2.0, np.float32)
    g.setflags(write=False)
    opt.add_param(p, g)
    opt.step()
    np.testing.assert_array_equal(p, np.zeros(4, np.float32))


def test_multidimensional_and_zero_stride_singleton_dims(opt):
    p = np.ones((2, 1, 3), np.float32)
    opt.add_param(p)
    q = np.ones((4, 4), np.float32)[1:2]  # a contiguous slice
    opt.add_param(q)
    assert opt.num_params == 2


# ----------------------------------------------------------------- rejected: dtype


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int8, np.complex64, np.bool_])
def test_wrong_numpy_dtype(opt, dtype):
    with pytest.raises(ArrayError, match=f"param: numpy dtype {np.dtype(dtype)}"):
        opt.add_param(np.zeros(8, dtype))
    assert opt.num_params == 0


def test_float64_message_explains_no_conversion(opt):
    with pytest.raises(ArrayError, match="float64 is not supported.*never converts"):
        opt.add_param(np.zeros(8))


def test_wrong_grad_dtype(opt):
    with pytest.raises(ArrayError, match="grad: numpy dtype float64"):
        opt.add_param(np.zeros(8, np.float32), np.zeros(8))
    with pytest.raises(ArrayError, match=r"grads\[0\]: numpy dtype int64"):
        opt.add_param(np.zeros(8, np.float32))
        opt.step([np.zeros(8, np.int64)])


def test_uint16_needs_an_explicit_dtype(opt):
    bits = np.zeros(8, np.uint16)
    with pytest.raises(ArrayError, match="uint16 array is only accepted.*dtype='bfloat16'"):
        opt.add_param(bits)
    with pytest.raises(ArrayError, match="uint16 array is only accepted"):
        opt.add_param(bits, dtype="float32")
    assert opt.add_param(bits, dtype="float16") == 0
    assert opt.param_info(0).param_dtype == "float16"


def test_explicit_dtype_must_match_the_array(opt):
    with pytest.raises(ArrayError, match="dtype=bfloat16 was requested but the array is float32"):
        opt.add_param(np.zeros(8, np.float32), dtype="bfloat16")
    with pytest.raises(ArrayError, match="is not one of"):
        opt.add_param(np.zeros(8, np.float32), dtype="int8")


def test_wrong_dtype_through_dlpack(opt):
    with pytest.raises(ArrayError, match="dtype int32 is not float32, float16 or bfloat16"):
        opt.add_param(DLPackOnly(np.zeros(8, np.int32)))
    with pytest.raises(ArrayError, match="dtype float64"):
        opt.add_param(DLPackOnly(np.zeros(8)))


# ----------------------------------------------------------------- rejected: layout


def test_non_contiguous_numpy(opt):
    base = np.zeros(16, np.float32)
    with pytest.raises(ArrayError, match="param: the array is not C-contiguous"):
        opt.add_param(base[::2])
    with pytest.raises(ArrayError, match="not C-contiguous"):
        opt.add_param(np.zeros((4, 4), np.float32).T)
    with pytest.raises(ArrayError, match="grad: the array is not C-contiguous"):
        opt.add_param(np.zeros(8, np.float32), base[::2])
    assert opt.num_params == 0


def test_non_contiguous_dlpack(opt):
    with pytest.raises(ArrayError, match="is not contiguous"):
        opt.add_param(DLPackOnly(np.zeros(16, np.float32)[::2]))


def test_unaligned_numpy(opt):
    raw = np.zeros(40, np.uint8)
    unaligned = raw[1:33].view(np.float32)
    assert not unaligned.flags.aligned
    with pytest.raises(ArrayError, match="not aligned"):
        opt.add_param(unaligned)


# ----------------------------------------------------------------- rejected: read-only


def test_read_only_numpy_param(opt):
    p = np.zeros(8, np.float32)
    p.setflags(write=False)
    with pytest.raises(ArrayError, match="param: the array is read-only, but lowbit updates it in place"):
        opt.add_param(p)


def test_read_only_dlpack_param(opt):
    p = np.zeros(8, np.float32)
    p.setflags(write=False)
    with pytest.raises(ArrayError, match="read-only"):
        opt.add_param(DLPackOnly(p))


def test_read_only_cuda_array_interface_param():
    with pytest.raises(ArrayError, match="read-only"):
        as_array_ref(FakeCudaArray(readonly=True), role="param", writable=True, device=Device.CUDA,
                     device_index=0)


def test_jax_like_arrays_are_immutable(opt):
    class Immutable(DLPackOnly):
        pass

    Immutable.__module__ = "jaxlib.xla_extension"
    with pytest.raises(ArrayError, match="immutable"):
        opt.add_param(Immutable(np.zeros(8, np.float32)))


# ----------------------------------------------------------------- rejected: device


def test_cuda_array_for_a_cpu_optimizer(opt):
    with pytest.raises(ArrayError, match="is on cuda:0 but the optimizer is on cpu"):
        opt.add_param(FakeCudaArray())


def test_dlpack_cuda_device_is_rejected_before_export(opt):
    fake = DLPackOnly(np.zeros(8, np.float32), device=(2, 1))  # kDLCUDA, device 1
    with pytest.raises(ArrayError, match="is on cuda:1 but the optimizer is on cpu"):
        opt.add_param(fake)
    assert fake.exported == 0


def test_unknown_dlpack_device(opt):
    with pytest.raises(ArrayError, match="is on opencl:0; lowbit supports cpu and cuda"):
        opt.add_param(DLPackOnly(np.zeros(8, np.float32), device=(4, 0)))


def test_numpy_for_a_cuda_optimizer():
    with pytest.raises(ArrayError, match="numpy array is on cpu but the optimizer is on cuda:0"):
        as_array_ref(np.zeros(8, np.float32), role="param", writable=True, device=Device.CUDA, device_index=0)


def test_cuda_array_on_another_device(monkeypatch):
    from lowbit import _cuda

    monkeypatch.setattr(_cuda, "pointer_device", lambda ptr: 0)  # what the driver would answer
    with pytest.raises(ArrayError, match="is on cuda:0 but the optimizer is on cuda:1"):
        as_array_ref(FakeCudaArray(), role="param", writable=True, device=Device.CUDA, device_index=1)


def test_cuda_array_interface_layout_checks():
    ok = as_array_ref(FakeCudaArray(shape=(4, 4)), role="param", writable=True, device=Device.CUDA, device_index=0)
    assert ok.numel == 16 and ok.tensor.device == Device.CUDA and ok.dtype == lowbit.Dtype.FLOAT32
    with pytest.raises(ArrayError, match="not contiguous"):
        as_array_ref(FakeCudaArray(shape=(4, 4), strides=(4, 16)), role="param", writable=True,
                     device=Device.CUDA, device_index=0)
    with pytest.raises(ArrayError, match="typestr '<f8'"):
        as_array_ref(FakeCudaArray(typestr="<f8"), role="param", writable=True, device=Device.CUDA, device_index=0)
    bf = as_array_ref(FakeCudaArray(typestr="<u2"), role="param", writable=True, dtype="bfloat16",
                      device=Device.CUDA, device_index=0)
    assert bf.dtype == lowbit.Dtype.BFLOAT16


def test_cuda_optimizer_where_cuda_is_not_available():
    """Without CUDA support built in: UnsupportedError; built with CUDA but no
    usable device: CudaError naming the device."""
    try:
        o = lowbit.Optimizer("adamw", device="cuda")
    except lowbit.UnsupportedError as e:
        assert not lowbit.has_cuda()
        assert "cuda" in e.message.lower()
    except lowbit.CudaError as e:
        assert lowbit.has_cuda()
        assert "device" in e.message
    else:
        o.close()
        pytest.skip("a CUDA device is present")


def test_bad_device_strings():
    for bad in ("gpu", "cuda:x", "tpu:0"):
        with pytest.raises((lowbit.InvalidArgumentError, ValueError)):
            lowbit.Optimizer("adamw", device=bad)


# ----------------------------------------------------------------- rejected: not an array


@pytest.mark.parametrize("obj", [[1.0, 2.0], (1.0,), 3.0, np.float32(1.0), "abc", b"\0\0\0\0", None])
def test_objects_that_are_not_arrays(opt, obj):
    with pytest.raises(ArrayError, match="param:"):
        opt.add_param(obj)


def test_grad_size_must_match(opt):
    with pytest.raises(ArrayError, match="grad: has 7 elements but param has 8"):
        opt.add_param(np.zeros(8, np.float32), np.zeros(7, np.float32))
    opt.add_param(np.zeros(8, np.float32))
    with pytest.raises(ArrayError, match=r"grads\[0\]: has 9 elements but param 0 has 8"):
        opt.step([np.zeros(9, np.float32)])
    with pytest.raises(lowbit.InvalidArgumentError, match="got 2 gradients for 1 registered params"):
        opt.step([None, None])


# ----------------------------------------------------------------- torch through the generic API

def test_torch_cpu_tensor_through_dlpack(opt):
    torch = pytest.importorskip("torch")
    p = torch.ones(6)
    opt.add_param(p, torch.full((6,), 2.0))
    opt.step()
    assert torch.equal(p, torch.zeros(6))
    with pytest.raises(ArrayError, match="(?i)grad"):  # torch refuses to export tensors that require grad
        opt.add_param(torch.zeros(3, requires_grad=True))
    with pytest.raises(ArrayError, match="not contiguous"):
        opt.add_param(torch.zeros(4, 4).t())
    with pytest.raises(ArrayError, match="dtype float64"):
        opt.add_param(torch.zeros(4, dtype=torch.float64))
    bf = torch.ones(4, dtype=torch.bfloat16)
    opt.add_param(bf, torch.ones(4, dtype=torch.bfloat16))
    assert opt.param_info(opt.num_params - 1).param_dtype == "bfloat16"


# ----------------------------------------------------------------- step(grads): descriptors reused (issue 45, 15)


def _twins(rng, n=300, k=3):
    """Two sgd-with-momentum optimizers over the same params: `fast` steps
    the grads it is given (descriptors reused across calls), `ref` copies of
    them (fresh arrays: described at every call)."""
    params = [rng.standard_normal(n).astype(np.float32) for _ in range(k)]
    fast, ref = lowbit.Optimizer("sgd", lr=0.1, momentum=0.9), lowbit.Optimizer("sgd", lr=0.1, momentum=0.9)
    mine, theirs = [p.copy() for p in params], [p.copy() for p in params]
    for a, b in zip(mine, theirs):
        fast.add_param(a)
        ref.add_param(b)
    return fast, ref, mine, theirs


def _step_both(fast, ref, grads, mine, theirs):
    fast.step(grads)
    ref.step([None if g is None else g.clone() if hasattr(g, "clone") else g.copy() for g in grads])
    for a, b in zip(mine, theirs):
        assert np.array_equal(a, b)


def test_step_grads_reuses_a_descriptor_only_for_the_same_unchanged_array(rng):
    fast, ref, mine, theirs = _twins(rng)
    grads = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
    with fast, ref:
        for t in range(8):
            for g in grads:
                if g is not None:
                    g[...] = rng.standard_normal(g.shape)  # new values in the same memory: the descriptor holds
            if t == 2:
                grads[1] = rng.standard_normal(300).astype(np.float32)  # another array
            if t == 3:
                grads[2].shape = (20, 15)  # the same memory, another shape: described again
            if t == 4:
                grads[0] = None  # sits this step out
            if t == 5:
                grads[0] = rng.standard_normal(300).astype(np.float32)
            if t == 6:
                g = grads[1]
                grads[1] = None
                del g  # its id may be reused by the next array: the weak reference says it is another
                grads[1] = rng.standard_normal(300).astype(np.float32)
            _step_both(fast, ref, grads, mine, theirs)
        assert fast.param_info(0).step == 7 and fast.param_info(1).step == 8


def test_step_grads_describes_again_a_torch_tensor_whose_storage_moved(rng):
    torch = pytest.importorskip("torch")
    fast, ref, mine, theirs = _twins(rng)
    grads = [torch.randn(300) for _ in range(3)]
    with fast, ref:
        _step_both(fast, ref, grads, mine, theirs)
        grads[1].data = torch.randn(300)  # the described storage is freed: a stale descriptor would read it
        _step_both(fast, ref, grads, mine, theirs)
        grads[2].set_(torch.randn(300))  # another storage under the same tensor object
        _step_both(fast, ref, grads, mine, theirs)
        _step_both(fast, ref, grads, mine, theirs)


def test_step_grads_keeps_no_array_alive_and_a_refused_call_changes_nothing(rng):
    import gc
    import weakref

    fast, ref, mine, theirs = _twins(rng)
    with fast, ref:
        g = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
        _step_both(fast, ref, g, mine, theirs)
        watch = weakref.ref(g[0])
        g[0] = rng.standard_normal(300).astype(np.float32)
        gc.collect()
        assert watch() is None  # the reused descriptor's record holds only a weak reference
        before = ([p.copy() for p in mine], fast.save())
        with pytest.raises(ArrayError, match=r"grads\[1\]: has 299 elements but param 1 has 300"):
            fast.step([g[0], np.zeros(299, np.float32), g[2]])
        with pytest.raises(ArrayError, match=r"grads\[2\]"):
            fast.step([g[0], g[1], g[2][::2]])  # not contiguous
        assert all(np.array_equal(a, b) for a, b in zip(mine, before[0])) and fast.save() == before[1]
        _step_both(fast, ref, g, mine, theirs)  # and the descriptors of the good arrays are still right

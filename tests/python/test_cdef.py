"""The declarations the package reads (lowbit_cdef.h, generated from the public
headers by bindings/gen_cdef.py) and their pairing with the library.

* the loaded declarations are the ones the loaded library was built with (the
  fingerprint it reports), and the headers of this checkout still give the
  same declarations (a header edited without rebuilding fails here);
* an edited, foreign (another build's) or missing lowbit_cdef.h is refused at
  import with a message naming the files;
* the struct layouts CFFI computes are the C compiler's (sizeof / offsetof),
  every declared function is exported, and the Python enums are the header's;
* the generator itself: integer macros, what CFFI's cdef cannot take is dropped.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lowbit
from lowbit import _ffi
from lowbit._ffi import ffi, lib

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "bindings" / "gen_cdef.py"
PACKAGE_PARENT = str(Path(lowbit.__file__).resolve().parents[1])


def _gen():
    if not GEN.exists():
        pytest.skip("bindings/gen_cdef.py is not here (installed package without a checkout)")
    spec = importlib.util.spec_from_file_location("gen_cdef", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cc():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    return cc


def _include_dirs():
    """The checkout's headers and the build's generated lowbit_version.h
    (beside the library in a build tree, or the package's include/)."""
    libdir = Path(_ffi.library_path).parent
    dirs = [ROOT / "capi", libdir / "include", Path(lowbit.__file__).parent / "include"]
    return [str(d) for d in dirs if d.is_dir()]


# ----------------------------------------------------------------- pairing


def test_loaded_declarations_are_the_libraries():
    info = lowbit.build_info()
    assert info["cdef_fingerprint"] == _ffi.cdef_fingerprint and len(info["cdef_fingerprint"]) == 64
    assert Path(info["cdef"]).name == "lowbit_cdef.h"
    assert Path(info["cdef"]).resolve().parent == Path(info["library"]).resolve().parent or \
        "share" in Path(info["cdef"]).parts
    fp, body = _ffi.read_cdef(info["cdef"])
    assert fp == info["cdef_fingerprint"]
    assert _ffi.HEADER_VERSION == tuple(int(x) for x in lowbit.version().split("."))


def test_checkout_headers_give_the_loaded_declarations():
    """A header changed since the library was built (or a generator change)
    shows up here: rebuild (cmake --build) to regenerate lowbit_cdef.h."""
    gen = _gen()
    if not (ROOT / "capi" / "lowbit.h").exists():
        pytest.skip("no capi/ headers here")
    text, fp = gen.build([_cc()], [], _include_dirs(), [str(ROOT / "capi" / "lowbit.h"),
                                                        str(ROOT / "capi" / "lowbit_comm.h")])
    assert fp == _ffi.cdef_fingerprint, (
        f"capi/*.h of this checkout no longer give {_ffi.cdef_path}: the library at {_ffi.library_path} was built "
        "from other headers; rebuild it")
    assert gen.split_cdef(text) == _ffi.read_cdef(_ffi.cdef_path)


def _import_in(tmp_path, cdef_text=None, copy_library=False):
    """`import lowbit` in a fresh interpreter with LOWBIT_LIBRARY in tmp_path
    (a symlink to, or a copy of, the library) beside `cdef_text`."""
    libpath = tmp_path / "liblowbit.so"
    if copy_library:
        shutil.copy2(os.path.realpath(_ffi.library_path), libpath)
    else:
        libpath.symlink_to(os.path.realpath(_ffi.library_path))
    if cdef_text is not None:
        (tmp_path / "lowbit_cdef.h").write_text(cdef_text)
    env = dict(os.environ, LOWBIT_LIBRARY=str(libpath), PYTHONPATH=PACKAGE_PARENT)
    return subprocess.run([sys.executable, "-c", "import lowbit; print(lowbit.build_info()['cdef'])"],
                          capture_output=True, text=True, env=env, timeout=120)


def _cdef_text():
    return Path(_ffi.cdef_path).read_text()


def test_the_declarations_beside_the_library_are_used(tmp_path):
    proc = _import_in(tmp_path, _cdef_text())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "lowbit_cdef.h")


def test_an_edited_cdef_is_refused(tmp_path):
    text = _cdef_text().replace("int64_t numel;", "int32_t numel;", 1)
    assert text != _cdef_text()
    proc = _import_in(tmp_path, text)
    assert proc.returncode != 0
    assert "LibraryNotFoundError" in proc.stderr and "changed after it was generated" in proc.stderr
    assert str(tmp_path / "lowbit_cdef.h") in proc.stderr


def test_another_builds_cdef_is_refused(tmp_path):
    """Well-formed declarations (their own fingerprint checks out) that are not
    the ones the library was built with: a stale build tree, a copied library."""
    gen = _gen()
    _fp, body = gen.split_cdef(_cdef_text())
    body = body.replace("int64_t numel;", "int32_t numel;", 1)
    fp = gen.fingerprint_of(body)
    head = _cdef_text().partition(gen.BODY_MARKER)[0].replace(_fp, fp)
    proc = _import_in(tmp_path, head + gen.BODY_MARKER + body)
    assert proc.returncode != 0
    assert "is not the declarations" in proc.stderr and fp[:16] in proc.stderr and _fp[:16] in proc.stderr
    assert "rebuild" in proc.stderr


def test_a_library_without_declarations_is_refused(tmp_path):
    proc = _import_in(tmp_path, None, copy_library=True)
    assert proc.returncode != 0
    assert "lowbit_cdef.h) were not found" in proc.stderr and str(tmp_path) in proc.stderr


# ----------------------------------------------------------------- the declarations themselves


def _struct_typedefs():
    return sorted(t for t in ffi.list_types()[0] if ffi.typeof(t).kind == "struct")


def test_struct_layouts_are_the_c_compilers(tmp_path):
    cc = _cc()
    incs = _include_dirs()
    if not any((Path(d) / "lowbit.h").exists() for d in incs):
        pytest.skip("the public headers are not here")
    structs = _struct_typedefs()
    assert {"lowbit_tensor_t", "lowbit_hparams_t", "lowbit_optimizer_config_t", "lowbit_param_config_t",
            "lowbit_build_info_t", "lowbit_comm_info_t"} <= set(structs)
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "lowbit.h"', '#include "lowbit_comm.h"',
             "int main(void) {"]
    want = []
    for s in structs:
        lines.append(f'  printf("%zu\\n", sizeof({s}));')
        want.append(ffi.sizeof(s))
        for name, field in ffi.typeof(s).fields:
            lines.append(f'  printf("%zu\\n", offsetof({s}, {name}));')
            want.append(field.offset)
    lines += ["  return 0;", "}"]
    src = tmp_path / "layouts.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layouts"
    subprocess.run([cc, str(src), "-o", str(exe)] + [f"-I{d}" for d in incs], check=True, capture_output=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == want


def test_every_declared_function_is_exported():
    names = [n for n in dir(lib) if n.startswith("lowbit_")]
    functions = [n for n in names if callable(getattr(lib, n))]
    assert len(functions) >= 50 and "lowbit_build_info" in functions and "lowbit_comm_get_stats" in functions
    for name in functions:
        assert lowbit._lib.LIB.fn(name) is not None


def test_enums_are_the_headers():
    for cname, cls in _ffi.ENUMS.items():
        rel = ffi.typeof(cname).relements
        assert {int(v) for v in cls} == set(rel.values())
        for cn, value in rel.items():
            assert getattr(lib, cn) == value
    assert lowbit.StateFormat.BIT8 == lib.LOWBIT_STATE_8BIT and lowbit.StateFormat.BIT4 == lib.LOWBIT_STATE_4BIT
    assert lowbit.Status.SUCCESS == 0 and lowbit.Status.ERROR_INTERNAL == lib.LOWBIT_ERROR_INTERNAL
    assert lowbit.CommCudaAware.AUTO == -1 and lowbit.Dtype.BFLOAT16 == lib.LOWBIT_DTYPE_BFLOAT16
    assert list(lowbit.Device)[-2:] == [lowbit.Device.FORCE_INT32, lowbit.Device.FORCE_INT32_MIN]
    assert _ffi.python_member_name("LOWBIT_STATE_8BIT", "LOWBIT_STATE_") == "BIT8"
    assert lowbit.InvalidArgumentError.status is lowbit.Status.ERROR_INVALID_ARGUMENT
    assert _ffi.NCCL_UNIQUE_ID_BYTES == 128


def test_tensor_views_have_the_declared_layout():
    """The ctypes view (for lowbit.torch's descriptor arrays) and the numpy
    record view (TensorArray) are laid out as the declared lowbit_tensor_t."""
    import ctypes

    from lowbit._arrays import TENSOR_RECORD, TensorArray

    assert ctypes.sizeof(_ffi.Tensor) == ffi.sizeof("lowbit_tensor_t") == TENSOR_RECORD.itemsize
    for name, field in ffi.typeof("lowbit_tensor_t").fields:
        assert getattr(_ffi.Tensor, name).offset == field.offset == TENSOR_RECORD.fields[name][1]
    arr = TensorArray(3)
    arr.records["numel"] = [5, 6, 7]
    arr.records["data"] = 4096
    assert [arr.cdata[i].numel for i in range(3)] == [5, 6, 7]
    assert int(ffi.cast("uintptr_t", arr.cdata[2].data)) == 4096
    arr.clear(2)
    assert arr.cdata[2].data == ffi.NULL


# ----------------------------------------------------------------- the generator


def test_integer_macro_values():
    gen = _gen()
    v = gen.c_integer_value
    assert v("(0 * 10000 + 2 * 100 + 1)") == 201
    assert v("0x7FFFFFFF") == 0x7FFFFFFF and v("-0x7FFFFFFF") == -0x7FFFFFFF
    assert v("(1u << 4)") == 16 and v("128UL") == 128 and v("010") == 8
    assert v("-7 / 2") == -3 and v("-7 % 2") == -1  # C truncates toward zero
    assert v('"text"') is None and v("") is None and v("sizeof(int)") is None and v("1.5") is None


def test_generator_keeps_what_cdef_takes(tmp_path):
    gen = _gen()
    header = tmp_path / "demo.h"
    header.write_text(
        "#include <stdint.h>\n#include <stddef.h>\n"
        "#define LOWBIT_DEMO_A 3\n#define LOWBIT_DEMO_B (LOWBIT_DEMO_A * 4 + 1)\n"
        '#define LOWBIT_DEMO_S "text"\n#define LOWBIT_DEMO_F(x) (x)\n#define OTHER_PREFIX 9\n'
        "#define LOWBIT_DEMO_API __attribute__((visibility(\"default\")))\n"
        "typedef enum demo_e { DEMO_X = 1, DEMO_Y = -0x7FFFFFFF } demo_e_t;\n"
        "typedef struct demo_s { size_t struct_size; int64_t v[2]; demo_e_t e; } demo_s_t;\n"
        "_Static_assert(sizeof(int) == 4, \"int\");\n"
        "static inline int demo_helper(int x) { return x + 1; }\n"
        "LOWBIT_DEMO_API int demo_fn(const demo_s_t* s, void* p);\n")
    text, fp = gen.build([_cc()], [], [], [str(header)])
    _fp, body = gen.split_cdef(text)
    assert _fp == fp == gen.fingerprint_of(body)
    assert "#define LOWBIT_DEMO_A 3\n" in body and "#define LOWBIT_DEMO_B 13\n" in body
    for absent in ("LOWBIT_DEMO_S", "LOWBIT_DEMO_F", "OTHER_PREFIX", "demo_helper", "_Static_assert",
                   "__attribute__", "LOWBIT_DEMO_API"):
        assert absent not in body
    f = __import__("cffi").FFI()
    f.cdef(body)
    assert f.sizeof("demo_s_t") == 32 and f.typeof("demo_e_t").relements["DEMO_Y"] == -0x7FFFFFFF


def test_generator_reports_a_bad_header(tmp_path):
    header = tmp_path / "bad.h"
    header.write_text('#include "does_not_exist.h"\n')
    proc = subprocess.run([sys.executable, str(_gen().__file__), "--cc", _cc(), "--out", str(tmp_path / "x.h"),
                           str(header)], capture_output=True, text=True)
    assert proc.returncode != 0 and "preprocessor" in proc.stderr and "does_not_exist.h" in proc.stderr
    assert not (tmp_path / "x.h").exists()

"""The ctypes declarations (lowbit/_capi.py) against the public headers.

Parses capi/lowbit.h and capi/lowbit_comm.h and fails if any function, struct,
enum, handle or integer macro is missing on either side or differs (types,
order, values). Then compiles a C program against the headers that prints
every struct's size and field offsets and every enum constant, and compares
them with the ctypes layouts, and checks that the loaded library exports every
declared function.
"""

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lowbit import _capi
from lowbit._lib import LIB

ROOT = Path(__file__).resolve().parents[2]


def _header_dir() -> Path:
    """The headers of this checkout; for an installed package without a
    checkout, the copies installed inside the package."""
    if (ROOT / "capi" / "lowbit.h").exists():
        return ROOT / "capi"
    return Path(_capi.__file__).parent / "include"


HEADER_DIR = _header_dir()


def _generated_include_dirs():
    """Where the build wrote lowbit_version.h (next to the headers of an
    installed package, or <build>/include next to LOWBIT_LIBRARY)."""
    dirs = [HEADER_DIR]
    lib = os.environ.get("LOWBIT_LIBRARY")
    if lib:
        dirs.append(Path(lib).resolve().parent / "include")
    return [str(d) for d in dirs if (Path(d) / "lowbit_version.h").exists()]


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return text


def _norm_type(t: str) -> str:
    t = re.sub(r"\s+", " ", t).strip()
    t = re.sub(r"\s*\*", "*", t)
    return t


def parse_header(path: Path) -> dict:
    raw = path.read_text()
    macros = {}
    for m in re.finditer(r"^\s*#\s*define\s+(LOWBIT_\w+)\s+(-?(?:0x[0-9a-fA-F]+|\d+))\s*$", _strip(raw), flags=re.M):
        macros[m.group(1)] = int(m.group(2), 0)
    text = "\n".join(line for line in _strip(raw).splitlines() if not line.lstrip().startswith("#"))
    text = re.sub(r'extern\s+"C"\s*\{', " ", text)

    enums = {}
    for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        members, value = {}, -1
        for item in m.group(1).split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                name, expr = (x.strip() for x in item.split("=", 1))
                value = int(expr, 0)
            else:
                name, value = item, value + 1
            members[name] = value
        enums[m.group(2)] = members

    structs = {}
    for m in re.finditer(r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        fields = []
        for decl in m.group(1).split(";"):
            decl = decl.strip()
            if not decl:
                continue
            fm = re.match(r"(.*?)(\w+)\s*(\[\d+\])?$", decl, flags=re.S)
            fields.append((_norm_type(fm.group(1)) + (fm.group(3) or ""), fm.group(2)))
        structs[m.group(2)] = fields

    handles = [m.group(2) for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\*\s*(\w+)\s*;", text)]

    functions = {}
    for m in re.finditer(r"LOWBIT_API\s+([^;()]*?)\s*\b(\w+)\s*\(([^)]*)\)\s*;", text, flags=re.S):
        ret, name, args = _norm_type(m.group(1)), m.group(2), m.group(3).strip()
        params = []
        if args and args != "void":
            for a in args.split(","):
                am = re.match(r"(.*?)(\w+)$", a.strip(), flags=re.S)
                params.append(_norm_type(am.group(1)))
        functions[name] = (ret, params)
    return {"enums": enums, "structs": structs, "handles": handles, "functions": functions, "macros": macros}


HEADERS = sorted(_capi.HEADERS)


@pytest.fixture(scope="module", params=HEADERS)
def header(request):
    path = HEADER_DIR / request.param
    if not path.exists():
        # A header the bindings declare must exist; lowbit.h always does.
        pytest.fail(f"{path} does not exist but lowbit/_capi.py declares its contents")
    return request.param, parse_header(path)


def test_every_header_is_covered():
    """A new public header must get declarations too."""
    on_disk = sorted(p.name for p in HEADER_DIR.glob("lowbit*.h"))
    assert on_disk == HEADERS, f"headers {on_disk} vs declared {HEADERS}"


def test_functions(header):
    name, parsed = header
    declared = {n: _capi.FUNCTION_DECLS[n] for n in _capi.HEADERS[name]["functions"]}
    missing = sorted(set(parsed["functions"]) - set(declared))
    extra = sorted(set(declared) - set(parsed["functions"]))
    assert not missing, f"{name}: functions not declared in lowbit/_capi.py: {missing}"
    assert not extra, f"{name}: lowbit/_capi.py declares functions the header lacks: {extra}"
    for fn, (ret, params) in parsed["functions"].items():
        got = (declared[fn][0], list(declared[fn][1]))
        assert got == (ret, params), f"{fn}: header says {ret}({', '.join(params)}), _capi says {got}"


def test_structs(header):
    name, parsed = header
    declared = {n: _capi.STRUCT_DECLS[n] for n in _capi.HEADERS[name]["structs"]}
    assert sorted(parsed["structs"]) == sorted(declared), f"{name}: structs differ"
    for s, fields in parsed["structs"].items():
        assert fields == [(_norm_type(t), f) for t, f in declared[s]], f"{s}: fields differ"


def test_enums(header):
    name, parsed = header
    declared = _capi.HEADERS[name]["enums"]
    assert sorted(parsed["enums"]) == sorted(declared), f"{name}: enums differ"
    for e, members in parsed["enums"].items():
        py_enum, prefix, renames = _capi.ENUMS[e]
        expected = {}
        for c_name, value in members.items():
            assert c_name.startswith(prefix), f"{c_name} lacks the prefix {prefix}"
            suffix = c_name[len(prefix):]
            expected[renames.get(suffix, suffix)] = value
        got = {m.name: m.value for m in py_enum}
        assert got == expected, f"{e}: header {expected} vs Python {got}"


def test_handles_and_macros(header):
    name, parsed = header
    assert sorted(parsed["handles"]) == sorted(_capi.HEADERS[name]["handles"])
    assert parsed["macros"] == {k: _capi.MACROS[k] for k in _capi.HEADERS[name]["macros"]}


def test_ctypes_mapping_is_consistent():
    """FUNCTIONS (what ctypes uses) is derived from FUNCTION_DECLS."""
    for name, (ret, params) in _capi.FUNCTION_DECLS.items():
        restype, argtypes = _capi.FUNCTIONS[name]
        assert restype is _capi.ctype_of(ret)
        assert [a for a in argtypes] == [_capi.ctype_of(p) for p in params]


def _compile_layout_probe(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to check struct layouts with")
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += [f'#include "{h}"' for h in HEADERS]
    lines += ["int main(void) {"]
    for s, fields in _capi.STRUCT_DECLS.items():
        lines.append(f'  printf("size {s} %zu\\n", sizeof({s}));')
        for _t, f in fields:
            lines.append(f'  printf("offset {s}.{f} %zu\\n", offsetof({s}, {f}));')
    for e, (py_enum, prefix, renames) in _capi.ENUMS.items():
        lines.append(f'  printf("size {e} %zu\\n", sizeof({e}));')
        back = {v: k for k, v in renames.items()}
        for m in py_enum:
            c_name = prefix + back.get(m.name, m.name)
            lines.append(f'  printf("value {c_name} %lld\\n", (long long){c_name});')
    lines += ["  return 0;", "}"]
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "probe"
    include = ["-I", str(HEADER_DIR)] + [f"-I{d}" for d in _generated_include_dirs()]
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", *include, str(src), "-o", str(exe)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    facts = {}
    for line in out.splitlines():
        kind, key, value = line.split()
        facts[(kind, key)] = int(value)
    return facts


def test_layouts_match_the_c_compiler(tmp_path):
    facts = _compile_layout_probe(tmp_path)
    for s, fields in _capi.STRUCT_DECLS.items():
        cls = _capi.ctype_of(s)
        assert ctypes.sizeof(cls) == facts[("size", s)], f"sizeof({s})"
        for _t, f in fields:
            assert getattr(cls, f).offset == facts[("offset", f"{s}.{f}")], f"offsetof({s}, {f})"
    for e, (py_enum, prefix, renames) in _capi.ENUMS.items():
        assert facts[("size", e)] == ctypes.sizeof(_capi.c_enum), f"sizeof({e})"
        back = {v: k for k, v in renames.items()}
        for m in py_enum:
            assert facts[("value", prefix + back.get(m.name, m.name))] == m.value


def test_library_exports_every_declared_function():
    LIB.load()
    assert LIB.missing == [], f"{LIB.path} does not export {LIB.missing}"


def test_version_of_loaded_library_matches_the_generated_header():
    """The version is written once (CMake's project version): the generated
    lowbit_version.h of the build and the loaded library agree."""
    import lowbit

    for d in _generated_include_dirs():
        text = (Path(d) / "lowbit_version.h").read_text()
        parts = [re.search(rf"#define LOWBIT_VERSION_{k}\s+(\d+)", text).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
        assert lowbit.version() == ".".join(parts)
        assert lowbit.__version__ == lowbit.version()
        return
    pytest.skip("no generated lowbit_version.h next to the library")

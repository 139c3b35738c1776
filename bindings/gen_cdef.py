#!/usr/bin/env python3
"""Generates lowbit_cdef.h, the C declarations the Python package hands to
CFFI (ABI mode), from the public headers themselves.

    gen_cdef.py --cc CC [--cc-arg ARG ...] -I DIR [-I DIR ...]
                --out lowbit_cdef.h [--fingerprint-header lowbit_cdef_fingerprint.h]
                lowbit.h [lowbit_comm.h ...]

How: the headers are run through the C preprocessor (`CC -E -P`) with the
system headers replaced by empty stubs (CFFI knows size_t, int64_t, ... by
itself) and `__attribute__((...))` defined away, so what comes out is the
headers' own typedefs, enums, structs and prototypes, exactly as a C compiler
sees them. What CFFI's cdef does not accept (function bodies, static asserts)
is dropped. Object-like macros named LOWBIT_* whose expansion is an integer
constant expression (LOWBIT_VERSION_*, LOWBIT_NCCL_UNIQUE_ID_BYTES, ...) are
carried over as `#define NAME <value>`, evaluated by the preprocessor.

The file starts with a comment holding `fingerprint: <sha256 of the body>`.
With --fingerprint-header the same value is written as
LOWBIT_CDEF_FINGERPRINT into a header compiled into liblowbit
(lowbit_build_info), so the Python package checks at load time that the
declarations it reads are the ones the loaded library was built with. Files
are only rewritten when their content changes.

When cffi is importable here, the result is parsed with it, so a header
construct CFFI cannot take fails the build, not the first `import lowbit`.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import operator
import os
import re
import subprocess
import sys
import tempfile

FINGERPRINT_RE = re.compile(r"^ \* fingerprint: ([0-9a-f]{64})$", re.M)
BODY_MARKER = " * (end of header)\n */\n"
MACRO_PREFIX = "LOWBIT_"
_STUB_HEADERS = ("stddef.h", "stdint.h", "stdbool.h")


def fingerprint_of(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def split_cdef(text: str):
    """(declared fingerprint, body) of a generated file; raises ValueError
    when the file is not one."""
    head, sep, body = text.partition(BODY_MARKER)
    m = FINGERPRINT_RE.search(head)
    if not sep or not m:
        raise ValueError("not a lowbit_cdef.h written by bindings/gen_cdef.py (no fingerprint header)")
    return m.group(1), body


# ----------------------------------------------------------------- preprocessing


def _run(cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"gen_cdef.py: {what} failed ({' '.join(cmd)}):\n{proc.stderr}")
    return proc.stdout


def _preprocess(cc, cc_args, includes, source, extra=()):
    return _run(list(cc) + list(cc_args) + ["-E", "-P", "-nostdinc", "-D__attribute__(x)="] + list(extra)
                + [f"-I{d}" for d in includes] + [source], "the C preprocessor")


# ----------------------------------------------------------------- integer macros

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: None,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.Div: None, ast.FloorDiv: None}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if b == 0:
                raise ValueError("division by zero")
            q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C truncates toward zero
            return q if not isinstance(node.op, ast.Mod) else a - q * b
        return _BINOPS[type(node.op)](a, b)
    raise ValueError(f"not an integer constant expression ({ast.dump(node)})")


def c_integer_value(expansion: str):
    """The value of a C integer constant expression as the preprocessor left
    it (literals with u/l suffixes, + - * / % << >> & | ^ ~, parentheses), or
    None when it is something else (a type, a string, an attribute, empty)."""
    text = expansion.strip()
    if not text or not re.fullmatch(r"[0-9a-fA-FxXuUlL()+\-*/%<>&|^~\s]+", text):
        return None
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", text)
    text = re.sub(r"\b0(\d+)\b", lambda m: "0o" + m.group(1), text)  # C octal
    text = text.replace("/", "//")
    try:
        return _eval(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError):
        return None


def integer_macros(cc, cc_args, includes, tmp, main):
    defs = _preprocess(cc, cc_args, includes, main, ["-dM"])
    names = []
    for line in defs.splitlines():
        m = re.match(r"#define (" + MACRO_PREFIX + r"\w*)(\(?)", line)
        if m and not m.group(2):  # object-like only
            names.append(m.group(1))
    probe = os.path.join(tmp, "macros.c")
    with open(probe, "w") as f:
        f.write(open(main).read())
        for name in names:
            f.write(f'\n__lowbit_cdef_macro__ "{name}" {name}\n')
    out = _preprocess(cc, cc_args, includes, probe)
    macros = []
    for m in re.finditer(r'^__lowbit_cdef_macro__ "(\w+)" (.*)$', out, flags=re.M):
        value = c_integer_value(m.group(2))
        if value is not None:
            macros.append((m.group(1), value))
    return sorted(macros)


# ----------------------------------------------------------------- declarations


def _top_level_declarations(text: str):
    """Split preprocessed C into top-level declarations (each ends with ';'
    at brace depth 0, or is a function definition ending with '}')."""
    decls, cur, depth = [], [], 0
    for ch in text:
        cur.append(ch)
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                so_far = "".join(cur)
                head = so_far[: so_far.find("{")]
                # a function body: "...)" right before the brace
                if re.search(r"\)\s*$", head):
                    decls.append(so_far)
                    cur = []
        elif ch == ";" and depth == 0:
            decls.append("".join(cur))
            cur = []
    rest = "".join(cur).strip()
    if rest:
        decls.append(rest)
    return [d.strip() for d in decls if d.strip() and d.strip() != ";"]


def _keep(decl: str) -> bool:
    if decl.endswith("}"):  # a function definition (static inline helper)
        return False
    if re.match(r"(_Static_assert|static_assert)\b", decl):
        return False
    if re.match(r"static\b", decl):
        return False
    return True


def _normalise(decl: str) -> str:
    lines = [re.sub(r"[ \t]+", " ", line).rstrip() for line in decl.splitlines()]
    return "\n".join(line for line in lines if line.strip())


def declarations(cc, cc_args, includes, main):
    text = _preprocess(cc, cc_args, includes, main)
    return [_normalise(d) for d in _top_level_declarations(text) if _keep(d)]


# ----------------------------------------------------------------- output


def build(cc, cc_args, includes, headers):
    with tempfile.TemporaryDirectory(prefix="lowbit_cdef_") as tmp:
        stubs = os.path.join(tmp, "stubs")
        os.mkdir(stubs)
        for name in _STUB_HEADERS:
            open(os.path.join(stubs, name), "w").close()
        main = os.path.join(tmp, "lowbit_cdef_main.c")
        with open(main, "w") as f:
            for h in headers:
                f.write(f'#include "{os.path.abspath(h)}"\n')
        incs = [stubs] + list(includes)
        macros = integer_macros(cc, cc_args, incs, tmp, main)
        decls = declarations(cc, cc_args, incs, main)
    body = "".join(f"#define {name} {value}\n" for name, value in macros)
    body += "\n" + "\n\n".join(decls) + "\n"
    fp = fingerprint_of(body)
    names = ", ".join(os.path.basename(h) for h in headers)
    head = ("/*\n"
            f" * Generated by bindings/gen_cdef.py from {names}: the declarations\n"
            " * the lowbit Python package gives to CFFI (ABI mode). Do not edit; the\n"
            " * build regenerates it whenever a header changes.\n"
            f" * fingerprint: {fp}\n"
            + BODY_MARKER)
    return head + body, fp


def check_with_cffi(text: str):
    try:
        import cffi
    except ImportError:
        return False
    ffi = cffi.FFI()
    try:
        ffi.cdef(text)
    except Exception as e:  # cffi raises CDefError, pycparser ParseError, ...
        sys.exit(f"gen_cdef.py: CFFI rejects the generated declarations: {type(e).__name__}: {e}")
    return True


def write_if_changed(path: str, text: str):
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("headers", nargs="+")
    ap.add_argument("--cc", required=True, help="the C compiler (its preprocessor is used)")
    ap.add_argument("--cc-arg", action="append", default=[], help="extra compiler argument (repeatable)")
    ap.add_argument("-I", dest="includes", action="append", default=[], help="include directory (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fingerprint-header", help="also write LOWBIT_CDEF_FINGERPRINT into this header")
    ap.add_argument("--no-cffi-check", action="store_true", help="do not parse the result with cffi")
    args = ap.parse_args(argv)
    text, fp = build([args.cc], args.cc_arg, args.includes, args.headers)
    if not args.no_cffi_check:
        check_with_cffi(text)
    write_if_changed(args.out, text)
    if args.fingerprint_header:
        write_if_changed(args.fingerprint_header,
                         "/* Generated by bindings/gen_cdef.py: the fingerprint of lowbit_cdef.h, the\n"
                         " * declarations of this build's public headers (lowbit_build_info). */\n"
                         f'#define LOWBIT_CDEF_FINGERPRINT "{fp}"\n')


if __name__ == "__main__":
    main()

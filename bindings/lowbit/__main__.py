"""``python -m lowbit``: what the loaded liblowbit was built with.

    python -m lowbit          one "key: value" line per fact
    python -m lowbit --json   the same as one JSON object

Exit status 0 when the library and its declarations load, 1 (with the
reason on stderr) when they do not.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

def jax_handlers(library_path: str) -> dict:
    """The JAX FFI module lowbit.jax would load: its path and protocol
    version (read with ctypes; jax itself is not imported)."""
    from ._lib import jax_module_candidates

    for path, _source in jax_module_candidates():
        if os.path.exists(path):
            try:
                mod = ctypes.CDLL(path)
                mod.lowbit_jax_protocol_version.restype = ctypes.c_int32
                mod.lowbit_jax_has_cuda.restype = ctypes.c_int32
                return {"path": path, "protocol": int(mod.lowbit_jax_protocol_version()),
                        "cuda": bool(mod.lowbit_jax_has_cuda())}
            except (OSError, AttributeError) as e:
                return {"path": path, "error": str(e)}
    return {}


def report() -> dict:
    import lowbit

    info = lowbit.build_info()
    info["jax_module"] = jax_handlers(info["library"])
    return info


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def format_report(info: dict) -> str:
    cuda = _yes(info["cuda"])
    if info["cuda"]:
        cuda += f" (toolkit {info['cuda_version'] or '?'}, architectures {info['cuda_architectures'] or '?'})"
    jm = info["jax_module"]
    if jm.get("path") and "error" not in jm:
        jax_found = f"{jm['path']} (protocol {jm['protocol']}, CUDA handler {_yes(jm['cuda'])})"
    elif jm.get("path"):
        jax_found = f"{jm['path']} (could not be loaded: {jm['error']})"
    else:
        from ._lib import jax_module_candidates

        jax_found = "not found (" + ", ".join(p for p, _ in jax_module_candidates()) + ")"
    kernels = f"{info['cpu_kernels']} (this CPU runs {', '.join(info['cpu_kernels_available'])}"
    forced = os.environ.get("LOWBIT_CPU_KERNELS")
    kernels += f"; LOWBIT_CPU_KERNELS={forced})" if forced else "; LOWBIT_CPU_KERNELS forces one)"
    if info["cpu_kernels_note"]:
        kernels += f": {info['cpu_kernels_note']}"
    rows = [
        ("version", info["version"]),
        ("library", info["library"]),
        ("declarations", f"{info['cdef']} (fingerprint {info['cdef_fingerprint'][:16]}, matches the library)"),
        ("compiler", f"{info['compiler']}, {info['build_type'] or 'no build type'}"),
        ("CUDA", cuda),
        ("MPI", _yes(info["mpi"])),
        ("NCCL", _yes(info["nccl"]) + (" (libnccl is loaded at run time)" if info["nccl"] else "")),
        ("OpenMP", _yes(info["openmp"])),
        ("JAX handlers built", _yes(info["jax_handlers"])),
        ("JAX handlers found", jax_found),
        ("CPU kernels", kernels),
        ("CPU codecs", info["cpu_codec"]),
        ("Muon CPU products, fp32", info["cpu_matmul_fp32"] or "not reported (a library before 0.8)"),
        ("Muon CPU products, bf16", info["cpu_matmul_bf16"] or "not reported (a library before 0.8)"),
    ]
    width = max(len(k) for k, _ in rows) + 1
    return "\n".join(f"{k + ':':<{width}} {v}" for k, v in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lowbit", description="What the loaded liblowbit was built with.")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        info = report()
    except ImportError as e:  # lowbit.LibraryNotFoundError is an ImportError
        print(f"lowbit: {e}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=1, sort_keys=True) if args.json else format_report(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())

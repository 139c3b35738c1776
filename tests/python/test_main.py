"""`python -m lowbit` reports what the loaded library was built with, from
lowbit_build_info (lowbit.build_info()) and the JAX module lowbit.jax would
load; its lines are `key: value`, and --json gives the same as one object."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lowbit

PACKAGE_PARENT = str(Path(lowbit.__file__).resolve().parents[1])


def _run(*args, **env):
    e = dict(os.environ, PYTHONPATH=PACKAGE_PARENT, **env)
    return subprocess.run([sys.executable, "-m", "lowbit", *args], capture_output=True, text=True, env=e,
                          timeout=120)


def _lines(text):
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        assert sep, f"not a 'key: value' line: {line!r}"
        out[key.strip()] = value.strip()
    return out


def test_report_lines():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    rows = _lines(proc.stdout)
    assert list(rows) == ["version", "library", "declarations", "compiler", "CUDA", "MPI", "NCCL", "OpenMP",
                          "JAX handlers built", "JAX handlers found", "CPU kernels", "CPU codecs",
                          "Muon CPU products, fp32", "Muon CPU products, bf16"]
    assert rows["version"] == lowbit.version()
    assert rows["library"] == lowbit.library_path()
    info = lowbit.build_info()
    assert rows["declarations"].startswith(info["cdef"]) and info["cdef_fingerprint"][:16] in rows["declarations"]
    assert rows["CUDA"].split()[0] == ("yes" if lowbit.has_cuda() else "no")
    if lowbit.has_cuda():
        assert f"architectures {info['cuda_architectures']}" in rows["CUDA"] and info["cuda_architectures"]
    assert rows["MPI"] == ("yes" if lowbit.has_mpi() else "no")
    assert rows["NCCL"].split()[0] == ("yes" if lowbit.has_nccl() else "no")
    assert rows["JAX handlers built"] in ("yes", "no")
    assert rows["CPU kernels"].split()[0] == info["cpu_kernels"] in info["cpu_kernels_available"]
    assert rows["CPU codecs"] == info["cpu_codec"] in ("AVX-512", "AVX2", "NEON", "portable")
    assert rows["compiler"].startswith(info["compiler"])
    assert rows["Muon CPU products, fp32"] == info["cpu_matmul_fp32"]
    assert rows["Muon CPU products, bf16"] == info["cpu_matmul_bf16"]


def test_report_names_what_runs_muons_products():
    """Which implementation runs Muon's CPU products (core/cpu_matmul.hpp):
    the CBLAS (named, with its path) or lowbit's own blocked product, and
    oneDNN's bf16 matmul where this CPU has one; LOWBIT_MATMUL changes it
    and an unknown value is reported as refused."""
    auto = _lines(_run().stdout)
    fp32, bf16 = auto["Muon CPU products, fp32"], auto["Muon CPU products, bf16"]
    assert fp32.startswith(("OpenBLAS", "Intel MKL", "BLIS", "a CBLAS", "lowbit's blocked product")), fp32
    if fp32.startswith("lowbit's"):  # no CBLAS, or the reference one: said so
        assert "reference BLAS" in fp32 or "no CBLAS" in fp32, fp32
    assert "bf16 matmul" in bf16 or "rounded to bf16" in bf16, bf16
    builtin = _lines(_run(LOWBIT_MATMUL="builtin").stdout)
    assert builtin["Muon CPU products, fp32"].startswith("lowbit's blocked product (")
    assert builtin["Muon CPU products, fp32"].endswith("(LOWBIT_MATMUL=builtin)")
    assert builtin["Muon CPU products, bf16"].endswith("(LOWBIT_MATMUL=builtin), rounded to bf16")
    bad = _run(LOWBIT_MATMUL="fastest")
    assert bad.returncode == 0 and _lines(bad.stdout)["Muon CPU products, fp32"].startswith("none: LOWBIT_MATMUL")
    if bf16.startswith("oneDNN"):  # a CPU without oneDNN's bf16 matmul, as oneDNN's own switch makes this one
        avx2 = _lines(_run(DNNL_MAX_CPU_ISA="AVX2").stdout)["Muon CPU products, bf16"]
        assert avx2.endswith("has no bf16 matmul on this CPU)") and "rounded to bf16" in avx2, avx2


def test_report_json_is_build_info():
    proc = _run("--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    jax_module = got.pop("jax_module")
    assert got == lowbit.build_info()
    if jax_module:
        # protocol: bindings/jax/step_common.hpp kProtocolVersion
        assert Path(jax_module["path"]).name == "liblowbit_jax.so" and jax_module.get("protocol") == 5
    assert isinstance(got["cuda"], bool) and got["version"].count(".") == 2


def test_generic_kernels_turn_the_avx512_codecs_off():
    proc = _run("--json", LOWBIT_CPU_KERNELS="generic")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["cpu_avx512_codecs"] is False and got["cpu_kernels"] == "portable" and got["cpu_codec"] == "portable"
    assert "portable (this CPU runs" in _run(LOWBIT_CPU_KERNELS="generic").stdout


@pytest.mark.parametrize("level", ["portable", "avx2", "avx512", "neon"])
def test_every_level_can_be_forced(level):
    """LOWBIT_CPU_KERNELS names the level that runs where the CPU has it;
    elsewhere the best level runs and the note says why (stderr too)."""
    available = lowbit.build_info()["cpu_kernels_available"]
    proc = _run("--json", LOWBIT_CPU_KERNELS=level)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    if level in available:
        assert got["cpu_kernels"] == level and got["cpu_kernels_note"] == ""
    else:
        assert got["cpu_kernels"] == available[-1]
        assert f"cannot run {level}" in got["cpu_kernels_note"] and f"cannot run {level}" in proc.stderr


def test_unknown_level_is_reported():
    proc = _run("--json", LOWBIT_CPU_KERNELS="sse9")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["cpu_kernels"] == got["cpu_kernels_available"][-1]
    assert "LOWBIT_CPU_KERNELS=sse9 is not a level" in got["cpu_kernels_note"]


def test_jax_module_named_by_the_environment(tmp_path):
    missing = tmp_path / "liblowbit_jax.so"
    rows = _lines(_run(LOWBIT_JAX_LIBRARY=str(missing)).stdout)
    assert rows["JAX handlers found"] == f"not found ({missing})"


def test_missing_library_is_reported():
    proc = _run(LOWBIT_LIBRARY="/nonexistent/liblowbit.so")
    assert proc.returncode != 0
    assert "LOWBIT_LIBRARY='/nonexistent/liblowbit.so' does not exist" in proc.stderr

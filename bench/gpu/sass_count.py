#!/usr/bin/env python3
"""SASS instruction counts of the CUDA step and communicator kernels, without a GPU.

Compiles the kernels for sm_90 with the flags the library ships them with
(taken from a CMake configure's compile_commands.json, plus -lineinfo, which
changes no instruction), disassembles them with nvdisasm and, for each kernel
loop of interest, prints the instructions of the kernel, of the loop and of
one pass through it, normalised per 256 elements (sass_cfg.py says how the
loop is measured). bench/NOTES.md, "SASS instruction counts without a GPU".

  bench/gpu/sass_count.sh [--fast-math] [--nvcc-flags="--fmad=true"] [--build-dir DIR] [--breakdown]
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_cfg  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCES = ["cuda/step_adam.cu", "cuda/step_lion_sgd.cu", "cuda/step_muon.cu", "cuda/aux_kernels.cu",
           "comm/cuda_kernels.cu"]
STEP = "cuda/step_kernel.cuh"
SR = "cuda/sr_codes.cuh"
SHAPED = "cuda/shaped_kernels.cuh"
COMM = "comm/cuda_kernels.cuh"


# The runtime branches of a fast step loop that bench_gpu_step's default
# configuration (round to nearest, no error-correction bytes) does not take,
# as source lines [(file, text, context: a line the inline stack must hold too)]:
# stochastic rounding, ECC, and the floor of a second moment in the first moment.
# (The ECC load `if (ecc) load_bytes(...)` is one line with its test: counted.)
MOM0 = (STEP, "encode_store_moment(mom0, smap[0], second0")
NEAREST_NO_ECC = [
    (STEP, "uint32_t bits = random_bits(key", None),
    (STEP, "float_to_bf16_ecc(p[j], h, b)", None),
    (STEP, "float_to_fp16_ecc(p[j], h, b)", None),
    (STEP, "p[j] = bf16_ecc_to_float(", None),
    (STEP, "p[j] = fp16_ecc_to_float(", None),
    ("core/quant.hpp", "return code + int((code == map.zero_code)", MOM0),
    ("core/quant.hpp", "floor_positive_e4m3(uint8_t code, float x) {", MOM0),
    # the paths for rare values (as the IEEE division's slow path): a block
    # whose absmax is out of the reciprocal's range or holds a tiny nonzero
    # value, and a NaN among a lane's bf16 stores
    (STEP, "const float xn = normalize(x[j], absmax);", None),
    (STEP, "const uint8_t code = s > 0.f ? float_to_e4m3(x[j] / s)", None),
    (STEP, "for (int k = 0; k < 4; ++k) w[k] = uint32_t(float_to_bf16(x[2 * k]))", None),
]


# lpmm's preset: m per block, v rank-1 (the rank-1 first moment is another configuration)
LPMM_NO_ECC = NEAREST_NO_ECC + [(STEP, "rank1_codes<kAnyMap>(smap[0], second[0]", None)]

# 4BIT_SR's first moment (sr_codes): not a block outside the search's absmax
# range (tiny, NaN or Inf: stochastic_code16 itself).
SR_NO_ECC = NEAREST_NO_ECC + [
    (SR, "decoded_values16(sm, absmax, decoded);", None),
    ("core/quant.hpp", "const bool le = decoded[k] <= x;", (SR, "packed |= uint32_t(stochastic_code16(decoded")),
]

# Muon's momentum: its output at a 16-byte aligned flat offset (not element by element).
MUON_OUT = (STEP, "store_elems(out, true, e0, 8, out_al16, r)")
MUON_ALIGNED = [("cuda/lane_io.cuh", "if (j < n) p[j] = r.w[j];", MUON_OUT)]


def fast(algo, pd, f):
    return dict(src="cuda/step_adam.cu" if algo == 0 else "cuda/step_lion_sgd.cu",
                kernel="step_kernelILNS_4AlgoE%dEE" % algo, file=STEP, line=True,
                anchor="LOWBIT_FAST_CASE(fast_tiles, %s, LOWBIT_STATE_%s)" % (pd, f), elems=256, skip=NEAREST_NO_ECC)


def fast_sr(algo, pd):
    return dict(fast(algo, pd, "4BIT"), anchor="LOWBIT_FAST_SR_CASE(%s)" % pd, skip=SR_NO_ECC)


def muon(gd, f, sr):
    return dict(src="cuda/step_muon.cu", kernel="step_kernelILNS_4AlgoE4EE", file=STEP, line=True,
                anchor="LOWBIT_MUON_CASE(%s, LOWBIT_STATE_%s, %d)" % (gd, f, sr), elems=256,
                skip=(SR_NO_ECC if sr else NEAREST_NO_ECC) + MUON_ALIGNED)


# (label, where): the loop is found by its source lines (`anchor`, the first
# occurrence after `after`; the whole braced statement, or the anchor line only
# when line=True); `elems` is the number of elements one warp covers per pass.
ROWS = [
    ("AdamW 8-bit, bf16 params", fast(0, "kBF16", "8BIT")),
    ("AdamW 4-bit, bf16", fast(0, "kBF16", "4BIT")),
    ("AdamW 4BIT_SR m + 4-bit v, bf16", fast_sr(0, "kBF16")),
    ("AdamW FP8, bf16", fast(0, "kBF16", "FP8")),
    ("AdamW bf16 state, bf16", fast(0, "kBF16", "BF16")),
    ("AdamW fp32 state, bf16", fast(0, "kBF16", "FP32")),
    ("AdamW fp32 state, fp32", fast(0, "kF32", "FP32")),
    ("Lion 8-bit, bf16", fast(2, "kBF16", "8BIT")),
    ("Lion 4-bit, bf16", fast(2, "kBF16", "4BIT")),
    ("Lion 4BIT_SR, bf16", fast_sr(2, "kBF16")),
    ("Muon momentum 8-bit, bf16 grads", muon("kBF16", "8BIT", 0)),
    ("Muon momentum 4-bit, bf16 grads", muon("kBF16", "4BIT", 0)),
    ("Muon momentum 4BIT_SR, bf16 grads", muon("kBF16", "4BIT", 1)),
    ("Muon momentum generic loop",
     dict(src="cuda/step_muon.cu", kernel="step_kernelILNS_4AlgoE4EE", file=STEP,
          anchor="for (int64_t t = t_generic + warp", elems=256)),
    ("AdamW 4-bit, rank-1 v (pass 2), bf16",
     dict(src="cuda/step_adam.cu", kernel="step_kernelILNS_4AlgoE0EE", file=STEP, line=True,
          anchor="LOWBIT_FAST_CASE(fast_rank1_tiles, kBF16, LOWBIT_STATE_4BIT)", elems=256, skip=LPMM_NO_ECC)),
    ("AdamW 4-bit Factor, factored v (pass 2), bf16",
     dict(src="cuda/step_adam.cu", kernel="step_kernelILNS_4AlgoE0EE", file=STEP, line=True,
          anchor="LOWBIT_FAST_CASE(fast_factored_tiles, kBF16, LOWBIT_STATE_4BIT)", elems=256, skip=NEAREST_NO_ECC)),
    ("AdamW generic loop (rank-1/factored pass 2)",
     dict(src="cuda/step_adam.cu", kernel="step_kernelILNS_4AlgoE0EE", file=STEP,
          anchor="for (int64_t t = t_generic + warp", elems=256)),
    # v factored, m per block: the inner loops, unrolled by 4 (4 elements a lane per pass); of the three
    # grad dtypes' copies the one with the most loads and the shortest pass (fp32 or bf16)
    ("AdamW shaped pass 1, factored rows (m per block)",
     dict(src="cuda/step_adam.cu", kernel="stats_kernelILNS_4AlgoE0EE", file=SHAPED, after="factored_stats_item(",
          anchor="for (int64_t c = lane; c < C; c += 32)", line=True, elems=128, unrolled=True)),
    ("AdamW shaped pass 1, factored columns (m per block)",
     dict(src="cuda/step_adam.cu", kernel="stats_kernelILNS_4AlgoE0EE", file=SHAPED, after="factored_stats_item(",
          anchor="for (int64_t r = r0; r < r1e; ++r, e += C)", line=True, elems=128, unrolled=True)),
    ("AdamW shaped pass 1, rows (generic)",
     dict(src="cuda/step_adam.cu", kernel="stats_kernelILNS_4AlgoE0EE", file=SHAPED, after="stats_kernel(const",
          anchor="for (int64_t c = lane; c < C; c += 32)", elems=32)),
    ("AdamW shaped pass 1, rank-1 (rows and columns, 2-D bf16)",
     dict(src="cuda/step_adam.cu", kernel="stats_kernelILNS_4AlgoE0EE", file=SHAPED, after="rank1_stats_rows(",
          anchor="for (int64_t q = r0 + warp; q < r1e; q += kWarps)", elems=256, shortest=True)),
    ("AdamW shaped pass 1, columns (generic)",
     dict(src="cuda/step_adam.cu", kernel="stats_kernelILNS_4AlgoE0EE", file=SHAPED, after="stats_kernel(const",
          anchor="for (int64_t r = r0; r < r1e; ++r)", elems=32)),
    ("comm worker sumsq (segment)",
     dict(src="comm/cuda_kernels.cu", kernel="k_worker_sumsq", file=COMM, after="void k_worker_sumsq",
          anchor="for (int64_t sg = blockIdx.x", elems=1024)),
    ("comm worker pack",
     dict(src="comm/cuda_kernels.cu", kernel="k_worker_pack", file=COMM, after="void k_worker_pack",
          anchor="for (int64_t b = ", elems=256)),
    ("comm server sum (round)",
     dict(src="comm/cuda_kernels.cu", kernel="k_server_sum", file=COMM, after="void k_server_sum",
          anchor="for (int r = 0; r < sumsq::kRounds", elems=256)),
    ("comm server sum, per message",
     dict(src="comm/cuda_kernels.cu", kernel="k_server_sum", file=COMM, after="void k_server_sum",
          anchor="for (int j = 0; j < world; ++j)", elems=256)),
    ("comm server pack",
     dict(src="comm/cuda_kernels.cu", kernel="k_server_pack", file=COMM, after="void k_server_pack",
          anchor="for (int64_t b = ", elems=256)),
    ("comm finalize decode",
     dict(src="comm/cuda_kernels.cu", kernel="k_finalize", file=COMM, after="void k_finalize",
          anchor="for (int64_t b = tid; b < nbytes", elems=256)),
]


def die(msg):
    sys.exit("sass_count: " + msg)


def find_tool(name, env):
    """$ENV, PATH, the CUDA toolkit beside nvcc, then the PyPI package (nvidia-cuda-<name>)."""
    if os.environ.get(env):
        if not os.access(os.environ[env], os.X_OK):
            die("$%s=%s is not an executable" % (env, os.environ[env]))
        return os.environ[env]
    p = shutil.which(name)
    if p:
        return p
    cands = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(os.path.join(os.path.dirname(nvcc), name))
    cuobj = os.environ.get("CUOBJDUMP")
    if cuobj:
        cands.append(os.path.join(os.path.dirname(cuobj), name))
    for sp in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]} | set(sys.path):
        # nvidia/cu13/bin (CUDA 13 wheels), nvidia/cuda_nvdisasm/bin (CUDA 12 wheels)
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "bin", name)))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def version(tool):
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def configure(build, fast_math):
    cmd = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CUDA_ARCHITECTURES=90",
           "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DLOWBIT_CUDA_FAST_MATH=" + ("ON" if fast_math else "OFF"),
           "-DLOWBIT_CUDA_STEP_MIN_BLOCKS=", "-DLOWBIT_WITH_MPI=OFF", "-DLOWBIT_WITH_NCCL=OFF",
           "-DLOWBIT_BUILD_TESTS=OFF", "-DLOWBIT_BUILD_BENCH=OFF", "-DLOWBIT_BUILD_EXAMPLES=OFF"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die("cmake configure failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = {os.path.relpath(e["file"], ROOT): e for e in json.load(f)}
    missing = [s for s in SOURCES if s not in entries]
    if missing:
        die("no compile command for %s (is CUDA enabled in this configure?)" % ", ".join(missing))
    return entries


def cubin_command(entry, out, extra):
    """The project's nvcc command for one source, made to write an sm_90 cubin with line info."""
    args, keep = shlex.split(entry["command"]), []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-c", "-o"):
            skip = a == "-o"
            continue
        if a.startswith(("--generate-code", "-gencode", "-arch", "--gpu-architecture")):
            continue
        keep.append(a)
    return keep + ["--generate-code=arch=compute_90,code=sm_90", "-cubin", "-lineinfo", "-o", out] + extra


def build(entries, outdir, extra, nvdisasm, jobs, reuse):
    """{source: nvdisasm listing}; the cubins and listings stay in outdir for reading."""
    def one(src):
        cubin = os.path.join(outdir, os.path.basename(src) + ".cubin")
        if not (reuse and os.path.isfile(cubin)):
            r = subprocess.run(cubin_command(entries[src], cubin, extra), cwd=entries[src]["directory"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                die("nvcc failed on %s:\n%s" % (src, r.stderr[-3000:]))
        r = subprocess.run([nvdisasm, "-c", "-gi", cubin], capture_output=True, text=True)
        if r.returncode != 0:
            die("nvdisasm failed on %s: %s" % (cubin, r.stderr[-1000:]))
        with open(cubin[:-len("cubin")] + "sass", "w") as f:
            f.write(r.stdout)
        return src, r.stdout

    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        return dict(ex.map(one, SOURCES))


def source_lines(rel, spec):
    """(first, last) source line of the statement that the row names."""
    with open(os.path.join(ROOT, rel)) as f:
        lines = f.read().splitlines()
    start = 0
    if spec.get("after"):
        start = next((k for k, l in enumerate(lines) if spec["after"] in l), None)
        if start is None:
            die("%s: no line with %r" % (rel, spec["after"]))
    k = next((k for k in range(start, len(lines)) if spec["anchor"] in lines[k]), None)
    if k is None:
        die("%s: no line with %r" % (rel, spec["anchor"]))
    if spec.get("line"):
        return k + 1, k + 1
    depth, seen = 0, False
    for j in range(k, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        seen = seen or "{" in lines[j]
        if seen and depth <= 0:
            return k + 1, j + 1
    die("%s: unbalanced braces after line %d" % (rel, k + 1))


def pick_loop(cfg, rel, lo, hi, shortest=False, unrolled=False):
    """The loop whose instructions come from source lines [lo, hi] of `rel`, most and least of all
    from elsewhere (hits - misses). Where the compiler made several versions of the loop (unswitched
    on a loop-invariant condition), the one with the most 16-byte accesses, then the shortest pass."""
    def hit(i):
        return i.tag is not None and any(f.endswith(rel) and lo <= l <= hi for f, l in i.tag)

    if unrolled:
        # the innermost loops from these lines, and of those the one with the most loads per pass
        # (a loop unrolled by the compiler, not its remainder): its pass covers several elements
        loops = [lp for lp in cfg.loops if any(hit(i) for i in lp.instructions())]
        inner = [lp for lp in loops if not any(o is not lp and o.body < lp.body for o in loops)]
        if not inner:
            return None, 0

        def loads(lp):
            return sum(i.base in ("LD", "LDG") for i in lp.hot_path()[1])

        return max(inner, key=lambda lp: (loads(lp), -lp.hot_path()[0])), len(inner)
    scored = []
    for lp in cfg.loops:
        ins = lp.instructions()
        h = sum(hit(i) for i in ins)
        if h:
            scored.append((h - (len(ins) - h), lp))
    if not scored:
        return None, 0
    best = max(s for s, _ in scored)
    # versions: loops of (nearly) the same score that do not nest in one another
    # (shortest: every version, however short: a specialised copy of the loop may be much shorter)
    versions = [lp for s, lp in scored if s >= (1 if shortest else best * 0.5) and s > 0] or \
        [max(scored, key=lambda x: x[0])[1]]
    versions = [lp for lp in versions if not any(o is not lp and lp.body < o.body for o in versions)]

    def key(lp):
        n, ins, _ = lp.hot_path()
        return n if shortest else (-sum(".128" in i.op for i in ins), n)

    return min(versions, key=key), len(versions)


def skip_predicate(rel, text, context):
    """An instruction whose inline stack holds the line of `text` (and of `context`, if given)."""
    line = source_lines(rel, dict(anchor=text, line=True))[0]
    ctx = source_lines(context[0], dict(anchor=context[1], line=True))[0] if context else None

    def has(tag, r, l):
        return any(f.endswith(r) and n == l for f, n in tag)

    return lambda i: i.tag is not None and has(i.tag, rel, line) and (ctx is None or has(i.tag, context[0], ctx))


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def analyse(listings):
    funcs = {src: sass_cfg.parse(text) for src, text in listings.items()}
    cfgs, rows, failed = {}, [], []
    for label, spec in ROWS:
        fns = [n for n in funcs[spec["src"]] if spec["kernel"] in n]
        if len(fns) != 1:
            failed.append("%s: %d kernels match %r" % (label, len(fns), spec["kernel"]))
            continue
        fn = funcs[spec["src"]][fns[0]]
        cfg = cfgs.get(fns[0]) or cfgs.setdefault(fns[0], sass_cfg.Cfg(fn))
        lo, hi = source_lines(spec["file"], spec)
        lp, nver = pick_loop(cfg, spec["file"], lo, hi, spec.get("shortest", False), spec.get("unrolled", False))
        if lp is None:
            failed.append("%s: no loop from %s lines %d-%d in %s" % (label, spec["file"], lo, hi, fns[0]))
            continue
        skips = [skip_predicate(*sk) for sk in spec.get("skip", ())]
        n, ins, dropped = lp.hot_path(skips)
        rows.append(dict(label=label, kernel=fns[0], total=len(fn.counted()), static=lp.static(), path=n,
                         per256=n * 256.0 / spec["elems"], elems=spec["elems"], at=lp.first, versions=nver,
                         dropped=[spec["skip"][k][1] for k in dropped], classes=sass_cfg.breakdown(ins)))
    return rows, failed, funcs


def print_report(rows, funcs, breakdown, header):
    print("\n".join(header))
    names = demangle(sorted({r["kernel"] for r in rows}))
    print()
    print("| loop | kernel | kernel SASS | loop SASS (static) | one pass | elements/pass (warp) | per 256 elements |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        k = re.sub(r"^void |lowbit::(cuda::|onebit::dev::)?", "", names[r["kernel"]])
        k = k[:k.rfind("(")] if k.endswith(")") else k
        note = " (%d versions)" % r["versions"] if r["versions"] > 1 else ""
        print("| %s%s | `%s` @0x%x | %d | %d | %d | %d | %.0f |" % (
            r["label"], note, k, r["at"], r["total"], r["static"], r["path"], r["elems"], r["per256"]))
    for r in rows:
        if r["dropped"]:
            print("%s: these branches are on every path, counted: %s" % (r["label"], "; ".join(r["dropped"])))
    if breakdown:
        cls = [c for c, _ in sass_cfg.CLASSES] + ["other"]
        used = [c for c in cls if any(dict(r["classes"]).get(c) for r in rows)]
        print("\nOne pass by opcode class, per 256 elements:\n")
        print("| loop | " + " | ".join(used) + " |")
        print("|---|" + "---|" * len(used))
        for r in rows:
            d = dict(r["classes"])
            f = 256.0 / r["elems"]
            print("| %s | " % r["label"] + " | ".join("%.0f" % (d.get(c, 0) * f) for c in used) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-sass"),
                    help="CMake build dir for the flags and the cubins (default build-sass; -fast with --fast-math)")
    ap.add_argument("--fast-math", action="store_true",
                    help="configure with LOWBIT_CUDA_FAST_MATH=ON (--use_fast_math for the step kernels)")
    ap.add_argument("--nvcc-flags", default="", help="extra nvcc flags, appended to every compile")
    ap.add_argument("--breakdown", action="store_true", help="also print each pass by opcode class")
    ap.add_argument("--reuse", action="store_true", help="reuse the cubins of an earlier run (analysis only)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    a = ap.parse_args()

    nvcc = shutil.which("nvcc") or (os.path.isfile("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    if not nvcc:
        die("nvcc not found (put the CUDA toolkit's bin on PATH)")
    if not shutil.which("cmake"):
        die("cmake not found")
    nvdisasm = find_tool("nvdisasm", "NVDISASM")
    if not nvdisasm:
        die("nvdisasm not found: pip install nvidia-cuda-nvdisasm (scripts/setup.sh does), "
            "or set NVDISASM, or put it on PATH")
    build_dir = a.build_dir + ("-fast" if a.fast_math and a.build_dir.endswith("build-sass") else "")
    entries = configure(build_dir, a.fast_math)
    outdir = os.path.join(build_dir, "sass")
    os.makedirs(outdir, exist_ok=True)
    extra = shlex.split(a.nvcc_flags)
    listings = build(entries, outdir, extra, nvdisasm, a.jobs, a.reuse)
    rows, failed, funcs = analyse(listings)
    flags = " ".join(cubin_command(entries["cuda/step_adam.cu"], "X.cubin", extra))
    flags = re.sub(r"\s\S*nvcc\s", " ", " " + flags).strip()
    header = ["nvcc %s, nvdisasm %s (%s); sm_90; %s" % (version(nvcc), version(nvdisasm), nvdisasm,
                                                      "LOWBIT_CUDA_FAST_MATH=ON" if a.fast_math else "exact"),
              "step kernel flags: " + re.sub(r" -o X\.cubin|--options-file \S+ |-x cu \S+", "", flags)]
    print_report(rows, funcs, a.breakdown, header)
    if failed:
        die("expected loops not found:\n  " + "\n  ".join(failed))
    if any(r["path"] <= 0 or r["static"] <= 0 for r in rows):
        die("a loop with no instructions")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tessera vs Triton: compile time and generated code, without a GPU.

Compiles the four example kernels (kernels.py for Triton, `cargo run --release
--example aot` for Tessera) for NVIDIA sm_90 and AMD gfx942, times the compiles and
extracts the same static metrics from both sides' binaries with the same functions:

  cuda:90   cuobjdump -sass / -res-usage on the cubin, `ptxas -v` log: 128-bit global
            loads/stores, tensor-core instructions (HMMA/HGMMA), registers, spills,
            shared memory, static instruction count;
  gfx942    llvm-objdump-22 -d and llvm-readelf-22 --notes on the HSACO:
            *_dwordx4 global/buffer loads/stores, v_mfma, VGPR/AGPR/SGPR, spills and
            scratch, LDS, static instruction count.

Writes RESULTS.md (and results.json) next to this file; --update-benchmarks also puts
the table in the repository's BENCHMARKS.md. See README.md for the caveats.

Usage: python compare.py [--reps N] [--skip-ours] [--update-benchmarks] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SECTION = "## Tessera vs Triton: compile time and generated code"

TARGETS = {
    # our name -> (triton backend, triton arch, warp size, tessera --target)
    "cuda:90": ("cuda", 90, 32, "sm_90"),
    "hip:gfx942": ("hip", "gfx942", 64, "gfx942"),
}

# How a Triton case finds its Tessera artifact among `<stem>.ptx` / `<stem>.hsaco`:
# every `need` substring, no `avoid` substring; ties broken by `prefer` hits, then the
# shortest stem.
OURS_MATCH = {
    "vector_add": dict(need=["vector_add"], avoid=[], prefer=["1024"]),
    "softmax_f32": dict(need=["softmax"], avoid=["f16", "bf16", "f64"], prefer=["f32"]),
    "matmul_f16_64x64x32": dict(need=["matmul"], avoid=["f32", "bf16", "f64", "128"], prefer=["f16", "64"]),
    "matmul_f16_128x128x32": dict(need=["matmul", "128x128x32"], avoid=["f32", "bf16", "f64"], prefer=["f16"]),
    "layernorm_f32": dict(need=["layernorm"], avoid=["f16", "bf16", "f64"], prefer=["f32"]),
}


# --------------------------------------------------------------------------- tools
def find_tool(name: str, *extra_dirs: Path) -> str | None:
    for d in [ROOT / ".tools" / "bin", *extra_dirs]:
        p = d / name
        if p.exists() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which(name)


TOOLS = {
    "ptxas": find_tool("ptxas"),
    "cuobjdump": find_tool("cuobjdump"),
    "nvdisasm": find_tool("nvdisasm"),
    "llvm-objdump": find_tool("llvm-objdump-22", Path("/usr/lib/llvm-22/bin")) or find_tool(
        "llvm-objdump", Path("/usr/lib/llvm-22/bin")),
    "llvm-readelf": find_tool("llvm-readelf-22", Path("/usr/lib/llvm-22/bin")) or find_tool(
        "llvm-readelf", Path("/usr/lib/llvm-22/bin")),
}


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def tool_version(name: str) -> str:
    t = TOOLS.get(name)
    if not t:
        return "missing"
    out = run([t, "--version"]).stdout
    m = re.search(r"release [\d.]+, V[\d.]+|LLVM version [\d.]+", out)
    return m.group(0) if m else out.strip().splitlines()[-1] if out.strip() else "?"


# --------------------------------------------------------------------------- metrics
def ptx_arch(ptx: str) -> str:
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    return m.group(1) if m else "sm_90"


def ptxas_compile(ptxas: str, ptx_path: Path, cubin_path: Path, flags: list[str], reps: int = 1) -> dict:
    """Assembles PTX with `ptxas -v`; returns the median wall time and the -v facts."""
    arch = ptx_arch(ptx_path.read_text())
    cmd = [ptxas, *flags, "-v", f"--gpu-name={arch}", str(ptx_path), "-o", str(cubin_path)]
    times, log = [], ""
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        p = run(cmd)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise RuntimeError(f"ptxas failed ({' '.join(cmd)}):\n{p.stderr.strip()[-2000:]}")
        log = p.stderr + p.stdout
    return {"time_s": statistics.median(times), "arch": arch, "cmd": " ".join(cmd), **parse_ptxas_v(log)}


def parse_ptxas_v(log: str) -> dict:
    out = {}
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        out["stack"], out["spill_st"], out["spill_ld"] = map(int, m.groups())
    m = re.search(r"Used (\d+) registers", log)
    if m:
        out["regs"] = int(m.group(1))
    m = re.search(r"(\d+) bytes smem", log)
    out["smem_static"] = int(m.group(1)) if m else 0
    return out


SASS_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def nv_metrics(cubin: Path, ptxas_v: dict | None = None, dynamic_smem: int = 0) -> dict:
    """Static facts of one cubin (SASS via cuobjdump, falling back to nvdisasm)."""
    sass = ""
    if TOOLS["cuobjdump"]:
        sass = run([TOOLS["cuobjdump"], "-sass", str(cubin)]).stdout
    if not SASS_INSTR.search(sass) and TOOLS["nvdisasm"]:
        sass = run([TOOLS["nvdisasm"], str(cubin)]).stdout
    ops = [o for o in SASS_INSTR.findall(sass) if o != "NOP"]
    if not ops:
        raise RuntimeError(f"no SASS from {cubin} (cuobjdump/nvdisasm missing?)")

    def bits(o):
        return 128 if ".128" in o else 64 if ".64" in o else 32

    ldg = [o for o in ops if o.startswith(("LDG.", "LDG ")) or o == "LDG"]
    ldgsts = [o for o in ops if o.startswith("LDGSTS")]  # cp.async global -> shared
    tma = [o for o in ops if o.startswith("UTMALDG")]
    stg = [o for o in ops if o.startswith("STG")]
    mma = {}
    for o in ops:
        if o.startswith(("HGMMA", "HMMA", "IMMA", "DMMA", "QGMMA", "IGMMA", "UTCHMMA")):
            k = o.split(".")[0]
            mma[k] = mma.get(k, 0) + 1
    res = {}
    if TOOLS["cuobjdump"]:
        r = run([TOOLS["cuobjdump"], "-res-usage", str(cubin)]).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", r)
        if m:
            res = dict(zip(["regs", "stack", "shared", "local"], map(int, m.groups())))
    v = ptxas_v or {}
    spill = v.get("spill_st", 0) + v.get("spill_ld", 0) if "spill_st" in v else None
    lds = [bits(o) for o in ldg + ldgsts] + [128] * len(tma)
    return {
        "ld128": lds.count(128),
        "ld64": lds.count(64),
        "ld_all": len(lds),
        "ld_async": len(ldgsts) + len(tma),
        "st128": sum(bits(o) == 128 for o in stg),
        "st64": sum(bits(o) == 64 for o in stg),
        "st_all": len(stg),
        "mma": mma,
        "regs": res.get("regs", v.get("regs")),
        "spill_bytes": spill,
        "local": res.get("local"),
        "stack": res.get("stack", v.get("stack")),
        # Static shared memory as ptxas -v states it. cuobjdump's SHARED shows 1 KiB more
        # whenever a kernel touches shared memory (the per-block reservation of sm_80+),
        # kept apart here. Triton's real allocation is dynamic (launch-time).
        "smem_static": v["smem_static"] if "smem_static" in v else res.get("shared", 0),
        "smem_cuobjdump": res.get("shared"),
        "smem_dynamic": dynamic_smem,
        "instrs": len(ops),
    }


AMD_INSTR = re.compile(r"^\s+([a-z][a-z0-9_]*)(?:\s|$)", re.M)


def amd_metrics(hsaco: Path, dynamic_lds: int = 0, mcpu: str = "gfx942") -> dict:
    if not TOOLS["llvm-objdump"]:
        raise RuntimeError("llvm-objdump-22 not found")
    dis = run([TOOLS["llvm-objdump"], "-d", f"--mcpu={mcpu}", str(hsaco)]).stdout
    body = "\n".join(line for line in dis.splitlines() if "//" in line)  # instruction lines carry // addr
    ops = [o for o in AMD_INSTR.findall(body) if o != "s_nop"]
    if not ops:
        raise RuntimeError(f"no instructions disassembled from {hsaco}")
    gl = [o for o in ops if re.match(r"(global|buffer|flat)_load_", o)]
    gs = [o for o in ops if re.match(r"(global|buffer|flat)_store_", o)]
    w128 = lambda o: o.endswith(("_dwordx4", "_b128"))  # noqa: E731
    w64 = lambda o: o.endswith(("_dwordx2", "_b64"))  # noqa: E731
    mfma = {}
    for o in ops:
        if o.startswith(("v_mfma", "v_smfmac", "v_wmma")):
            mfma[o] = mfma.get(o, 0) + 1
    notes = run([TOOLS["llvm-readelf"], "--notes", str(hsaco)]).stdout if TOOLS["llvm-readelf"] else ""

    def note(key):
        m = re.search(rf"\.{key}:\s+(\d+)", notes)
        return int(m.group(1)) if m else None

    return {
        "ld128": sum(map(w128, gl)),
        "ld64": sum(map(w64, gl)),
        "ld_all": len(gl),
        "ld_buffer": sum(o.startswith("buffer_") for o in gl),
        "st128": sum(map(w128, gs)),
        "st64": sum(map(w64, gs)),
        "st_all": len(gs),
        "mma": {"v_mfma": sum(mfma.values())} if mfma else {},
        "mma_kinds": mfma,
        "vgpr": note("vgpr_count"),
        "agpr": note("agpr_count"),
        "sgpr": note("sgpr_count"),
        "vgpr_spill": note("vgpr_spill_count"),
        "sgpr_spill": note("sgpr_spill_count"),
        "scratch": note("private_segment_fixed_size"),
        "lds_static": note("group_segment_fixed_size") or 0,
        "lds_dynamic": dynamic_lds,
        "instrs": len(ops),
    }


# --------------------------------------------------------------------------- Triton
def triton_side(reps: int, keep: Path, log) -> dict:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default; silences its warning
    t0 = time.perf_counter()
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import_s = time.perf_counter() - t0
    sys.path.insert(0, str(HERE))
    import kernels

    info = {"version": triton.__version__, "import_s": import_s, "cold_first_compile_s": {}, "cases": {}}
    # Triton picks its ptxas by arch: the bundled `ptxas-blackwell` (CUDA 13.x) for sm_90+.
    from triton.backends.nvidia.compiler import get_ptxas
    tri_ptxas = get_ptxas(TARGETS["cuda:90"][1]).path
    info["bundled_ptxas"] = run([tri_ptxas, "--version"]).stdout.strip().splitlines()[-2]

    stage_times = {}

    def listener(src, metadata, metadata_group, times, cache_hit):
        stage_times["ir_init_us"] = times.ir_initialization
        stage_times["stages_us"] = dict(times.lowering_stages)
        stage_times["cache_hit"] = cache_hit

    knobs.compilation.listener = listener

    def compile_once(fn, sig, cx, num_warps, tgt):
        backend, arch, warp, _ = TARGETS[tgt]
        attrs = {}
        for i, (name, ty) in enumerate(sig.items()):
            if ty.startswith("*"):
                # 16-byte aligned; on AMD the launcher also marks buffers < 2 GiB
                # (AMDGCN_USE_BUFFER_OPS, on by default) so buffer ops may be used.
                attrs[(i, )] = [["tt.divisibility", 16]] + ([["tt.pointer_range", 32]] if backend == "hip" else [])
            elif ty in ("i32", "i64"):
                attrs[(i, )] = [["tt.divisibility", 16]]  # sizes multiple of 16
        cache = tempfile.mkdtemp(prefix="triton-cache-")
        os.environ["TRITON_CACHE_DIR"] = cache
        knobs.cache.dir = cache
        stage_times.clear()
        t = time.perf_counter()
        ck = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget(backend, arch, warp),
                            options={"num_warps": num_warps})
        dt = time.perf_counter() - t
        shutil.rmtree(cache, ignore_errors=True)
        assert not stage_times.get("cache_hit"), "Triton cache hit despite a fresh TRITON_CACHE_DIR"
        return ck, dt, dict(stage_times)

    for tgt in TARGETS:
        # The first compile in a process pays for loading the backend, LLVM and MLIR
        # initialization: measured once (vector_add), then excluded from the medians.
        fn, sig, cx, nw, _ = kernels.CASES["vector_add"]
        _, dt, _ = compile_once(fn, sig, cx, nw, tgt)
        info["cold_first_compile_s"][tgt] = dt
        log(f"triton {tgt}: first compile in process (vector_add) {dt * 1e3:.0f} ms")
        for name, (fn, sig, cx, nw, ours) in kernels.CASES.items():
            walls, stages = [], []
            for _ in range(reps):
                ck, dt, st = compile_once(fn, sig, cx, nw, tgt)
                walls.append(dt)
                stages.append(st)
            d = keep / "triton" / tgt.replace(":", "_")
            d.mkdir(parents=True, exist_ok=True)
            for ext, v in ck.asm.items():
                p = d / f"{name}.{ext}"
                (p.write_bytes if isinstance(v, bytes) else p.write_text)(v)
            med = lambda key: statistics.median(s["stages_us"].get(key, 0) for s in stages) / 1e6  # noqa: E731
            ir_init = statistics.median(s["ir_init_us"] for s in stages) / 1e6
            md = ck.metadata._asdict()
            case = {"compile_s": statistics.median(walls), "compile_min_s": min(walls), "reps": reps,
                    "num_warps": md.get("num_warps"), "num_stages": md.get("num_stages"), "ours": ours,
                    "stages_s": {"ast->ttir": ir_init, **{k: med(k) for k in stages[0]["stages_us"]}}}
            if TARGETS[tgt][0] == "cuda":
                case["front_s"] = ir_init + sum(med(k) for k in ("ttir", "ttgir", "llir", "ptx"))
                case["back_s"] = med("cubin")
                case["back_what"] = "ptxas (bundled)"
                # Triton's own ptxas, with Triton's flags, again for the -v log.
                v = ptxas_compile(tri_ptxas, d / f"{name}.ptx", d / f"{name}.check.cubin",
                                  ["-lineinfo", "--regAllocOptLevel=2"])
                case["metrics"] = nv_metrics(d / f"{name}.cubin", v, md.get("shared", 0))
                # The project's ptxas on Triton's PTX, with the flags we use for ours.
                if TOOLS["ptxas"]:
                    v2 = ptxas_compile(TOOLS["ptxas"], d / f"{name}.ptx", d / f"{name}.proj.cubin", ["-O3"], reps)
                    case["project_ptxas"] = {"time_s": v2["time_s"],
                                             "metrics": nv_metrics(d / f"{name}.proj.cubin", v2, md.get("shared", 0))}
            else:
                case["front_s"] = ir_init + sum(med(k) for k in ("ttir", "ttgir", "llir", "amdgcn"))
                case["back_s"] = med("hsaco")
                case["back_what"] = "assemble + link"
                case["metrics"] = amd_metrics(d / f"{name}.hsaco", md.get("shared", 0))
            info["cases"][f"{name}|{tgt}"] = case
            log(f"triton {tgt} {name}: {case['compile_s'] * 1e3:.0f} ms (median of {reps})")
    return info


# --------------------------------------------------------------------------- ours
DUR = re.compile(r"(\d+(?:\.\d+)?)\s*(ns|µs|us|ms|s)\b")
UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def pick_stem(stems: list[str], case: str) -> str | None:
    rule = OURS_MATCH[case]
    ok = [s for s in stems if all(n in s for n in rule["need"]) and not any(a in s for a in rule["avoid"])]
    ok.sort(key=lambda s: (-sum(p in s for p in rule["prefer"]), len(s), s))
    return ok[0] if ok else None


def parse_reported_times(stdout: str, stems: list[str]) -> dict:
    """Per-kernel compile times printed by the aot example: a line naming the artifact
    stem (longest match wins) and a duration; after the word "total" if there is one,
    else the last duration on the line."""
    out = {}
    for line in stdout.splitlines():
        names = [s for s in stems if re.search(rf"(?<![\w]){re.escape(s)}(?![\w])", line)]
        durs = list(DUR.finditer(line))
        if not names or not durs:
            continue
        name = max(names, key=len)
        tot = re.search(r"total\D*?" + DUR.pattern, line)
        d = (float(tot.group(1)) * UNIT[tot.group(2)]) if tot else float(durs[-1].group(1)) * UNIT[durs[-1].group(2)]
        out[name] = d
    return out


def ours_side(reps: int, keep: Path, log, timeout: int) -> dict:
    env = dict(os.environ)
    if Path("/usr/lib/llvm-22").exists():
        env.setdefault("LLVM_SYS_221_PREFIX", "/usr/lib/llvm-22")
        env.setdefault("MLIR_SYS_220_PREFIX", "/usr/lib/llvm-22")
        env.setdefault("TABLEGEN_220_PREFIX", "/usr/lib/llvm-22")
        env["PATH"] = f"{ROOT / '.tools' / 'bin'}:/usr/lib/llvm-22/bin:{env['PATH']}"
    info = {"targets": {}}
    if not (ROOT / "examples" / "aot.rs").exists() and not (ROOT / "examples" / "aot").exists():
        info["error"] = "examples/aot.rs does not exist yet"
        return info
    t = time.perf_counter()
    b = run(["cargo", "build", "--release", "--example", "aot"], cwd=ROOT, env=env, timeout=timeout)
    info["build_s"] = time.perf_counter() - t
    if b.returncode != 0:
        info["error"] = "cargo build --example aot failed: " + last_error_line(b.stderr)
        return info
    for tgt, (_, _, _, ours_tgt) in TARGETS.items():
        cmd = ["cargo", "run", "--release", "--example", "aot", "--", "--target", ours_tgt, "--out"]
        walls, per_kernel, ti = [], {}, {"cmd": " ".join(cmd) + " DIR"}
        out_dir = keep / "ours" / tgt.replace(":", "_")
        for _ in range(reps):
            shutil.rmtree(out_dir, ignore_errors=True)
            out_dir.mkdir(parents=True)
            t = time.perf_counter()
            p = run(cmd + [str(out_dir)], cwd=ROOT, env=env, timeout=timeout)
            walls.append(time.perf_counter() - t)
            if p.returncode != 0:
                ti["error"] = f"aot --target {ours_tgt} failed: " + last_error_line(p.stderr or p.stdout)
                break
            ext = ".ptx" if ours_tgt.startswith("sm_") else ".hsaco"
            stems = sorted(f.name[:-len(ext)] for f in out_dir.iterdir() if f.name.endswith(ext))
            ti["stems"] = stems
            ti["stdout"] = p.stdout[-4000:]
            for k, v in parse_reported_times(p.stdout, stems).items():
                per_kernel.setdefault(k, []).append(v)
        ti["process_wall_s"] = statistics.median(walls) if walls else None
        ti["reported_s"] = {k: statistics.median(v) for k, v in per_kernel.items()}
        ti["dir"] = str(out_dir)
        info["targets"][tgt] = ti
        log(f"ours {tgt}: {ti.get('error') or ', '.join(ti.get('stems', []))}")
    return info


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errs = [line for line in lines if line.lower().startswith(("error", "thread 'main' panicked"))]
    return (errs[0] if errs else lines[-1] if lines else "no output")[:200]


def ours_case(ours: dict, case: str, tgt: str, reps: int) -> dict:
    """Our numbers for one Triton case, or {'na': reason}."""
    if "error" in ours:
        return {"na": ours["error"]}
    ti = ours["targets"].get(tgt, {})
    if "error" in ti:
        return {"na": ti["error"]}
    stem = pick_stem(ti.get("stems", []), case)
    if stem is None:
        why = "aot builds no 128x128x32 matmul" if "128" in case else "no matching artifact"
        return {"na": f"{why} (artifacts: {', '.join(ti.get('stems', [])) or 'none'})"}
    d = Path(ti["dir"])
    front = ti["reported_s"].get(stem)
    out = {"stem": stem, "front_s": front}
    try:
        if tgt.startswith("cuda"):
            if not TOOLS["ptxas"]:
                return {"na": "ptxas not found (.tools/bin)"}
            v = ptxas_compile(TOOLS["ptxas"], d / f"{stem}.ptx", d / f"{stem}.cubin", ["-O3"], reps)
            out["back_s"] = v["time_s"]
            out["back_what"] = "ptxas (project)"
            out["metrics"] = nv_metrics(d / f"{stem}.cubin", v, 0)
        else:
            out["back_s"] = None  # inside the reported time (LLVM object + ld.lld)
            out["back_what"] = "in reported time"
            out["metrics"] = amd_metrics(d / f"{stem}.hsaco", 0)
    except Exception as e:  # noqa: BLE001
        return {"na": f"{stem}: {e}"[:200]}
    out["compile_s"] = (front + (out["back_s"] or 0.0)) if front is not None else None
    return out


# --------------------------------------------------------------------------- report
def ms(x):
    return "n/a" if x is None else f"{x * 1e3:.0f}" if x >= 0.0995 else f"{x * 1e3:.1f}"


def fmt_row(case: str, tgt: str, impl: str, c: dict) -> str:
    if "na" in c:
        why = c["na"].replace("|", "\\|").replace("\n", " ")
        return f"| {case} | {tgt} | {impl} | n/a (ours: {why}) | | | | | | | | | |"
    m = c["metrics"]
    mma = ", ".join(f"{k}×{v}" for k, v in m["mma"].items()) or "0"
    if tgt.startswith("cuda"):
        regs = f"{m['regs']}"
        spill = "?" if m["spill_bytes"] is None else f"{m['spill_bytes']} B"
        if m.get("local"):
            spill += f" (local {m['local']} B)"
        smem = f"{m['smem_dynamic']} dyn + {m['smem_static']} static" if m["smem_dynamic"] else f"{m['smem_static']}"
        ld = f"{m['ld128']}/{m['ld64']}/{m['ld_all']}" + (f" ({m['ld_async']} LDGSTS)" if m.get("ld_async") else "")
    else:
        regs = f"v{m['vgpr']} a{m['agpr']} s{m['sgpr']}"
        spill = f"v{m['vgpr_spill']} s{m['sgpr_spill']}, scratch {m['scratch']} B"
        smem = f"{m['lds_dynamic']} dyn + {m['lds_static']} static" if m["lds_dynamic"] else f"{m['lds_static']}"
        ld = f"{m['ld128']}/{m['ld64']}/{m['ld_all']}" + (f" ({m['ld_buffer']} buffer)" if m.get("ld_buffer") else "")
    return (f"| {case} | {tgt} | {impl} | {ms(c.get('compile_s'))} | {ms(c.get('front_s'))} | "
            f"{ms(c.get('back_s'))} | {ld} | {m['st128']}/{m['st64']}/{m['st_all']} | {mma} | {regs} | {spill} | {smem} | "
            f"{m['instrs']} |")


HEADER = ("| kernel | target | impl | compile ms | to PTX/GCN ms | backend ms | global loads 128b/64b/all | "
          "global stores 128b/64b/all | MMA instrs | regs (NV) / VGPR AGPR SGPR (AMD) | spills | "
          "shared/LDS bytes | static instrs |\n|---|---|---|---:|---:|---:|---|---|---|---|---|---|---:|")


def verdicts(tri: dict, ours: dict, rows: dict) -> list[str]:
    out = []
    for tgt in TARGETS:
        pairs = [(case, rows[(case, tgt, "triton")], rows[(case, tgt, "tessera")]) for case in OURS_MATCH
                 if (case, tgt, "triton") in rows]
        have = [(c, t, o) for c, t, o in pairs if "na" not in o]
        if not have:
            why = next((o["na"] for _, _, o in pairs if "na" in o), "not run")
            out.append(f"- **{tgt}**: no Tessera numbers yet ({why}); Triton's are above.")
            continue
        parts = []
        ratios = [(c, o["compile_s"] / t["compile_s"]) for c, t, o in have if o.get("compile_s")]
        if ratios:
            lo, hi = min(r for _, r in ratios), max(r for _, r in ratios)
            parts.append(f"compile time {lo:.2f}–{hi:.2f}× Triton's "
                         f"({'faster' if hi < 1 else 'slower' if lo > 1 else 'mixed'})")
        # Average width of the static global accesses: robust to different unrolling.
        def width(m, kind):
            n = m[f"{kind}_all"]
            return (m[f"{kind}128"] * 128 + m[f"{kind}64"] * 64 + (n - m[f"{kind}128"] - m[f"{kind}64"]) * 32) / n \
                if n else 0

        narrow = [f"{c} ({k}s {width(o['metrics'], k):.0f} vs {width(t['metrics'], k):.0f} bits)"
                  for c, t, o in have for k in ("ld", "st")
                  if width(o["metrics"], k) < width(t["metrics"], k)]
        if narrow:
            parts.append("narrower global accesses than Triton (average width) in " + ", ".join(narrow))
        else:
            parts.append("global access widths on par with Triton")
        for c, t, o in have:
            if t["metrics"]["mma"] and not o["metrics"]["mma"]:
                parts.append(f"{c}: no tensor-core/MFMA instructions (Triton: "
                             f"{', '.join(t['metrics']['mma'])})")
            elif t["metrics"]["mma"] and set(t["metrics"]["mma"]) != set(o["metrics"]["mma"]):
                parts.append(f"{c}: {', '.join(o['metrics']['mma'])} vs Triton's {', '.join(t['metrics']['mma'])}")
        key = "regs" if tgt.startswith("cuda") else "vgpr"
        more = [f"{c} ({o['metrics'][key]} vs {t['metrics'][key]})" for c, t, o in have
                if (o["metrics"][key] or 0) > (t["metrics"][key] or 0) * 1.25]
        if more:
            parts.append("more registers in " + ", ".join(more))
        sp = [c for c, t, o in have if (o["metrics"].get("spill_bytes") or o["metrics"].get("vgpr_spill") or 0) > 0]
        if sp:
            parts.append("spills in " + ", ".join(sp))
        na = [c for c, _, o in pairs if "na" in o]
        if na:
            parts.append("not compared: " + ", ".join(na))
        out.append(f"- **{tgt}**: " + "; ".join(parts) + ".")
    return out


def machine() -> str:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = ""
    try:
        kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration):
        pass
    load = "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{os.cpu_count()}-core {cpu} VM{mem}, {platform.system()} {platform.release()}, no GPU; "
            f"load average at the end {load} (1/5/15 min)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="compiles per kernel and target (median reported)")
    ap.add_argument("--skip-ours", action="store_true", help="Triton only")
    ap.add_argument("--update-benchmarks", action="store_true", help="write the section into BENCHMARKS.md")
    ap.add_argument("--keep", type=Path, default=ROOT / "target" / "vs_triton",
                    help="where the artifacts of both sides are kept (default target/vs_triton)")
    ap.add_argument("--ours-timeout", type=int, default=3600, help="seconds for cargo build / each aot run")
    args = ap.parse_args()
    log = lambda s: print(f"[vs_triton] {s}", file=sys.stderr, flush=True)  # noqa: E731
    shutil.rmtree(args.keep, ignore_errors=True)
    args.keep.mkdir(parents=True)

    tri = triton_side(args.reps, args.keep, log)
    ours = {"error": "skipped (--skip-ours)"} if args.skip_ours else ours_side(
        max(1, min(args.reps, 3)), args.keep, log, args.ours_timeout)

    rows = {}
    for key, c in tri["cases"].items():
        case, tgt = key.split("|")
        rows[(case, tgt, "triton")] = c
        rows[(case, tgt, "tessera")] = ours_case(ours, case, tgt, args.reps)

    date = _dt.date.today().isoformat()
    cmd = "bash benches/vs_triton/run.sh" + (" --update-benchmarks" if args.update_benchmarks else "")
    lines = [
        f"Date: {date}. Machine: {machine()}.",
        f"Command: `{cmd}` (compare.py --reps {args.reps}).",
        f"Triton {tri['version']} (bundled ptxas {tri['bundled_ptxas']}); project tools: ptxas "
        f"{tool_version('ptxas')}, {tool_version('llvm-objdump')}. `import triton`: "
        f"{ms(tri['import_s'])} ms; first compile in a process (vector_add, not in the medians): "
        + ", ".join(f"{t} {ms(s)} ms" for t, s in tri["cold_first_compile_s"].items()) + ".",
        "",
        "Compile times are medians of fresh-cache compiles in one warm process (Triton: `triton.compile`, "
        "AST → cubin/hsaco; Tessera: the per-kernel time the aot example prints, IR build → PTX/HSACO, plus "
        "the project's ptxas timed here for NVIDIA). Instruction counts are static (in the binary), not "
        "executed. Triton's shared memory is dynamic (requested at launch); \"static\" is what ptxas -v "
        "reports. Triton: num_warps=4, its default num_stages (3 on cuda, 2 on "
        "hip); pointers 16-byte aligned, i32 sizes divisible by 16 (plus `tt.pointer_range=32` on hip, as its "
        "launcher does); cuda:90 compiles for sm_90a.",
        "",
        HEADER,
    ]
    for case in OURS_MATCH:
        for tgt in TARGETS:
            for impl in ("triton", "tessera"):
                if (case, tgt, impl) in rows:
                    lines.append(fmt_row(case, tgt, impl, rows[(case, tgt, impl)]))
    walls = {t: ti["process_wall_s"] for t, ti in ours.get("targets", {}).items() if ti.get("process_wall_s")}
    if walls:
        lines += ["", "Tessera aot process wall time (all kernels of a target, including process start): "
                  + ", ".join(f"{t} {ms(w)} ms" for t, w in walls.items()) + "."]
    lines += ["", "Verdict:", "", *verdicts(tri, ours, rows)]
    if tri["cases"] and any("project_ptxas" in c for c in tri["cases"].values()):
        lines += ["", "Triton's PTX through the project's ptxas (`-O3`, same as ours), for a like-for-like "
                  "backend time: " + ", ".join(
                      f"{k.split('|')[0]} {ms(c['project_ptxas']['time_s'])} ms "
                      f"({c['project_ptxas']['metrics']['regs']} regs)"
                      for k, c in tri["cases"].items() if "project_ptxas" in c) + "."]
    table = "\n".join(lines)
    print(table)
    (HERE / "RESULTS.md").write_text(f"# Tessera vs Triton: compile time and generated code\n\n{table}\n")
    (args.keep / "results.json").write_text(json.dumps(
        {"triton": tri, "ours": ours, "rows": {"|".join(k): v for k, v in rows.items()}}, indent=1, default=str))
    if args.update_benchmarks:
        update_benchmarks(ROOT / "BENCHMARKS.md", f"{SECTION}\n\n{table}\n")
        log("BENCHMARKS.md updated")
    return 0


def update_benchmarks(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = re.search(r"^## ", text[start + len(SECTION):], re.M)
        end = start + len(SECTION) + nxt.start() if nxt else len(text)
        text = text[:start] + section + ("\n" + text[end:] if nxt else "")
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())

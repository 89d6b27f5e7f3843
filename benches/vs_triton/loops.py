#!/usr/bin/env python3
"""Main-loop metrics of a matmul kernel, from its machine code.

The main loop is the innermost backward-branch range that holds the most matrix
instructions (HMMA/IMMA/HGMMA/IGMMA/QGMMA on NVIDIA, v_mfma and v_wmma on AMD).
Everything is counted per 64 KFLOP (or integer op) of matrix work per warp: one
m16n8k16 HMMA is 4 KFLOP, an m16n8k32 IMMA 8, an MFMA or WMMA MxNxK 2*M*N*K / 1
(16x16x16: 8 KFLOP), a warpgroup instruction m64nNkK (4 warps) 2*64*N*K / 4 per warp.
AMD's gfx11/gfx12 spellings count as their gfx9 ones (`ds_load`/`ds_store` as
`ds_read`/`ds_write`, `global_load_b128` as 128 bits, gfx12's `s_barrier_wait` as a
barrier).

    python3 loops.py kernel.cubin        # SASS through cuobjdump -sass
    python3 loops.py kernel.s            # AMDGCN assembly (llc / Triton's amdgcn)

Prints one JSON object: instructions, barriers, shared stores and loads, global
loads (count and average width in bits), spill accesses, matrix instructions,
each per 64 KFLOP, and the raw counts of one loop body.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

UNIT = 65536.0


def sass_lines(cubin: Path) -> list[tuple[int, str]]:
    tool = shutil.which("cuobjdump") or str(Path(__file__).resolve().parents[2] / ".tools/bin/cuobjdump")
    out = subprocess.run([tool, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    lines = []
    for line in out.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            lines.append((int(m.group(1), 16), m.group(2).strip()))
    return lines


def mma_flop(ins: str) -> float:
    """FLOP per warp of one matrix instruction: `HMMA.16816` / `IMMA.16832` (m16n8kK,
    one warp), `HGMMA` / `IGMMA` / `QGMMA.64xNxK` (a warpgroup of 4 warps)."""
    op = ins.split()[0] if not ins.startswith("@") else ins.split()[1]
    if m := re.match(r"[HI]MMA\.168(\d+)", op):
        return 2 * 16 * 8 * int(m.group(1))
    if m := re.match(r"[HIQ]GMMA\.64x(\d+)x(\d+)", op):
        return 2 * 64 * int(m.group(1)) * int(m.group(2)) / 4
    return 0.0


def nv_metrics(cubin: Path) -> dict:
    lines = sass_lines(cubin)
    addr = {a: i for i, (a, _) in enumerate(lines)}
    loops = []
    for i, (a, ins) in enumerate(lines):
        m = re.search(r"\bBRA\b.*?(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ins)
        t = re.search(r"0x([0-9a-f]+)", ins) if "BRA" in ins else None
        if t is None:
            continue
        target = int(t.group(1), 16)
        if target < a and target in addr:
            loops.append((addr[target], i))
    best = None
    for lo, hi in loops:
        body = [ins for _, ins in lines[lo : hi + 1]]
        flop = sum(mma_flop(x) for x in body)
        if flop and (best is None or (flop, -(hi - lo)) > (best[0], -(best[2] - best[1]))):
            best = (flop, lo, hi)
    if best is None:
        return {"error": "no loop with matrix instructions"}
    flop, lo, hi = best
    body = [ins for _, ins in lines[lo : hi + 1]]
    op = lambda x: x.split()[0] if not x.startswith("@") else x.split()[1]
    ops = [op(x) for x in body]
    glds = [x for x in body if op(x).startswith(("LDG", "LDGSTS"))]
    width = lambda x: int(m.group(1)) if (m := re.search(r"\.(\d+)\b", op(x))) and int(m.group(1)) in (16, 32, 64, 128) else 32
    raw = {
        "instructions": len(body),
        "barriers": sum(o.startswith(("BAR", "BSYNC.RECONVERGENT")) and o.startswith("BAR") for o in ops),
        "shared_stores": sum(o.startswith("STS") for o in ops),
        "shared_loads": sum(o.startswith(("LDS", "LDSM")) for o in ops),
        "ldmatrix": sum(o.startswith("LDSM") for o in ops),
        "cp_async": sum(o.startswith("LDGSTS") for o in ops),
        "global_loads": len(glds),
        "spills": sum(o.startswith(("STL", "LDL")) for o in ops),
        "matrix": sum(o.startswith(("HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA")) for o in ops),
    }
    out = {k: round(v * UNIT / flop, 2) for k, v in raw.items()}
    out["global_load_bits"] = round(sum(width(x) for x in glds) / len(glds), 1) if glds else 0
    out["raw"] = raw
    out["flop_per_iteration_per_warp"] = flop
    return out


def mfma_flop(ins: str) -> float:
    m = re.match(r"v_(?:mfma|wmma)_\w+?_(\d+)x(\d+)x(\d+)", ins)
    return 2.0 * int(m.group(1)) * int(m.group(2)) * int(m.group(3)) if m else 0.0


def amd_metrics(asm: Path) -> dict:
    text = asm.read_text().splitlines()
    label_at: dict[str, int] = {}
    lines: list[str] = []
    for line in text:
        s = line.split(";")[0].strip()
        if not s or s.startswith(".") and not s.endswith(":"):
            continue
        if s.endswith(":"):
            label_at[s[:-1]] = len(lines)
            continue
        lines.append(s)
    best = None
    for i, ins in enumerate(lines):
        m = re.match(r"s_cbranch_\w+\s+(\S+)|s_branch\s+(\S+)", ins)
        if not m:
            continue
        tgt = label_at.get(m.group(1) or m.group(2))
        if tgt is None or tgt > i:
            continue
        body = lines[tgt : i + 1]
        flop = sum(mfma_flop(x) for x in body)
        if flop and (best is None or flop > best[0]):
            best = (flop, tgt, i)
    if best is None:
        return {"error": "no loop with matrix instructions"}
    flop, lo, hi = best
    body = lines[lo : hi + 1]
    ops = [x.split()[0] for x in body]
    glds = [o for o in ops if o.startswith(("global_load", "buffer_load"))]
    wbits = {"dword": 32, "dwordx2": 64, "dwordx3": 96, "dwordx4": 128, "ushort": 16, "short_d16": 16,
             "b32": 32, "b64": 64, "b96": 96, "b128": 128, "u16": 16, "d16_b16": 16}
    width = lambda o: next((v for k, v in sorted(wbits.items(), key=lambda kv: -len(kv[0])) if o.endswith(k)), 32)
    raw = {
        "instructions": len(body),
        "barriers": sum(o in ("s_barrier", "s_barrier_wait") for o in ops),
        "shared_stores": sum(o.startswith(("ds_write", "ds_store")) for o in ops),
        "shared_loads": sum(o.startswith(("ds_read", "ds_load")) for o in ops),
        "global_loads": len(glds),
        "spills": sum("scratch_" in o or o.startswith("buffer_store_dword") and "off" in o for o in ops),
        "exec_branches": sum(o.startswith(("s_and_saveexec", "s_cbranch_execz")) for o in ops),
        "matrix": sum(o.startswith(("v_mfma", "v_wmma")) for o in ops),
    }
    out = {k: round(v * UNIT / flop, 2) for k, v in raw.items()}
    out["global_load_bits"] = round(sum(width(o) for o in glds) / len(glds), 1) if glds else 0
    out["raw"] = raw
    out["flop_per_iteration_per_warp"] = flop
    return out


def main() -> int:
    p = Path(sys.argv[1])
    print(json.dumps(nv_metrics(p) if p.suffix == ".cubin" else amd_metrics(p), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

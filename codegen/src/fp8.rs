//! `dot` on the 8-bit floats where the target has no 8-bit float matrix instruction.
//!
//! Every `f8e4m3` and `f8e5m2` value is exactly an f16 (E5M2 is the top byte of an
//! f16; E4M3's range, ±448 down to 2^-9, lies inside f16's), and a product of two
//! f16 is exact in f32. So a `dot` of 8-bit floats equals the same `dot` of its
//! operands cast to f16, which the f16 matrix path (`mma.sync`, MFMA, `wgmma`)
//! computes. [`upcast_dots`] rewrites every 8-bit float `dot` of a kernel that way, on
//! a copy, before lowering, when the target cannot multiply one of them as it is:
//!
//! - sm_90a's `wgmma` takes E4M3/E5M2 operands directly (`m64nNk32.f32.e4m3.e4m3`)
//!   when both are K-major in shared memory; a `dot` whose B is not takes f16 `wgmma`
//!   (the warpgroup instructions are Hopper's fast path, not `mma.sync`);
//! - sm_89 takes `mma.sync` m16n8k32 `.e4m3`/`.e5m2` (`QMMA` in the SASS), for which
//!   the kernel's PTX declares ISA 8.4 (CUDA 12.4 drivers or later; every other kernel
//!   stays at 8.0). sm_80, sm_86 and sm_90 lower the `dot` as it is too, with that
//!   instruction's 8-bit fragments (8-bit arrays in shared memory, `cp.async` rings),
//!   each converted to f16 in registers for two f16 `mma.sync` m16n8k16
//!   (`lower::arch::fp8_mma_as_f16`; on sm_90 ptxas compiles the 8-bit instruction
//!   to the same, but only from ISA 8.4). Casting whole operand tiles here instead
//!   keeps two f16 tiles live in registers (a 128x128x128 tile spilled on sm_80 and
//!   sm_90) and loads a B contiguous along `k` a byte at a time;
//! - gfx942's MFMA 8-bit float instructions read the FNUZ formats (exponent bias 8
//!   and 16, a single NaN `0x80`, no negative zero, no infinities), not the OCP
//!   formats Tessera's types are: the f16 MFMA gives the exact product instead.

use tessera_ir::ir::{Function, Op, OpKind, Region};
use tessera_ir::{ScalarType, ValueId};

/// `f` with every 8-bit-float `dot` taking its operands cast to f16; `None` when
/// there is none to rewrite.
pub fn upcast_dots(f: &Function) -> Option<Function> {
    let mut g = f.clone();
    let mut body = std::mem::take(&mut g.body);
    let changed = rewrite(&mut g, &mut body);
    g.body = body;
    changed.then_some(g)
}

/// Whether `f` has a `dot` of 8-bit floats.
pub fn has_fp8_dot(f: &Function) -> bool {
    fn any(f: &Function, r: &Region) -> bool {
        r.ops.iter().any(|o| {
            (o.kind == OpKind::Dot && is_fp8_dot(f, o)) || o.regions.iter().any(|s| any(f, s))
        })
    }
    any(f, &f.body)
}

fn is_fp8_dot(f: &Function, op: &Op) -> bool {
    f.ty(op.operands[0])
        .scalar_type()
        .is_some_and(ScalarType::is_fp8)
}

fn rewrite(f: &mut Function, r: &mut Region) -> bool {
    let mut changed = false;
    let mut i = 0;
    while i < r.ops.len() {
        for sub in &mut r.ops[i].regions {
            changed |= rewrite(f, sub);
        }
        if r.ops[i].kind != OpKind::Dot || !is_fp8_dot(f, &r.ops[i]) {
            i += 1;
            continue;
        }
        let span = r.ops[i].span.clone();
        let mut casts = Vec::new();
        for which in 0..2 {
            let v: ValueId = r.ops[i].operands[which];
            let ty = f.ty(v).with_elem(tessera_ir::Elem::Scalar(ScalarType::F16));
            let out = f.new_value(ty);
            casts.push(Op {
                kind: OpKind::Cast,
                operands: vec![v],
                results: vec![out],
                regions: Vec::new(),
                span: span.clone(),
            });
            r.ops[i].operands[which] = out;
        }
        let n = casts.len();
        r.ops.splice(i..i, casts);
        i += n + 1;
        changed = true;
    }
    changed
}

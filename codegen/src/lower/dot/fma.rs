//! The FMA `dot` (every target and type): `a` and `b` go to shared memory row-major
//! (16-byte stores where a thread's registers hold consecutive elements); every
//! thread computes the accumulator elements its registers hold (in the
//! accumulator's own layout, so no conversion) with a loop over `k`, adding products
//! in increasing `k` without fusing — bit-exact with the interpreter.

use inkwell::values::{BasicValueEnum, FloatValue};
use tessera_ir::ScalarType;
use tessera_ir::ir::Op;

use super::smem::{row_runs, write_tile};
use crate::lower::{LResult, Lowerer, Tile};

pub(super) fn lower_fma<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let a = l.val(op.operands[0])?;
    let b = l.val(op.operands[1])?;
    let c = l.val(op.operands[2])?;
    let (m, k) = (a.layout.shape[0], a.layout.shape[1]);
    let n = b.layout.shape[1];
    let s = a.elem.scalar().unwrap_or(ScalarType::F32);
    let acc_s = c.elem.scalar().unwrap_or(ScalarType::F32);
    let size = crate::lower::type_bytes(a.elem);
    let a_elems = (m * k).div_ceil(16 / size.min(16)) * (16 / size.min(16));
    let base = l.scratch((a_elems + k * n) * size, &op.span);
    let mt = l.mem_ty(a.elem);
    // Row-major, `b` right after `a` (rounded to 16 bytes): runs of consecutive
    // elements stay consecutive.
    let vec = 16 / size.clamp(1, 16);
    write_tile(l, &a, base, &row_runs(vec.min(k)), Ok)?;
    let boff = l.cx.i32(a_elems as i64);
    write_tile(l, &b, base, &row_runs(vec.min(n)), |e| {
        Ok(l.cx.b.build_int_add(e, boff, "")?)
    })?;
    l.barrier()?;
    let lay = c.layout.clone();
    let idx = l.elem_indices(&lay)?;
    let nb = n.trailing_zeros() as i64;
    let mut rows = Vec::new();
    let mut cols = Vec::new();
    for e in &idx {
        let r = l.cx.b.build_right_shift(*e, l.cx.i32(nb), false, "")?;
        rows.push(l.cx.b.build_int_mul(r, l.cx.i32(k as i64), "")?);
        let c0 = l.cx.b.build_and(*e, l.cx.i32(n as i64 - 1), "")?;
        cols.push(l.cx.b.build_int_add(c0, boff, "")?);
    }
    let nregs = c.regs.len();
    let pre = l.cx.cur_block();
    let head = l.cx.ctx.append_basic_block(l.kernel, "dot.k");
    let exit = l.cx.ctx.append_basic_block(l.kernel, "dot.done");
    l.cx.b.build_unconditional_branch(head)?;
    l.cx.b.position_at_end(head);
    let kphi = l.cx.b.build_phi(l.cx.ctx.i32_type(), "k")?;
    kphi.add_incoming(&[(&l.cx.i32(0), pre)]);
    let acc_ty = l.ty(c.elem);
    let mut phis = Vec::with_capacity(nregs);
    for r in 0..nregs {
        let p = l.cx.b.build_phi(acc_ty, "")?;
        p.add_incoming(&[(&c.regs[r], pre)]);
        phis.push(p);
    }
    let kv = kphi.as_basic_value().into_int_value();
    let kn = l.cx.b.build_int_mul(kv, l.cx.i32(n as i64), "")?;
    let mut out: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(nregs);
    for r in 0..nregs {
        let pa = l.smem_ptr(base, mt, l.cx.b.build_int_add(rows[r], kv, "")?)?;
        let pb = l.smem_ptr(base, mt, l.cx.b.build_int_add(cols[r], kn, "")?)?;
        let av = l.smem_load(mt, pa)?;
        let bv = l.smem_load(mt, pb)?;
        let acc = phis[r].as_basic_value();
        let v: BasicValueEnum<'ctx> = if acc_s.is_float() {
            let (x, y) = (widen(l, s, av)?, widen(l, s, bv)?);
            let p = l.cx.b.build_float_mul(x, y, "")?;
            l.cx.b
                .build_float_add(acc.into_float_value(), p, "")?
                .into()
        } else {
            let it = acc_ty.into_int_type();
            let x = l.cx.b.build_int_s_extend(av.into_int_value(), it, "")?;
            let y = l.cx.b.build_int_s_extend(bv.into_int_value(), it, "")?;
            let p = l.cx.b.build_int_mul(x, y, "")?;
            l.cx.b.build_int_add(acc.into_int_value(), p, "")?.into()
        };
        out.push(v);
    }
    let k1 = l.cx.b.build_int_add(kv, l.cx.i32(1), "")?;
    let latch = l.cx.cur_block();
    kphi.add_incoming(&[(&k1, latch)]);
    for (p, v) in phis.iter().zip(&out) {
        p.add_incoming(&[(v, latch)]);
    }
    let more =
        l.cx.b
            .build_int_compare(inkwell::IntPredicate::ULT, k1, l.cx.i32(k as i64), "")?;
    l.cx.b.build_conditional_branch(more, head, exit)?;
    l.cx.b.position_at_end(exit);
    l.barrier()?;
    Ok(Tile {
        elem: c.elem,
        layout: lay,
        regs: out,
        uniform: false,
    })
}

pub(super) fn widen<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    s: ScalarType,
    v: BasicValueEnum<'ctx>,
) -> LResult<FloatValue<'ctx>> {
    let f = v.into_float_value();
    Ok(match s {
        ScalarType::F16 | ScalarType::BF16 => l.cx.b.build_float_ext(f, l.cx.ctx.f32_type(), "")?,
        _ => f,
    })
}

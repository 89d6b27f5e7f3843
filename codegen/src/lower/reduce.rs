//! `reduce` and `scan`.
//!
//! `reduce` combines, in order: the registers of a thread that hold elements along
//! the axis; then lanes, by butterfly shuffles over the lane bits whose bases lie in
//! the axis; then warps, through shared memory (each warp writes its partials, every
//! thread combines the partials of its result elements in warp order). The result has
//! the [`Layout::sliced`] layout, replicated over the combined lanes and warps.
//!
//! `scan` goes through shared memory: the tile is written in row-major order, one
//! thread per line (position off the axis) walks the line combining sequentially and
//! writing prefixes in place, then every thread reads its elements back. The cost is
//! O(axis length) sequential steps per line; the rounding matches the interpreter.

use inkwell::values::{BasicValueEnum, IntValue};
use tessera_ir::ir::{Op, ReduceOp};
use tessera_ir::{Elem, ScalarType};

use super::elementwise::{binary, scalar_of};
use super::{LResult, Lowerer, Tile};
use crate::layout::{Layout, numel, slice_bit_images};

fn combine<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: ReduceOp,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    b: BasicValueEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    binary(&l.cx, op.binary(), s, a, b)
}

/// Shuffles any scalar (up to 64 bits) with the arch's `i32` shuffle.
pub(super) fn shuffle<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    v: BasicValueEnum<'ctx>,
    mask: u32,
) -> LResult<BasicValueEnum<'ctx>> {
    let b = &l.cx.b;
    let ty = v.get_type();
    let i32t = l.cx.ctx.i32_type();
    let bits = match ty {
        inkwell::types::BasicTypeEnum::IntType(t) => t.get_bit_width(),
        inkwell::types::BasicTypeEnum::FloatType(_) => {
            let td = l.cx.ctx.f64_type();
            if ty == td.into() {
                64
            } else if ty == l.cx.ctx.f32_type().into() {
                32
            } else {
                16
            }
        }
        _ => 64,
    };
    let it = l.cx.int_ty(bits);
    let x = if ty.is_int_type() {
        v.into_int_value()
    } else {
        b.build_bit_cast(v, it, "")?.into_int_value()
    };
    let out: IntValue = if bits <= 32 {
        let w = if bits < 32 {
            b.build_int_z_extend(x, i32t, "")?
        } else {
            x
        };
        let site = l.new_site("shuffle");
        let s = l.arch.shuffle_xor(&l.cx, w, mask, l.lane, site)?;
        if bits < 32 {
            b.build_int_truncate(s, it, "")?
        } else {
            s
        }
    } else {
        let i64t = l.cx.ctx.i64_type();
        let lo = b.build_int_truncate(x, i32t, "")?;
        let hi = b.build_int_truncate(
            b.build_right_shift(x, i64t.const_int(32, false), false, "")?,
            i32t,
            "",
        )?;
        let site = l.new_site("shuffle");
        let lo = l.arch.shuffle_xor(&l.cx, lo, mask, l.lane, site)?;
        let hi = l.arch.shuffle_xor(&l.cx, hi, mask, l.lane, site)?;
        let lo = b.build_int_z_extend(lo, i64t, "")?;
        let hi = b.build_left_shift(
            b.build_int_z_extend(hi, i64t, "")?,
            i64t.const_int(32, false),
            "",
        )?;
        b.build_or(lo, hi, "")?
    };
    Ok(if ty.is_int_type() {
        out.into()
    } else {
        b.build_bit_cast(out, ty, "")?
    })
}

pub(super) fn lower_reduce<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    axis: usize,
    rop: ReduceOp,
) -> LResult<Tile<'ctx>> {
    let mut t = l.val(op.operands[0])?;
    let s = scalar_of(t.elem);
    if !t.layout.is_bit_layout() {
        let c = l.canonical(&t.layout.shape.clone());
        t = l.convert(&t, &c, &op.span)?;
    }
    let src = t.layout.clone();
    let (_, amask) = slice_bit_images(&src.shape, axis);
    let in_axis = |b: u32| b & amask != 0;
    // 1. Registers.
    let kept: Vec<usize> = (0..src.reg.len())
        .filter(|&i| !in_axis(src.reg[i]))
        .collect();
    let red: Vec<usize> = (0..src.reg.len())
        .filter(|&i| in_axis(src.reg[i]))
        .collect();
    let mut regs = Vec::with_capacity(1 << kept.len());
    for rr in 0..1usize << kept.len() {
        let base: usize = kept
            .iter()
            .enumerate()
            .filter(|(j, _)| rr >> j & 1 == 1)
            .map(|(_, &i)| 1 << i)
            .sum();
        // Combine in increasing element order along the axis.
        let mut members: Vec<usize> = (0..1usize << red.len())
            .map(|k| {
                base + red
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| k >> j & 1 == 1)
                    .map(|(_, &i)| 1usize << i)
                    .sum::<usize>()
            })
            .collect();
        members.sort_by_key(|&r| src.reg_offset(r as u32));
        let vals: Vec<BasicValueEnum<'ctx>> = members.iter().map(|&m| t.regs[m]).collect();
        let acc = match float_extreme(l, rop, s, &vals)? {
            Some(v) => v,
            None => {
                let mut acc = vals[0];
                for &v in &vals[1..] {
                    acc = combine(l, rop, s, acc, v)?;
                }
                acc
            }
        };
        regs.push(acc);
    }
    // 2. Lanes.
    for (i, &b) in src.lane.iter().enumerate() {
        if in_axis(b) {
            for r in regs.iter_mut() {
                let o = shuffle(l, *r, 1 << i)?;
                *r = combine(l, rop, s, *r, o)?;
            }
        }
    }
    let res = src.sliced(axis);
    // 3. Warps.
    let wbits: Vec<usize> = (0..src.warp.len())
        .filter(|&i| in_axis(src.warp[i]))
        .collect();
    if !wbits.is_empty() {
        let mt = l.mem_ty(t.elem);
        let nres = numel(&res.shape);
        let nw = 1u32 << wbits.len();
        let size = super::type_bytes(t.elem);
        let base = l.scratch(nres * nw * size, &op.span);
        let b = &l.cx.b;
        let mut widx = l.cx.i32(0);
        for (j, &i) in wbits.iter().enumerate() {
            let bit = b.build_and(
                b.build_right_shift(l.warp, l.cx.i32(i as i64), false, "")?,
                l.cx.i32(1),
                "",
            )?;
            widx = b.build_or(widx, b.build_left_shift(bit, l.cx.i32(j as i64), "")?, "")?;
        }
        let idx = l.elem_indices(&res)?;
        let wofs = l.cx.b.build_int_mul(widx, l.cx.i32(nres as i64), "")?;
        for (r, e) in idx.iter().enumerate() {
            let a = l.cx.b.build_int_add(wofs, *e, "")?;
            let p = l.smem_ptr(base, mt, a)?;
            let v = l.store_to_mem(t.elem, regs[r])?;
            l.smem_store(p, v)?;
        }
        l.barrier()?;
        for (r, e) in idx.iter().enumerate() {
            let mut acc: Option<BasicValueEnum> = None;
            for w in 0..nw {
                let a = l.cx.b.build_int_add(*e, l.cx.i32((w * nres) as i64), "")?;
                let p = l.smem_ptr(base, mt, a)?;
                let v = load_reg(l, t.elem, p)?;
                acc = Some(match acc {
                    None => v,
                    Some(x) => combine(l, rop, s, x, v)?,
                });
            }
            regs[r] = acc.expect("at least one warp");
        }
        l.barrier()?;
    }
    Ok(Tile {
        elem: t.elem,
        layout: res,
        regs,
        uniform: false,
    })
}

/// The NaN-propagating `max`/`min` of four or more `f32` registers, split in two:
/// the extreme with NaNs ruled out (`llvm.maximum`/`minimum` with `nnan`, which keeps
/// `-0 < +0` and becomes one `v_max_f32`, three operands at a time, on AMD) and a
/// separate unordered test of the pairs, selecting NaN when any was NaN. The result
/// is the same as the chain of `maximum`s (a NaN is the canonical quiet NaN), at about
/// half the cost of expanding each `maximum` into a max, an ordered compare and a
/// select (`None` for other ops and types, fewer registers, and targets with a
/// NaN-propagating max instruction, [`super::arch::Arch::native_nan_max`]).
fn float_extreme<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    rop: ReduceOp,
    s: ScalarType,
    vals: &[BasicValueEnum<'ctx>],
) -> LResult<Option<BasicValueEnum<'ctx>>> {
    let name = match rop {
        ReduceOp::Max => "llvm.maximum",
        ReduceOp::Min => "llvm.minimum",
        _ => return Ok(None),
    };
    if s != ScalarType::F32 || vals.len() < 4 || l.arch.native_nan_max() {
        return Ok(None);
    }
    let cx = &l.cx;
    let f32t = cx.ctx.f32_type();
    let mut acc = vals[0].into_float_value();
    for v in &vals[1..] {
        let r = cx.call_intrinsic(name, &[f32t.into()], &[acc.into(), *v])?;
        super::arch::with_fast_math(r, inkwell::llvm_sys::LLVMFastMathNoNaNs);
        acc = r.into_float_value();
    }
    let mut any_nan: Option<IntValue<'ctx>> = None;
    for pair in vals.chunks(2) {
        let (x, y) = (
            pair[0].into_float_value(),
            pair[pair.len() - 1].into_float_value(),
        );
        let u =
            cx.b.build_float_compare(inkwell::FloatPredicate::UNO, x, y, "")?;
        any_nan = Some(match any_nan {
            Some(a) => cx.b.build_or(a, u, "")?,
            None => u,
        });
    }
    let nan = f32t.const_float(f64::NAN);
    let any_nan = any_nan.expect("at least four values");
    Ok(Some(cx.b.build_select(any_nan, nan, acc, "")?))
}

/// Only i1 needs a different memory type; `combine` works on the register type, so
/// scans of i1 convert on the way in and out.
fn load_reg<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    e: Elem,
    p: inkwell::values::PointerValue<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    let v = l.smem_load(l.mem_ty(e), p)?;
    l.reg_from_mem(e, v)
}

pub(super) fn lower_scan<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    axis: usize,
    rop: ReduceOp,
    reverse: bool,
) -> LResult<Tile<'ctx>> {
    let t = l.val(op.operands[0])?;
    let s = scalar_of(t.elem);
    let shape = t.layout.shape.clone();
    let n = shape[axis];
    if n == 1 {
        return Ok(t);
    }
    let inner: u32 = shape[axis + 1..].iter().product();
    let outer: u32 = shape[..axis].iter().product();
    let lines = outer * inner;
    let mt = l.mem_ty(t.elem);
    let base = l.scratch(numel(&shape) * super::type_bytes(t.elem), &op.span);
    let lay: Layout = t.layout.clone();
    let idx = l.elem_indices(&lay)?;
    for (r, e) in idx.iter().enumerate() {
        if super::is_dup_reg(&lay, r) {
            continue;
        }
        let p = l.smem_ptr(base, mt, *e)?;
        let v = l.store_to_mem(t.elem, t.regs[r])?;
        l.smem_store(p, v)?;
    }
    l.barrier()?;
    let nthreads = l.ws * l.nw;
    for j in 0..lines.div_ceil(nthreads) {
        let line =
            l.cx.b
                .build_int_add(l.tid, l.cx.i32((j * nthreads) as i64), "line")?;
        let in_range = l.cx.b.build_int_compare(
            inkwell::IntPredicate::ULT,
            line,
            l.cx.i32(lines as i64),
            "",
        )?;
        let head = l.cx.ctx.append_basic_block(l.kernel, "scan.head");
        let body = l.cx.ctx.append_basic_block(l.kernel, "scan.body");
        let done = l.cx.ctx.append_basic_block(l.kernel, "scan.done");
        let bb = &l.cx.b;
        // line = o * inner + i; element (o, k, i) = o*n*inner + k*inner + i.
        let o = bb.build_int_unsigned_div(line, l.cx.i32(inner as i64), "")?;
        let i = bb.build_int_unsigned_rem(line, l.cx.i32(inner as i64), "")?;
        let lbase = bb.build_int_add(
            bb.build_int_mul(o, l.cx.i32((n * inner) as i64), "")?,
            i,
            "",
        )?;
        let at = |k: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
            let kk = if reverse {
                l.cx.b.build_int_sub(l.cx.i32(n as i64 - 1), k, "")?
            } else {
                k
            };
            Ok(l.cx.b.build_int_add(
                lbase,
                l.cx.b.build_int_mul(kk, l.cx.i32(inner as i64), "")?,
                "",
            )?)
        };
        let start = l.cx.ctx.append_basic_block(l.kernel, "scan.start");
        l.cx.b.build_conditional_branch(in_range, start, done)?;
        l.cx.b.position_at_end(start);
        let first = l.smem_ptr(base, mt, at(l.cx.i32(0))?)?;
        let a0 = load_reg(l, t.elem, first)?;
        let pre = l.cx.cur_block();
        l.cx.b.build_unconditional_branch(head)?;
        l.cx.b.position_at_end(head);
        let kphi = l.cx.b.build_phi(l.cx.ctx.i32_type(), "k")?;
        let aphi = l.cx.b.build_phi(a0.get_type(), "acc")?;
        kphi.add_incoming(&[(&l.cx.i32(1), pre)]);
        aphi.add_incoming(&[(&a0, pre)]);
        l.cx.b.build_unconditional_branch(body)?;
        l.cx.b.position_at_end(body);
        let k = kphi.as_basic_value().into_int_value();
        let p = l.smem_ptr(base, mt, at(k)?)?;
        let x = load_reg(l, t.elem, p)?;
        let acc = combine(l, rop, s, aphi.as_basic_value(), x)?;
        let mv = l.store_to_mem(t.elem, acc)?;
        l.smem_store(p, mv)?;
        let k1 = l.cx.b.build_int_add(k, l.cx.i32(1), "")?;
        let more =
            l.cx.b
                .build_int_compare(inkwell::IntPredicate::ULT, k1, l.cx.i32(n as i64), "")?;
        let end = l.cx.cur_block();
        kphi.add_incoming(&[(&k1, end)]);
        aphi.add_incoming(&[(&acc, end)]);
        l.cx.b.build_conditional_branch(more, head, done)?;
        l.cx.b.position_at_end(done);
    }
    l.barrier()?;
    let mut regs = Vec::with_capacity(idx.len());
    for e in idx {
        let p = l.smem_ptr(base, mt, e)?;
        regs.push(load_reg(l, t.elem, p)?);
    }
    l.barrier()?;
    Ok(Tile {
        elem: t.elem,
        layout: lay,
        regs,
        uniform: false,
    })
}

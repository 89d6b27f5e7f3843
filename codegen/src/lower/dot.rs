//! `dot`: matrix units where the target has them, an FMA loop everywhere else.
//!
//! **FMA path** (every target and type): `a` and `b` go to shared memory row-major
//! (16-byte stores where a thread's registers hold consecutive elements); every
//! thread computes the accumulator elements its registers hold (in the
//! accumulator's own layout, so no conversion) with a loop over `k`, adding products
//! in increasing `k` without fusing — bit-exact with the interpreter.
//!
//! **Matrix path** (f16/bf16 inputs, f32 accumulator, `M`, `N`, `K` multiples of the
//! instruction shape; `mma.sync` m16n8k16 on sm_80+; on gfx90a/gfx942 MFMA 32x32x8
//! where the tile is a multiple of 32x32, else 16x16x16, [`Arch::mma_for`](super::arch::Arch::mma_for)):
//! `a` is stored row-major (16-byte stores of the 8 consecutive `k` a thread loaded)
//! and `b` transposed (`[N][K]`, so both operands' fragments are runs of consecutive
//! `k`), each row padded by 8 elements (16 bytes) so that the fragment loads of the 8
//! row groups hit distinct banks (and every row starts 16-byte aligned). On NVIDIA the
//! fragments are read with `ldmatrix` (`.x4` per 16x16 A tile, `.x4`/`.x2` per pair
//! of / single n8 B tile); elsewhere with vector loads of each run. Warps tile `M` first, then
//! `N`; each warp loops over its `reps_m × reps_n` instruction tiles for every
//! `k`-step. The accumulator layout ([`mma_layout`]) is the instruction's C fragment
//! repeated over tiles: register bits = fragment bits, then `N` repeats, then `M`
//! repeats; warp bits = `M` tiles, then `N` tiles (extra warps replicate).

use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue};
use tessera_ir::ir::Op;
use tessera_ir::{Elem, ScalarType};

use super::arch::{FragInfo, MmaInfo};
use super::{LResult, Lowerer, Tile};
use crate::layout::Layout;

const PAD: u32 = 8;

struct Plan {
    info: MmaInfo,
    warps_m: u32,
    warps_n: u32,
    reps_m: u32,
    reps_n: u32,
}

fn plan(l: &Lowerer<'_, '_>, op: &Op) -> Option<Plan> {
    let a = l.f.ty(op.operands[0]);
    let b = l.f.ty(op.operands[1]);
    let s = a.scalar_type()?;
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let info = l.arch.mma_for(s, m, n, k, l.nw)?;
    if m % info.m != 0 || n % info.n != 0 || k % info.k != 0 {
        return None;
    }
    let warps_m = l.nw.min(m / info.m);
    let warps_n = (l.nw / warps_m).min(n / info.n);
    Some(Plan {
        reps_m: m / (info.m * warps_m),
        reps_n: n / (info.n * warps_n),
        info,
        warps_m,
        warps_n,
    })
}

/// Whether `dot` stages its B operand transposed (`[N][K]`): on the matrix path of
/// targets without `ldmatrix`.
fn b_transposed(l: &Lowerer<'_, '_>, p: &Plan) -> bool {
    !(l.arch.has_ldmatrix() && (p.info.m, p.info.n, p.info.k) == (16, 8, 16))
}

/// The layout a load that feeds only `dot` operands should produce, given its shape
/// and the 16-byte vector width: for a B operand staged transposed, each thread holds
/// `vec` consecutive `n` (one 16-byte load) of 2 consecutive `k` rows, so the staging
/// writes pairs of consecutive `k` (32-bit stores) instead of single elements; `None`
/// for the default 16-byte blocked layout.
pub(super) fn operand_load_layout(
    l: &Lowerer<'_, '_>,
    v: tessera_ir::ValueId,
    shape: &[u32],
    vec: u32,
) -> Option<Layout> {
    let uses = l.dot_uses(v);
    let all_bt = !uses.is_empty()
        && uses
            .iter()
            .all(|&(op, i)| i == 1 && plan(l, op).is_some_and(|p| b_transposed(l, &p)));
    if !all_bt || shape.len() != 2 {
        return None;
    }
    let (kb, nb) = (shape[0].trailing_zeros(), shape[1].trailing_zeros());
    let threads = (l.ws * l.nw).trailing_zeros();
    let vb = vec.trailing_zeros().min(nb);
    // k bits in registers: at most 1 (pairs), and only if the threads still cover
    // the tile with the rest.
    let rk = u32::from(kb >= 1 && vb + 1 + threads <= kb + nb);
    // Flat index bits: n is bits 0..nb, k is bits nb..nb + kb.
    let mut order: Vec<u32> = (0..vb).collect(); // n vector
    order.extend((0..rk).map(|i| nb + i)); // k pairs
    order.extend(vb..nb); // the rest of n
    order.extend(nb + rk..nb + kb); // the rest of k
    let bits = |range: std::ops::Range<usize>| -> Vec<u32> {
        range.map(|i| order.get(i).map_or(0, |&b| 1 << b)).collect()
    };
    let (nreg0, nlane, nwarp) = (
        (vb + rk) as usize,
        l.ws.trailing_zeros() as usize,
        l.nw.trailing_zeros() as usize,
    );
    let mut reg = bits(0..nreg0);
    let lane = bits(nreg0..nreg0 + nlane);
    let warp = bits(nreg0 + nlane..nreg0 + nlane + nwarp);
    reg.extend(order.iter().skip(nreg0 + nlane + nwarp).map(|&b| 1u32 << b));
    Some(Layout {
        shape: shape.to_vec(),
        reg,
        lane,
        warp,
    })
}

/// The accumulator layout of `dot` on the matrix units, if it uses them.
pub(super) fn mma_layout(l: &Lowerer<'_, '_>, op: &Op) -> Option<Layout> {
    let p = plan(l, op)?;
    let m = l.f.ty(op.operands[0]).shape[0];
    let n = l.f.ty(op.operands[1]).shape[1];
    Some(c_layout(&p, m, n, l.nw))
}

fn c_layout(p: &Plan, m: u32, n: u32, nw: u32) -> Layout {
    let i = &p.info;
    let mut reg: Vec<Vec<u32>> = i.c_reg.iter().map(|&(r, c)| vec![r, c]).collect();
    for j in 0..p.reps_n.trailing_zeros() {
        reg.push(vec![0, (i.n * p.warps_n) << j]);
    }
    for j in 0..p.reps_m.trailing_zeros() {
        reg.push(vec![(i.m * p.warps_m) << j, 0]);
    }
    let lane: Vec<Vec<u32>> = i.c_lane.iter().map(|&(r, c)| vec![r, c]).collect();
    let mut warp = Vec::new();
    for j in 0..p.warps_m.trailing_zeros() {
        warp.push(vec![i.m << j, 0]);
    }
    for j in 0..p.warps_n.trailing_zeros() {
        warp.push(vec![0, i.n << j]);
    }
    while warp.len() < nw.trailing_zeros() as usize {
        warp.push(vec![0, 0]);
    }
    Layout::from_coords(&[m, n], &reg, &lane, &warp)
}

pub(super) fn lower<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    match plan(l, op) {
        Some(p) => lower_mma(l, op, p),
        None => lower_fma(l, op),
    }
}

/// Writes every register of `t` to `base + offset(element index)` (in elements).
/// `runs[i]` is the element-index step that `offset` maps to `2^i` consecutive places
/// (e.g. `[1, 2, 4]` along a row-major row, `[N, 2N]` down a column stored
/// transposed): registers that differ only in those steps, when the layout holds them
/// in registers, are written as one vector store. The caller promises that a run's
/// first place is aligned to the run's size.
fn write_tile<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    t: &Tile<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    runs: &[u32],
    offset: impl Fn(IntValue<'ctx>) -> LResult<IntValue<'ctx>>,
) -> LResult<()> {
    let mt = l.mem_ty(t.elem);
    if t.uniform {
        // Every thread stores its share of the (constant) tile: layout-independent.
        let lay = l.canonical(&t.layout.shape);
        for e in l.elem_indices(&lay)? {
            let p = l.smem_ptr(base, mt, offset(e)?)?;
            l.smem_store(p, t.regs[0])?;
        }
        return Ok(());
    }
    // The register bits holding the run steps, in order (as far as they are there).
    let mut run_bits: Vec<usize> = Vec::new();
    for step in runs {
        match t.layout.reg.iter().position(|b| b == step) {
            Some(bit) => run_bits.push(bit),
            None => break,
        }
    }
    // Only when the run's element bits are set by its registers alone (so a run's
    // first element, hence its first place, is aligned to the run).
    let steps: u32 = run_bits
        .iter()
        .map(|&b| t.layout.reg[b])
        .fold(0, |a, s| a | s);
    let others_clear = t
        .layout
        .reg
        .iter()
        .enumerate()
        .filter(|(i, _)| !run_bits.contains(i))
        .map(|(_, b)| b)
        .chain(&t.layout.lane)
        .chain(&t.layout.warp)
        .all(|b| b & steps == 0);
    if !others_clear {
        run_bits.clear();
    }
    let run_mask: usize = run_bits.iter().map(|&b| 1 << b).sum();
    let run = 1usize << run_bits.len();
    let idx = l.elem_indices(&t.layout)?;
    for (r, &e) in idx.iter().enumerate() {
        if super::is_dup_reg(&t.layout, r) || r & run_mask != 0 {
            continue;
        }
        let p = l.smem_ptr(base, mt, offset(e)?)?;
        if run == 1 {
            l.smem_store(p, l.store_to_mem(t.elem, t.regs[r])?)?;
            continue;
        }
        let vt: BasicTypeEnum = match mt {
            BasicTypeEnum::FloatType(f) => f.vec_type(run as u32).into(),
            BasicTypeEnum::IntType(i) => i.vec_type(run as u32).into(),
            _ => unreachable!("scalar shared-memory type"),
        };
        let BasicTypeEnum::VectorType(vty) = vt else {
            unreachable!()
        };
        let mut v = vty.get_poison();
        for i in 0..run {
            // Register `r` with run bit `j` set for every set bit `j` of `i`.
            let ri = run_bits
                .iter()
                .enumerate()
                .filter(|(j, _)| i >> j & 1 == 1)
                .fold(r, |acc, (_, &b)| acc | 1 << b);
            let x = l.store_to_mem(t.elem, t.regs[ri])?;
            v = l.cx.b.build_insert_element(v, x, l.cx.i32(i as i64), "")?;
        }
        let s = l.smem_store(p, v.into())?;
        let _ = s.set_alignment(run as u32 * super::type_bytes(t.elem));
    }
    Ok(())
}

/// The steps `[1, 2, 4, ...]` of a run of `n` consecutive elements (`n` a power of
/// two): see [`write_tile`].
fn row_runs(n: u32) -> Vec<u32> {
    (0..n.trailing_zeros()).map(|i| 1 << i).collect()
}

fn lower_fma<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let a = l.val(op.operands[0])?;
    let b = l.val(op.operands[1])?;
    let c = l.val(op.operands[2])?;
    let (m, k) = (a.layout.shape[0], a.layout.shape[1]);
    let n = b.layout.shape[1];
    let s = a.elem.scalar().unwrap_or(ScalarType::F32);
    let acc_s = c.elem.scalar().unwrap_or(ScalarType::F32);
    let size = super::type_bytes(a.elem);
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

fn widen<'ctx>(
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

/// Linear combination of lane bits: the (outer, k) offset of this lane in a fragment.
fn lane_coords<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    f: &FragInfo,
) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
    let b = &l.cx.b;
    let mut o = l.cx.i32(0);
    let mut k = l.cx.i32(0);
    for (i, &(co, ck)) in f.lane.iter().enumerate() {
        let bit = b.build_and(
            b.build_right_shift(l.lane, l.cx.i32(i as i64), false, "")?,
            l.cx.i32(1),
            "",
        )?;
        if co != 0 {
            o = b.build_or(o, b.build_int_mul(bit, l.cx.i32(co as i64), "")?, "")?;
        }
        if ck != 0 {
            k = b.build_or(k, b.build_int_mul(bit, l.cx.i32(ck as i64), "")?, "")?;
        }
    }
    Ok((o, k))
}

/// Loads one operand fragment whose first outer index is `outer0` and first k `k0`,
/// from a `[outer][stride]` array at `base` (in elements).
#[allow(clippy::too_many_arguments)]
fn load_frag<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    f: &FragInfo,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    first: IntValue<'ctx>,
    stride: u32,
    lane_o: IntValue<'ctx>,
    lane_k: IntValue<'ctx>,
    outer0: IntValue<'ctx>,
    k0: u32,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let b = &l.cx.b;
    let mut out = Vec::new();
    let o = b.build_int_add(outer0, lane_o, "")?;
    let kk = b.build_int_add(lane_k, l.cx.i32(k0 as i64), "")?;
    for &(oo, ko, len) in &f.runs {
        let row = b.build_int_add(o, l.cx.i32(oo as i64), "")?;
        let off = b.build_int_add(
            b.build_int_mul(row, l.cx.i32(stride as i64), "")?,
            b.build_int_add(kk, l.cx.i32(ko as i64), "")?,
            "",
        )?;
        let off = b.build_int_add(off, first, "")?;
        let p = l.smem_ptr(base, ety, off)?;
        let vt = ety.into_float_type().vec_type(len);
        let v = l.smem_load(vt.into(), p)?;
        unsafe {
            use inkwell::values::AsValueRef;
            inkwell::llvm_sys::core::LLVMSetAlignment(v.as_value_ref(), len * 2);
        }
        for i in 0..len {
            out.push(b.build_extract_element(v.into_vector_value(), l.cx.i32(i as i64), "")?);
        }
    }
    Ok(out)
}

/// The two 16-bit elements of each `i32` an `ldmatrix` returned, low half first.
fn unpack_pairs<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    regs: &[IntValue<'ctx>],
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let vt = ety.into_float_type().vec_type(2);
    let mut out = Vec::with_capacity(2 * regs.len());
    for &r in regs {
        let v = l.cx.b.build_bit_cast(r, vt, "")?.into_vector_value();
        for i in 0..2 {
            out.push(l.cx.b.build_extract_element(v, l.cx.i32(i), "")?);
        }
    }
    Ok(out)
}

/// `lane & mask` shifted right by `shift`, times `mul` (address arithmetic).
fn lane_part<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    mask: u32,
    shift: u32,
    mul: u32,
) -> LResult<IntValue<'ctx>> {
    let b = &l.cx.b;
    let x = b.build_and(l.lane, l.cx.i32(mask as i64), "")?;
    let x = b.build_right_shift(x, l.cx.i32(shift as i64), false, "")?;
    Ok(b.build_int_mul(x, l.cx.i32(mul as i64), "")?)
}

/// The A fragment of `mma.m16n8k16` for rows `row0..row0 + 16` and `k0..k0 + 16` of
/// `a[m][stride]` at `base`, with one `ldmatrix.x4`: the four 8x8 matrices are (rows
/// 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15), which are
/// the fragment's registers `a0a1`, `a2a3`, `a4a5`, `a6a7` (PTX ISA, "Matrix
/// Fragments for mma.m16n8k16"); lane `i` gives row `i % 16` at k `8 * (i / 16)`.
fn ldmatrix_a<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    stride: u32,
    row0: IntValue<'ctx>,
    k0: u32,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let b = &l.cx.b;
    let row = b.build_int_add(row0, lane_part(l, 15, 0, 1)?, "")?;
    let k = b.build_int_add(lane_part(l, 16, 4, 8)?, l.cx.i32(k0 as i64), "")?;
    let off = b.build_int_add(b.build_int_mul(row, l.cx.i32(stride as i64), "")?, k, "")?;
    let p = l.smem_ptr(base, ety, off)?;
    let site = l.new_site("ldmatrix");
    let regs = l.arch.ldmatrix(&l.cx, p, 4, false, site)?;
    unpack_pairs(l, ety, &regs)
}

/// B fragments of `mma.m16n8k16` for the n8 tiles starting at columns `cols` (one or
/// two) and `k0..k0 + 16`, from row-major `b[k][stride]` at `base + first`, with one
/// `ldmatrix.trans` (`.x2` per tile): per tile the 8x8 matrices (k 0-7) and (k 8-15)
/// of its 8 columns, transposed, are the registers `b0b1` (k `2 * (lane % 4)` and `+ 1`
/// at column `lane / 4`) and `b2b3`; lane `i` gives row k `i % 8 + 8 * ((i / 8) % 2)` of
/// tile `i / 16`.
#[allow(clippy::too_many_arguments)]
fn ldmatrix_b_trans<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    first: IntValue<'ctx>,
    stride: u32,
    cols: &[IntValue<'ctx>],
    k0: u32,
) -> LResult<Vec<Vec<BasicValueEnum<'ctx>>>> {
    let b = &l.cx.b;
    let col0 = if cols.len() == 2 {
        let hi = b.build_int_compare(inkwell::IntPredicate::UGE, l.lane, l.cx.i32(16), "")?;
        b.build_select(hi, cols[1], cols[0], "")?.into_int_value()
    } else {
        cols[0]
    };
    let kr = b.build_int_add(lane_part(l, 7, 0, 1)?, lane_part(l, 8, 3, 8)?, "")?;
    let kr = b.build_int_add(kr, l.cx.i32(k0 as i64), "")?;
    let off = b.build_int_add(b.build_int_mul(kr, l.cx.i32(stride as i64), "")?, col0, "")?;
    let off = b.build_int_add(off, first, "")?;
    let p = l.smem_ptr(base, ety, off)?;
    let site = l.new_site("ldmatrix");
    let regs = l
        .arch
        .ldmatrix(&l.cx, p, 2 * cols.len() as u32, true, site)?;
    regs.chunks(2).map(|r| unpack_pairs(l, ety, r)).collect()
}

fn lower_mma<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op, p: Plan) -> LResult<Tile<'ctx>> {
    let a = l.val(op.operands[0])?;
    let b = l.val(op.operands[1])?;
    let c = l.val(op.operands[2])?;
    let (m, k) = (a.layout.shape[0], a.layout.shape[1]);
    let n = b.layout.shape[1];
    let s = a.elem.scalar().unwrap_or(ScalarType::F16);
    let clay = c_layout(&p, m, n, l.nw);
    let c = l.convert(&c, &clay, &op.span)?;
    let info = &p.info;
    // `ldmatrix` reads the NVIDIA m16n8k16 fragments; B is then row-major (16-byte
    // stores, read with `.trans`). Every row is padded by 8 elements, so row addresses
    // are 16-byte aligned and the 8 rows of an 8x8 matrix hit distinct bank groups.
    let ldm = !b_transposed(l, &p);
    let stride = k + PAD;
    let a_elems = m * stride;
    let b_stride = if ldm { n + PAD } else { stride };
    let b_elems = if ldm { k * b_stride } else { n * stride };
    let base = l.scratch((a_elems + b_elems) * 2, &op.span);
    let ety = l.ty(Elem::Scalar(s));
    let kb = k.trailing_zeros() as i64;
    let nb = n.trailing_zeros() as i64;
    // a[m][k] at m * stride + k (runs along k stay consecutive, and rows start at
    // multiples of 8 elements: 16-byte stores); b[k][n] at a_elems + n * stride + k.
    write_tile(l, &a, base, &row_runs(8.min(k)), |e| {
        let bd = &l.cx.b;
        let r = bd.build_right_shift(e, l.cx.i32(kb), false, "")?;
        let cc = bd.build_and(e, l.cx.i32(k as i64 - 1), "")?;
        Ok(bd.build_int_add(bd.build_int_mul(r, l.cx.i32(stride as i64), "")?, cc, "")?)
    })?;
    // b[k][n] at a_elems + k * b_stride + n (ldmatrix: runs along n stay consecutive),
    // else transposed at a_elems + n * stride + k.
    // Transposed, a run goes down a column: steps of `n` elements (pairs of k, which
    // `operand_load_layout` puts in registers).
    let b_runs = if ldm { row_runs(8.min(n)) } else { vec![n] };
    write_tile(l, &b, base, &b_runs, |e| {
        let bd = &l.cx.b;
        let kk = bd.build_right_shift(e, l.cx.i32(nb), false, "")?;
        let nn = bd.build_and(e, l.cx.i32(n as i64 - 1), "")?;
        let o = if ldm {
            bd.build_int_add(bd.build_int_mul(kk, l.cx.i32(b_stride as i64), "")?, nn, "")?
        } else {
            bd.build_int_add(bd.build_int_mul(nn, l.cx.i32(stride as i64), "")?, kk, "")?
        };
        Ok(bd.build_int_add(o, l.cx.i32(a_elems as i64), "")?)
    })?;
    l.barrier()?;
    let bd = &l.cx.b;
    let wm = bd.build_and(l.warp, l.cx.i32(p.warps_m as i64 - 1), "")?;
    let wn = bd.build_and(
        bd.build_right_shift(
            l.warp,
            l.cx.i32(p.warps_m.trailing_zeros() as i64),
            false,
            "",
        )?,
        l.cx.i32(p.warps_n as i64 - 1),
        "",
    )?;
    let (ao, ak) = lane_coords(l, &info.a)?;
    let (bo, bk) = lane_coords(l, &info.b)?;
    let zero = l.cx.i32(0);
    let b_first = l.cx.i32(a_elems as i64);
    let fr = 1usize << info.c_reg.len();
    let mut acc: Vec<FloatValue<'ctx>> = c.regs.iter().map(|v| v.into_float_value()).collect();
    for ks in 0..k / info.k {
        let k0 = ks * info.k;
        let mut afr = Vec::new();
        for mr in 0..p.reps_m {
            let row0 = l.cx.b.build_int_mul(
                l.cx.b
                    .build_int_add(wm, l.cx.i32((mr * p.warps_m) as i64), "")?,
                l.cx.i32(info.m as i64),
                "",
            )?;
            afr.push(if ldm {
                ldmatrix_a(l, ety, base, stride, row0, k0)?
            } else {
                load_frag(l, &info.a, ety, base, zero, stride, ao, ak, row0, k0)?
            });
        }
        let mut bfr = Vec::new();
        let col0s = (0..p.reps_n)
            .map(|nr| {
                Ok(l.cx.b.build_int_mul(
                    l.cx.b
                        .build_int_add(wn, l.cx.i32((nr * p.warps_n) as i64), "")?,
                    l.cx.i32(info.n as i64),
                    "",
                )?)
            })
            .collect::<LResult<Vec<_>>>()?;
        if ldm {
            for pair in col0s.chunks(2) {
                bfr.extend(ldmatrix_b_trans(l, ety, base, b_first, b_stride, pair, k0)?);
            }
        } else {
            for &col0 in &col0s {
                bfr.push(load_frag(
                    l, &info.b, ety, base, b_first, stride, bo, bk, col0, k0,
                )?);
            }
        }
        for (mr, af) in afr.iter().enumerate() {
            for (nr, bf) in bfr.iter().enumerate() {
                let at = (mr * p.reps_n as usize + nr) * fr;
                let site = l.new_site("mma");
                let d = l.arch.emit_mma(&l.cx, s, af, bf, &acc[at..at + fr], site)?;
                acc[at..at + fr].copy_from_slice(&d);
            }
        }
    }
    l.barrier()?;
    Ok(Tile {
        elem: c.elem,
        layout: clay,
        regs: acc.into_iter().map(|v| v.into()).collect(),
        uniform: false,
    })
}

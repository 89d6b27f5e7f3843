//! The `dot` on `mma.sync` (NVIDIA, sm_80+) and MFMA (AMD, gfx90a/gfx942): operands
//! staged in shared memory ([`super::smem`]), read as the instruction's fragments.
//!
//! `a` is stored row-major and, on NVIDIA, `b` too; elsewhere `b` is stored
//! transposed (`[N][K]`, so both operands' fragments are runs of consecutive `k`).
//! Each array is XOR-swizzled ([`Swizzle`]) for the width of its fragment reads, so
//! the rows one read touches hit distinct banks without padding, and the staging
//! stores (16 bytes, or one swizzle unit) stay whole. On NVIDIA the fragments are
//! read with `ldmatrix` (`.x4` per 16x16 A tile, `.x4`/`.x2` per pair of / single n8
//! B tile) from 16-byte units; elsewhere with one vector load per run of `k`, from
//! units of the run's length. An `a` whose registers already hold the instruction's
//! A fragments (a `dot` fed by a `dot`, as in attention) is used in place.

use std::collections::HashMap;

use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue};
use tessera_ir::ir::Op;
use tessera_ir::{Elem, ScalarType};

use super::smem::{Arrays, Swizzle, arrays_base, pair_run, paired_reads, stage, stage_operands};
use super::{Plan, c_layout, scale_layout_of};
use crate::layout::Layout;
use crate::lower::arch::{FragInfo, MmaInfo};
use crate::lower::{LResult, LowerError, Lowerer, Tile};

/// The registers of the A tile `a` (layout `lay`) that are the A fragments of `p`'s
/// instructions, `[m tile][k step][element]` in [`FragInfo::runs`] order, when `a`
/// already holds them: its lane bases are the fragment's, its warp bases the rows of
/// the plan's warps along M (none along N), and every fragment element of every tile
/// and step is in some register of the lane that reads it (a chained `dot`'s `P`,
/// computed in the previous `dot`'s accumulator layout: the `mma.m16n8` C fragments
/// of two n8 tiles are the A fragment of a k16 step).
pub(super) fn a_fragments_in_registers(p: &Plan, lay: &Layout) -> Option<AFrags> {
    let (m, k) = (lay.shape[0], lay.shape[1]);
    let info = &p.info;
    let flat = |row: u32, col: u32| row * k + col;
    let lane_ok = info.a.lane.len() == lay.lane.len()
        && info
            .a
            .lane
            .iter()
            .zip(&lay.lane)
            .all(|(&(o, kk), &b)| flat(o, kk) == b);
    let wm_bits = p.warps_m.trailing_zeros() as usize;
    let warp_ok = lay.warp.iter().enumerate().all(|(j, &b)| {
        if j < wm_bits {
            b == flat(info.m << j, 0)
        } else {
            b == 0
        }
    });
    if !lane_ok || !warp_ok || m % info.m != 0 {
        return None;
    }
    let mut reg_of: HashMap<u32, usize> = HashMap::new();
    for r in 0..lay.num_regs() {
        let e = crate::layout::xor_bases(&lay.reg, r as u32);
        reg_of.entry(e).or_insert(r);
    }
    (0..p.reps_m)
        .map(|mr| {
            (0..k / info.k)
                .map(|ks| {
                    let mut regs = Vec::new();
                    for &(oo, ko, len) in &info.a.runs {
                        for e in 0..len {
                            let row = mr * p.warps_m * info.m + oo;
                            let col = ks * info.k + ko + e;
                            regs.push(*reg_of.get(&flat(row, col))?);
                        }
                    }
                    Some(regs)
                })
                .collect()
        })
        .collect()
}

/// Fragment register indices `[m tile][k step][element]` of an A operand.
pub(in crate::lower) type AFrags = Vec<Vec<Vec<usize>>>;

/// The tile of `dot` `op`'s A and the registers of its A fragments (`frags` of its
/// layout) when A is in registers that already hold them (a chained dot's `P`), not
/// staged by a loop; `None` when A goes through shared memory.
pub(in crate::lower) fn a_from_registers<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: &Op,
    frags: impl FnOnce(&Layout) -> Option<AFrags>,
) -> LResult<Option<(Tile<'ctx>, AFrags)>> {
    if l.is_staged(op, 0) {
        return Ok(None);
    }
    let t = l.val(op.operands[0])?;
    if t.uniform {
        return Ok(None);
    }
    let Some(f) = frags(&t.layout) else {
        return Ok(None);
    };
    l.note(|| "operand A from registers (its layout holds the A fragments)".into());
    Ok(Some((t, f)))
}

/// Whether `ldmatrix` reads the fragments of `info`: NVIDIA `mma.m16n8k16` (16-bit)
/// and `mma.m16n8k32` (8-bit), whose A and B fragments are the 8x8 matrices of 16-byte
/// rows `ldmatrix` loads (four 8-bit elements in each of its 32-bit registers).
pub(super) fn ldmatrix_shape(info: &MmaInfo) -> bool {
    matches!((info.m, info.n, info.k), (16, 8, 16) | (16, 8, 32))
}

/// Linear combination of lane bits: the (outer, k) offset of this lane in a fragment.
pub(super) fn lane_coords<'ctx>(
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
/// from the `[outer][k]` array `swz` at `base + first` (in elements).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_frag<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    f: &FragInfo,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    first: IntValue<'ctx>,
    swz: &Swizzle,
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
        let col = b.build_int_add(kk, l.cx.i32(ko as i64), "")?;
        out.extend(load_run(l, ety, base, first, swz, row, col, len)?);
    }
    Ok(out)
}

/// The `len` consecutive elements at `(row, col)` of the array `swz` at `base + first`
/// (one vector load; the run lies within one swizzle unit).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_run<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    first: IntValue<'ctx>,
    swz: &Swizzle,
    row: IntValue<'ctx>,
    col: IntValue<'ctx>,
    len: u32,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let b = &l.cx.b;
    let off = b.build_int_add(swz.emit(&l.cx, row, col)?, first, "")?;
    let p = l.smem_ptr(base, ety, off)?;
    let (vt, bytes): (BasicTypeEnum, u32) = match ety {
        BasicTypeEnum::IntType(t) => (t.vec_type(len).into(), t.get_bit_width() / 8),
        _ => {
            let f = ety.into_float_type();
            let bytes = if f == l.cx.ctx.f32_type() { 4 } else { 2 };
            (f.vec_type(len).into(), bytes)
        }
    };
    let v = l.smem_load(vt, p)?;
    if let Some(i) = v.as_instruction_value() {
        let _ = i.set_alignment(len * bytes);
    }
    (0..len)
        .map(|i| Ok(b.build_extract_element(v.into_vector_value(), l.cx.i32(i as i64), "")?))
        .collect()
}

/// The elements of each `i32` an `ldmatrix` returned (two 16-bit or four 8-bit),
/// lowest bits first.
pub(super) fn unpack_words<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    regs: &[IntValue<'ctx>],
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let (vt, per): (BasicTypeEnum<'ctx>, u32) = match ety {
        BasicTypeEnum::IntType(t) => {
            let per = 32 / t.get_bit_width().max(1);
            (t.vec_type(per).into(), per)
        }
        _ => (ety.into_float_type().vec_type(2).into(), 2),
    };
    let mut out = Vec::with_capacity((per as usize) * regs.len());
    for &r in regs {
        let v = l.cx.b.build_bit_cast(r, vt, "")?.into_vector_value();
        for i in 0..per {
            out.push(l.cx.b.build_extract_element(v, l.cx.i32(i as i64), "")?);
        }
    }
    Ok(out)
}

/// Elements of `ety` in 16 bytes (one `ldmatrix` row).
pub(super) fn row_elems(ety: BasicTypeEnum<'_>) -> u32 {
    match ety {
        BasicTypeEnum::IntType(t) => 128 / t.get_bit_width().max(1),
        _ => 8,
    }
}

/// `lane & mask` shifted right by `shift`, times `mul` (address arithmetic).
pub(super) fn lane_part<'ctx>(
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
/// the `a[m][k]` array `swz` at `base`, with one `ldmatrix.x4`: the four 8x8 matrices are (rows
/// 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15), which are
/// the fragment's registers `a0a1`, `a2a3`, `a4a5`, `a6a7` (PTX ISA, "Matrix
/// Fragments for mma.m16n8k16"); lane `i` gives row `i % 16` at k `8 * (i / 16)`.
/// With 8-bit elements (`mma.m16n8k32`) a matrix row is 16 of `k`: the matrices are
/// the registers `a0..a3` (rows 0-7, k 0-15), `a4..a7` (rows 8-15), `a8..a11` (rows
/// 0-7, k 16-31) and `a12..a15`, lane `i` giving row `i % 16` at k `16 * (i / 16)`.
pub(super) fn ldmatrix_a<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    swz: &Swizzle,
    row0: IntValue<'ctx>,
    k0: u32,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let b = &l.cx.b;
    let row = b.build_int_add(row0, lane_part(l, 15, 0, 1)?, "")?;
    let k = b.build_int_add(
        lane_part(l, 16, 4, row_elems(ety))?,
        l.cx.i32(k0 as i64),
        "",
    )?;
    let off = swz.emit(&l.cx, row, k)?;
    let p = l.smem_ptr(base, ety, off)?;
    let site = l.new_site("ldmatrix");
    let regs = l.arch.ldmatrix(&l.cx, p, 4, false, site)?;
    unpack_words(l, ety, &regs)
}

/// B fragments of `mma.m16n8k16` for the n8 tiles starting at columns `cols` (one or
/// two) and `k0..k0 + 16`, from the B array `swz` at `base + first`, with one
/// `ldmatrix` (`.x2` per tile), per tile the registers `b0b1` (k `2 * (lane % 4)` and
/// `+ 1` at column `lane / 4`) and `b2b3` (k + 8):
/// - `b[k][n]` (`nk` false), with `.trans`: the 8x8 matrices (k 0-7) and (k 8-15) of
///   the tile's 8 columns, transposed; lane `i` gives row k `i % 8 + 8 * ((i / 8) % 2)`
///   of tile `i / 16`;
/// - `b[n][k]` (`nk`), plain: the matrices (rows n, k 0-7) and (k 8-15); lane `i`
///   gives row n `i % 8` at k `8 * ((i / 8) % 2)` of tile `i / 16`. With 8-bit
///   elements (`mma.m16n8k32`, `b0..b3` and `b4..b7`) the matrices are k 0-15 and
///   16-31.
#[allow(clippy::too_many_arguments)]
pub(super) fn ldmatrix_b<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ety: BasicTypeEnum<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    first: IntValue<'ctx>,
    swz: &Swizzle,
    cols: &[IntValue<'ctx>],
    k0: u32,
    nk: bool,
) -> LResult<Vec<Vec<BasicValueEnum<'ctx>>>> {
    let b = &l.cx.b;
    let col0 = if cols.len() == 2 {
        let hi = b.build_int_compare(inkwell::IntPredicate::UGE, l.lane, l.cx.i32(16), "")?;
        b.build_select(hi, cols[1], cols[0], "")?.into_int_value()
    } else {
        cols[0]
    };
    let off = if nk {
        let row = b.build_int_add(col0, lane_part(l, 7, 0, 1)?, "")?;
        let k = b.build_int_add(lane_part(l, 8, 3, row_elems(ety))?, l.cx.i32(k0 as i64), "")?;
        swz.emit(&l.cx, row, k)?
    } else {
        let kr = b.build_int_add(lane_part(l, 7, 0, 1)?, lane_part(l, 8, 3, 8)?, "")?;
        let kr = b.build_int_add(kr, l.cx.i32(k0 as i64), "")?;
        swz.emit(&l.cx, kr, col0)?
    };
    let off = b.build_int_add(off, first, "")?;
    let p = l.smem_ptr(base, ety, off)?;
    let site = l.new_site("ldmatrix");
    let regs = l
        .arch
        .ldmatrix(&l.cx, p, 2 * cols.len() as u32, !nk, site)?;
    regs.chunks(2).map(|r| unpack_words(l, ety, r)).collect()
}

/// A block-scaled `dot`'s scales as its instructions take them: A's (B's) for
/// k-step `ks` and the warp's M (N) tile `r` at `ks + steps * r` (`steps` the
/// k-steps), each the lane's E8M0 byte as an `i32`: the scale tiles converted to
/// [`scale_layout_of`] (where their loads did not produce it already).
fn scale_registers<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    p: &Plan,
    lanes: &[(u32, u32)],
    mnk: (u32, u32, u32),
) -> LResult<(Vec<IntValue<'ctx>>, Vec<IntValue<'ctx>>)> {
    let Some((sa, sb)) = super::scales(op) else {
        return Err(LowerError::Llvm(
            "a block-scaled plan for a dot without scales".into(),
        ));
    };
    let mut regs = |v, a| -> LResult<Vec<IntValue<'ctx>>> {
        let t = l.val(v)?;
        let t = l.convert(&t, &scale_layout_of(p, lanes, a, mnk, l.nw), &op.span)?;
        let i32t = l.cx.ctx.i32_type();
        t.regs
            .iter()
            .map(|r| Ok(l.cx.b.build_int_z_extend(r.into_int_value(), i32t, "")?))
            .collect()
    };
    Ok((regs(sa, true)?, regs(sb, false)?))
}

pub(super) fn lower_mma<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op, p: Plan) -> LResult<Tile<'ctx>> {
    let arr = Arrays::new(l, op, &p);
    let (m, n, k, ldm) = (arr.m, arr.n, arr.k, arr.ldm);
    let (a_swz, b_swz, a_elems) = (arr.a_swz, arr.b_swz, arr.a_elems());
    let s =
        l.f.ty(op.operands[0])
            .scalar_type()
            .unwrap_or(ScalarType::F16);
    let c = l.val(op.operands[2])?;
    let clay = c_layout(&p, m, n, l.nw);
    let c = l.convert(&c, &clay, &op.span)?;
    let scale_regs = match &p.scale_lane {
        Some(lanes) => Some(scale_registers(l, op, &p, lanes, (m, n, k))?),
        None => None,
    };
    let info = &p.info;
    // A loop-carried operand is already in this dot's own arrays (the loop staged it
    // and waited at a barrier, see `Lowerer::lower_for`); the rest is written here.
    // With asynchronous copies, the operands are in this iteration's slot of the
    // ring, and the loop's next barrier (before the slot is refilled) ends the reads.
    let ring = l.async_dot(op).is_some();
    let base = arrays_base(l, op, arr.bytes())?;
    l.note(|| {
        format!(
            "dot on the matrix units: {}x{}x{} instructions{}, warps {}x{}, {}x{} tiles per warp, {}\n\
             A array {:?}\nB array ({}) {:?}",
            info.m,
            info.n,
            info.k,
            if p.transposed { " (transposed product)" } else { "" },
            p.warps_m,
            p.warps_n,
            p.reps_m,
            p.reps_n,
            if ldm { "ldmatrix reads" } else if paired_reads(info, ldm, k, arr.elem_bytes) { "paired 16-byte reads" } else { "fragment reads" },
            a_swz,
            if ldm && !arr.b_nk { "[k][n]" } else { "[n][k]" },
            b_swz
        )
    });
    let ety = l.ty(Elem::Scalar(s));
    // A chained dot's A (attention's P) may hold its fragments already: no staging.
    let paired = paired_reads(info, ldm, k, arr.elem_bytes);
    let a_in_regs = match p.scale_lane {
        Some(_) => None,
        None => a_from_registers(l, op, |lay| a_fragments_in_registers(&p, lay))?,
    };
    stage_operands(l, op, a_in_regs.is_some(), |l, which, t| {
        stage(l, &arr, which, t, base)
    })?;
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
    let mut acc: Vec<BasicValueEnum<'ctx>> = c.regs.clone();
    // With paired reads each lane reads its fragments of two k-steps as one run of 8
    // (see `paired_reads`): k-steps go two at a time.
    let span = if paired { 2 } else { 1 };
    let pr = pair_run(info) as usize;
    let two = l.cx.i32(2);
    let (ak2, bk2) = (
        l.cx.b.build_int_mul(ak, two, "")?,
        l.cx.b.build_int_mul(bk, two, "")?,
    );
    for ks in (0..k / info.k).step_by(span as usize) {
        let k0 = ks * info.k;
        // afr[step][m tile], bfr[step][n tile].
        let mut afr = vec![Vec::new(); span as usize];
        for mr in 0..p.reps_m {
            let row0 = l.cx.b.build_int_mul(
                l.cx.b
                    .build_int_add(wm, l.cx.i32((mr * p.warps_m) as i64), "")?,
                l.cx.i32(info.m as i64),
                "",
            )?;
            if let Some((t, frags)) = &a_in_regs {
                for (j, af) in afr.iter_mut().enumerate() {
                    af.push(
                        frags[mr as usize][ks as usize + j]
                            .iter()
                            .map(|&r| t.regs[r])
                            .collect(),
                    );
                }
            } else if ldm {
                afr[0].push(ldmatrix_a(l, ety, base, &a_swz, row0, k0)?);
            } else if span == 2 {
                let row = l.cx.b.build_int_add(row0, ao, "")?;
                let col = l.cx.b.build_int_add(ak2, l.cx.i32(k0 as i64), "")?;
                let v = load_run(l, ety, base, zero, &a_swz, row, col, 2 * pr as u32)?;
                afr[0].push(v[..pr].to_vec());
                afr[1].push(v[pr..].to_vec());
            } else {
                afr[0].push(load_frag(
                    l, &info.a, ety, base, zero, &a_swz, ao, ak, row0, k0,
                )?);
            }
        }
        let mut bfr = vec![Vec::new(); span as usize];
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
                bfr[0].extend(ldmatrix_b(
                    l, ety, base, b_first, &b_swz, pair, k0, arr.b_nk,
                )?);
            }
        } else {
            for &col0 in &col0s {
                if span == 2 {
                    let row = l.cx.b.build_int_add(col0, bo, "")?;
                    let col = l.cx.b.build_int_add(bk2, l.cx.i32(k0 as i64), "")?;
                    let v = load_run(l, ety, base, b_first, &b_swz, row, col, 2 * pr as u32)?;
                    bfr[0].push(v[..pr].to_vec());
                    bfr[1].push(v[pr..].to_vec());
                } else {
                    bfr[0].push(load_frag(
                        l, &info.b, ety, base, b_first, &b_swz, bo, bk, col0, k0,
                    )?);
                }
            }
        }
        for (j, (afs, bfs)) in afr.iter().zip(&bfr).enumerate() {
            let step = (ks as usize) + j;
            for (mr, af) in afs.iter().enumerate() {
                for (nr, bf) in bfs.iter().enumerate() {
                    let at = (mr * p.reps_n as usize + nr) * fr;
                    let site = l.new_site("mma");
                    // Transposed: B's fragment in A's place and A's in B's (`Dᵀ = Bᵀ Aᵀ`).
                    let (x, y) = if p.transposed { (bf, af) } else { (af, bf) };
                    let c = &acc[at..at + fr];
                    let d = match &scale_regs {
                        Some((sa, sb)) => {
                            let steps = (k / info.k) as usize;
                            let sc = [sa[step + steps * mr], sb[step + steps * nr]];
                            l.arch.emit_scaled_mma(&l.cx, s, x, y, c, sc, site)?
                        }
                        None => l.arch.emit_mma(&l.cx, s, x, y, c, site)?,
                    };
                    acc[at..at + fr].copy_from_slice(&d);
                }
            }
        }
    }
    // (A double-buffered `dot`'s next tiles go into its other copy: the loop's
    // barrier after writing them is the one it needs, `Plan::double`.)
    if !ring && !l.plan.double.contains_key(&(op as *const Op)) {
        l.barrier()?;
    }
    Ok(Tile {
        elem: c.elem,
        layout: clay,
        regs: acc,
        uniform: false,
    })
}

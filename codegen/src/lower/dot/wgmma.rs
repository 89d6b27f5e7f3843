//! `dot` on the Hopper warpgroup matrix instructions (sm_90a): `wgmma.mma_async`
//! with both operands in shared memory, read through matrix descriptors.
//!
//! **Warps.** Four consecutive warps form a warpgroup; each warpgroup computes
//! `64 x n_inst` tiles of the accumulator with `m64n{n_inst}k16` instructions
//! (f16/bf16 into f32), or `m64n{n_inst}k32.s32.s8.s8` (i8 into i32, both operands
//! K-major: 8-bit `wgmma` has no transpose, so an i8 B takes this path only when it
//! arrives contiguous along `k`). In bytes the two are alike: 32 bytes of `k` per
//! instruction, and every offset below is the same once counted in bytes.
//! Warpgroups split `M` first (64 rows each), then `N`; a warpgroup repeats over the
//! rest of its `M` (`reps_m` tiles, each its own accumulator registers).
//!
//! **Accumulator layout** (PTX ISA, "Register fragment: wgmma .m64nNk16, matrix D"):
//! warp `w % 4` of the warpgroup holds rows `16 (w % 4) ..+ 16`; in it, with
//! `g = lane / 4`, `t = lane % 4`, register `i` holds row `g + 8 ((i / 2) % 2)`,
//! column `8 (i / 4) + 2 t + i % 2`, the `mma.m16n8` C fragment repeated over the
//! `n_inst / 8` column chunks.
//!
//! **Shared arrays** (PTX ISA, "Shared Memory Matrix Layout", the swizzled canonical
//! layouts): A `[M][K]` K-major and B `[K][N]` N-major (`imm-trans-b = 1`), each cut
//! into column blocks of `S` bytes (`S = min(128, cols * e)`, `e` the element bytes: the 128B, 64B or 32B
//! swizzle mode); a block is `rows x S` bytes, rows consecutive, the 16-byte units
//! of row `r` XORed with `(r / (128 / S)) % (S / 16)` — the hardware's
//! address-bit swizzle (`addr[4..] ^= addr[7..]`) once every block starts at a
//! 1024-byte boundary, which is how the arrays are placed. That is [`Swizzle::new`]
//! of `S / e` columns of `e`-byte elements, accessed `16 / e` at a time, so staging
//! stores stay 16 bytes.
//!
//! **Descriptors** (PTX ISA, "Matrix Descriptor Format"): start address `>> 4` in
//! bits 0..14, leading-dimension byte offset `>> 4` in 16..30, stride-dimension byte
//! offset `>> 4` in 32..46, the swizzle mode in 62..64 (1: 128B, 2: 64B, 3: 32B).
//! A (K-major): the stride offset is the 8-row step `8 S`, the leading offset unused
//! (1); the `k`-step `s` of block `b` starts at `b M S + m0 S + (16 s mod S/2) * 2`.
//! B (N-major): leading offset = the next column block (`K S` bytes), stride offset
//! = the next 8 rows of `k` (`8 S`); the step starts at `n0 / (S/2) * K S + k0 S`.

use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use tessera_ir::ir::{Op, OpKind};
use tessera_ir::{ScalarType, ValueId};

use super::Plan;
use super::mma::{AFrags, a_fragments_in_registers};
use super::smem::Swizzle;
use crate::layout::Layout;
use crate::lower::arch::{Arch, WgmmaA};
use crate::lower::{LResult, Lowerer, Tile};

/// Shared arrays of a `wgmma` dot start at multiples of this many bytes (the period
/// of the 128-byte swizzle, so the descriptors' base offset is 0).
pub(crate) const ARRAY_ALIGN: u32 = 1024;

/// How a `dot` maps onto warpgroups.
#[derive(Clone, Copy, Debug)]
pub(in crate::lower) struct WgPlan {
    /// Input element type (f16, bf16, f8e4m3, f8e5m2, or i8 with an i32 accumulator).
    pub input: ScalarType,
    /// Bytes of one input element (2, or 1 for i8).
    pub elem_bytes: u32,
    /// `K` of one instruction: 32 bytes of each row (16 for 16-bit types, 32 for i8).
    pub k_inst: u32,
    /// `N` of one instruction (a warpgroup's share of the tile's columns).
    pub n_inst: u32,
    /// Warpgroups along `M` and `N`.
    pub wg_m: u32,
    pub wg_n: u32,
    /// 64-row tiles per warpgroup.
    pub reps_m: u32,
    /// The tile shape.
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// B is stored K-major (`[n][k]`, `imm-trans-b = 0`): it arrives with consecutive
    /// `k` contiguous in memory ([`k_contiguous`]), like attention's `Kᵀ`.
    pub b_k_major: bool,
}

/// Whether every load that `v` (a `dot` operand `[k][n]`) comes from reads runs of at
/// least 16 bytes along dimension 0 (`k`) and none along dimension 1: a transposed
/// operand, which then loads and stages 16 bytes at a time along `k`.
pub(in crate::lower) fn k_contiguous(l: &Lowerer<'_, '_>, v: ValueId) -> bool {
    let mut loads = l
        .defs
        .values()
        .filter(|o| matches!(o.kind, OpKind::Load { .. }))
        .filter(|o| l.flow_closure(o.results[0]).contains(&v))
        .peekable();
    loads.peek().is_some() && loads.all(|ld| dim0_contiguous(l, ld))
}

/// Whether load `ld` (of a 2-D tile) reads runs of 16 bytes along dimension 0 and
/// single elements along dimension 1.
pub(in crate::lower) fn dim0_contiguous(l: &Lowerer<'_, '_>, ld: &Op) -> bool {
    let shape = &l.f.ty(ld.results[0]).shape;
    let Some(s) = l.f.ty(ld.results[0]).scalar_type() else {
        return false;
    };
    let vec = u64::from(16 / (s.size_bytes() as u32).max(1));
    let info = l.axis.get(l.f, ld.operands[0]);
    shape.len() == 2
        && u64::from(shape[0]) >= vec
        && info.contiguity.len() == 2
        && info.contiguity[0] >= vec
        && info.contiguity[1] == 1
        && info.divisibility[0] >= 16
}

/// The warpgroup plan of `dot` `op`, if it takes the `wgmma` path: a target with
/// `wgmma`, f16/bf16 inputs with an f32 accumulator or i8 ones with an i32
/// accumulator and a B that arrives contiguous along `k` (8-bit `wgmma` reads both
/// operands K-major; an i8 B along `n` takes `mma.sync` instead), whole warpgroups,
/// `M` a multiple of 64, `K` of the instruction's, every dimension a power of two,
/// and a warpgroup's `N` between 16 and 256 and made of whole swizzle blocks.
pub(in crate::lower) fn plan(l: &Lowerer<'_, '_>, op: &Op) -> Option<WgPlan> {
    // (A block-scaled `dot`, [`super::scales`], is gfx950's.)
    if !l.target().has_wgmma() || super::scales(op).is_some() {
        return None;
    }
    let a = l.f.ty(op.operands[0]);
    let b = l.f.ty(op.operands[1]);
    let c = l.f.ty(op.operands[2]);
    let input = a.scalar_type()?;
    let acc = match input {
        ScalarType::F16 | ScalarType::BF16 | ScalarType::F8E4M3 | ScalarType::F8E5M2 => {
            ScalarType::F32
        }
        ScalarType::I8 => ScalarType::I32,
        _ => return None,
    };
    if b.scalar_type()? != input || c.scalar_type()? != acc {
        return None;
    }
    let elem_bytes = input.size_bytes() as u32;
    let k_inst = 32 / elem_bytes;
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let nw = l.nw;
    if !nw.is_multiple_of(4) || !m.is_multiple_of(64) || !k.is_multiple_of(k_inst) {
        return None;
    }
    let b_k_major = k_contiguous(l, op.operands[1]);
    if elem_bytes == 1 && !b_k_major {
        return None;
    }
    if ![m, n, k, nw].iter().all(|x| x.is_power_of_two()) {
        return None;
    }
    let wgs = nw / 4;
    let wg_m = wgs.min(m / 64);
    let wg_n = wgs / wg_m;
    let n_inst = n / wg_n;
    let block = n.min(128 / elem_bytes);
    // N-major B: whole column blocks per warpgroup; K-major: rows of 8-row core
    // matrices (a 1024-byte-aligned start: the swizzle's phase is 0).
    let unit = if b_k_major { 16 } else { block };
    if !(16..=256).contains(&n_inst) || !n_inst.is_multiple_of(unit) {
        return None;
    }
    Some(WgPlan {
        input,
        elem_bytes,
        k_inst,
        n_inst,
        wg_m,
        wg_n,
        reps_m: m / 64 / wg_m,
        m,
        n,
        k,
        b_k_major,
    })
}

/// The accumulator layout of the plan (see the module docs).
pub(in crate::lower) fn c_layout(p: &WgPlan, nw: u32) -> Layout {
    let mut reg: Vec<Vec<u32>> = vec![vec![0, 1], vec![8, 0]];
    for j in 0..(p.n_inst / 8).trailing_zeros() {
        reg.push(vec![0, 8 << j]);
    }
    for j in 0..p.reps_m.trailing_zeros() {
        reg.push(vec![(64 * p.wg_m) << j, 0]);
    }
    let lane = vec![vec![0, 2], vec![0, 4], vec![1, 0], vec![2, 0], vec![4, 0]];
    let mut warp = vec![vec![16, 0], vec![32, 0]];
    for j in 0..p.wg_m.trailing_zeros() {
        warp.push(vec![64 << j, 0]);
    }
    for j in 0..p.wg_n.trailing_zeros() {
        warp.push(vec![0, p.n_inst << j]);
    }
    while warp.len() < nw.trailing_zeros() as usize {
        warp.push(vec![0, 0]);
    }
    Layout::from_coords(&[p.m, p.n], &reg, &lane, &warp)
}

/// One operand array: `[rows][cols]` cut into column blocks of `block` elements
/// (at most 128 bytes), each block `rows x block` consecutive and swizzled by `swz`.
#[derive(Clone, Copy, Debug)]
pub(in crate::lower) struct Array {
    pub rows: u32,
    pub block: u32,
    pub swz: Swizzle,
    /// Bytes of one element.
    pub elem_bytes: u32,
}

impl Array {
    fn new(rows: u32, cols: u32, elem_bytes: u32) -> Array {
        let block = cols.min(128 / elem_bytes);
        Array {
            rows,
            block,
            swz: Swizzle::new(block, elem_bytes, 16 / elem_bytes),
            elem_bytes,
        }
    }

    /// Swizzle bytes `S` (one row of a block).
    fn row_bytes(&self) -> u32 {
        self.block * self.elem_bytes
    }

    /// The descriptor's swizzle-mode field.
    fn mode(&self) -> u64 {
        match self.row_bytes() {
            128 => 1,
            64 => 2,
            _ => 3,
        }
    }

    /// The element offset of `(row, col)` (constant indices).
    #[cfg(test)]
    pub fn offset(&self, row: u32, col: u32) -> u32 {
        (col / self.block) * self.rows * self.block + self.swz.offset(row, col % self.block)
    }

    /// [`Self::offset`] in LLVM IR.
    fn emit<'ctx>(
        &self,
        cx: &crate::lower::Cx<'ctx>,
        row: IntValue<'ctx>,
        col: IntValue<'ctx>,
    ) -> LResult<IntValue<'ctx>> {
        let b = &cx.b;
        let sh = cx.i32(self.block.trailing_zeros() as i64);
        let blk = b.build_right_shift(col, sh, false, "")?;
        let within = b.build_and(col, cx.i32(self.block as i64 - 1), "")?;
        let inner = self.swz.emit(cx, row, within)?;
        let start = b.build_int_mul(blk, cx.i32((self.rows * self.block) as i64), "")?;
        Ok(b.build_int_add(start, inner, "")?)
    }
}

/// The two arrays of a plan: A `[m][k]` at element 0, B `[k][n]` (or `[n][k]` when
/// [`WgPlan::b_k_major`]) after it.
#[derive(Clone, Copy, Debug)]
pub(in crate::lower) struct Arrays {
    pub a: Array,
    pub b: Array,
    pub a_elems: u32,
    pub b_elems: u32,
}

impl Arrays {
    pub fn new(p: &WgPlan) -> Arrays {
        let eb = p.elem_bytes;
        Arrays {
            a: Array::new(p.m, p.k, eb),
            b: if p.b_k_major {
                Array::new(p.n, p.k, eb)
            } else {
                Array::new(p.k, p.n, eb)
            },
            a_elems: p.m * p.k,
            b_elems: p.k * p.n,
        }
    }

    /// Bytes of both arrays, a multiple of [`ARRAY_ALIGN`].
    pub fn bytes(&self) -> u32 {
        ((self.a_elems + self.b_elems) * self.a.elem_bytes).next_multiple_of(ARRAY_ALIGN)
    }
}

/// Where operand `which`'s element `e` (flat index in the operand tile) goes, in
/// elements from the arrays' base.
pub(in crate::lower) fn elem_offset<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    p: &WgPlan,
    arr: &Arrays,
    which: usize,
    e: IntValue<'ctx>,
) -> LResult<IntValue<'ctx>> {
    let bd = &l.cx.b;
    let cols = if which == 0 { p.k } else { p.n };
    let r = bd.build_right_shift(e, l.cx.i32(cols.trailing_zeros() as i64), false, "")?;
    let c = bd.build_and(e, l.cx.i32(cols as i64 - 1), "")?;
    if which == 0 {
        return arr.a.emit(&l.cx, r, c);
    }
    let o = if p.b_k_major {
        arr.b.emit(&l.cx, c, r)?
    } else {
        arr.b.emit(&l.cx, r, c)?
    };
    Ok(bd.build_int_add(o, l.cx.i32(arr.a_elems as i64), "")?)
}

/// The element steps (in the operand tile's flat index) of one 16-byte staging store
/// of operand `which`: along a row of the array (`k` for A; for B `n`, or `k`, a
/// column of the `[k][n]` tile, when K-major).
pub(in crate::lower) fn store_runs(p: &WgPlan, which: usize) -> Vec<u32> {
    let step = if which == 1 && p.b_k_major { p.n } else { 1 };
    (0..(16 / p.elem_bytes).trailing_zeros())
        .map(|i| step << i)
        .collect()
}

/// A descriptor: `(start >> 4) & 0x3fff` from the runtime address `start` (bytes),
/// the constant fields from `hi`.
fn descriptor<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    start: IntValue<'ctx>,
    lbo: u32,
    sbo: u32,
    mode: u64,
) -> LResult<IntValue<'ctx>> {
    let b = &l.cx.b;
    let i64t = l.cx.ctx.i64_type();
    let enc = |x: u32| u64::from((x & 0x3ffff) >> 4);
    let lo = b.build_and(
        b.build_right_shift(start, l.cx.i32(4), false, "")?,
        l.cx.i32(0x3fff),
        "",
    )?;
    let lo = b.build_int_z_extend(lo, i64t, "")?;
    let hi = (enc(lbo) << 16) | (enc(sbo) << 32) | (mode << 62);
    Ok(b.build_or(lo, i64t.const_int(hi, false), "desc")?)
}

/// The descriptor of the matrix `off` bytes (a multiple of 16) past the one `desc`
/// describes: its start-address field (`addr >> 4`, 14 bits) plus `off >> 4`, which
/// never carries out of the field (shared memory is under 256 KiB, `2^14 * 16`), so
/// one 64-bit add instead of rebuilding the descriptor.
fn step_descriptor<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    desc: IntValue<'ctx>,
    off: u32,
) -> LResult<IntValue<'ctx>> {
    debug_assert!(off.is_multiple_of(16), "a matrix starts on 16 bytes");
    if off == 0 {
        return Ok(desc);
    }
    let step = l.cx.ctx.i64_type().const_int(u64::from(off >> 4), false);
    Ok(l.cx.b.build_int_add(desc, step, "desc")?)
}

pub(in crate::lower) fn lower<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    p: WgPlan,
) -> LResult<Tile<'ctx>> {
    let arr = Arrays::new(&p);
    let c = l.val(op.operands[2])?;
    // A zero accumulator (`zeros` or `full(0)`) is not materialized: the first
    // k-step's instructions clear `scale-d` (D = A·B) and take undefined registers.
    let zero_c = c.uniform
        && c.regs.first().is_some_and(|v| match v {
            BasicValueEnum::FloatValue(f) => f.get_constant().is_some_and(|(x, _)| x == 0.0),
            BasicValueEnum::IntValue(i) => i.get_zero_extended_constant() == Some(0),
            _ => false,
        });
    let clay = c_layout(&p, l.nw);
    let c = l.convert(&c, &clay, &op.span)?;
    let ring = l.async_dot(op).is_some();
    let base: PointerValue<'ctx> = super::smem::arrays_base(l, op, arr.bytes())?;
    l.note(|| {
        format!(
            "dot on wgmma: m64n{}k{} instructions, warpgroups {}x{}, {} tiles per warpgroup\n\
             A array [m][k] (K-major, {}B swizzle) {:?}\nB array {} ({}B swizzle) {:?}",
            p.n_inst,
            p.k_inst,
            p.wg_m,
            p.wg_n,
            p.reps_m,
            arr.a.row_bytes(),
            arr.a.swz,
            if p.b_k_major {
                "[n][k] (K-major)"
            } else {
                "[k][n] (N-major)"
            },
            arr.b.row_bytes(),
            arr.b.swz
        )
    });
    // A chained dot's A (attention's P) in the accumulator layout of the dot before
    // it holds the A register fragments: `wgmma` reads A from registers.
    // (16-bit types: the register fragment of 8-bit A is another layout.)
    let a_in_regs = if p.elem_bytes == 2 {
        super::mma::a_from_registers(l, op, |lay| wgmma_a_fragments(&p, lay))?
    } else {
        None
    };
    super::smem::stage_operands(l, op, a_in_regs.is_some(), |l, which, t| {
        super::smem::write_tile(l, t, base, &store_runs(&p, which), |e| {
            elem_offset(l, &p, &arr, which, e)
        })
    })?;
    // Every thread's shared-memory writes (stores, waited-for cp.async copies) are
    // generic-proxy accesses; the descriptors' reads are async-proxy ones. Operands
    // that only TMA wrote (async proxy, complete at their mbarrier) need no fence.
    if l.async_dot(op).is_none_or(|r| r.tma < 2) || a_in_regs.is_some() {
        l.arch.fence_async_shared(&l.cx)?;
    }
    let bd = &l.cx.b;
    let wg = bd.build_right_shift(l.warp, l.cx.i32(2), false, "")?;
    let wgm = bd.build_and(wg, l.cx.i32(p.wg_m as i64 - 1), "")?;
    let wgn = bd.build_right_shift(wg, l.cx.i32(p.wg_m.trailing_zeros() as i64), false, "")?;
    let wgn = bd.build_and(wgn, l.cx.i32(p.wg_n as i64 - 1), "")?;
    // In a ring, the descriptors are built from the ring's start (loop-invariant, so
    // hoisted out of the loop) and step by the read slot's offset: one 64-bit add per
    // operand per iteration instead of rebuilding the fields.
    let ring_read = match l.async_dot(op) {
        Some(r) => {
            let rd = l
                .async_slots
                .borrow()
                .get(&(op as *const Op))
                .map(|s| s.0)
                .ok_or_else(|| {
                    crate::lower::LowerError::Llvm("a ring slot outside its loop".into())
                })?;
            Some((l.smem_at(r.offset), rd))
        }
        None => None,
    };
    let saddr = l
        .arch
        .shared_address(&l.cx, ring_read.map_or(base, |(start, _)| start))?;
    let slot_step = |l: &Lowerer<'_, 'ctx>, d: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
        let Some((_, rd)) = ring_read else {
            return Ok(d);
        };
        let b = &l.cx.b;
        let i64t = l.cx.ctx.i64_type();
        let units = b.build_right_shift(rd, l.cx.i32(4), false, "")?;
        let units = b.build_int_z_extend(units, i64t, "")?;
        Ok(b.build_int_add(d, units, "desc")?)
    };
    // Byte offsets of this warpgroup's rows of A and columns of B.
    let (a_s, b_s) = (arr.a.row_bytes(), arr.b.row_bytes());
    let a_row0 = bd.build_int_mul(wgm, l.cx.i32((64 * a_s) as i64), "")?;
    // N-major: whole column blocks of `K x S`; K-major: rows of `S` bytes.
    let b_col0 = bd.build_int_mul(
        wgn,
        l.cx.i32(if p.b_k_major {
            (p.n_inst * b_s) as i64
        } else {
            ((p.n_inst / arr.b.block) * p.k * b_s) as i64
        }),
        "",
    )?;
    let a_base = bd.build_int_add(saddr, a_row0, "")?;
    let b_base = bd.build_int_add(
        bd.build_int_add(saddr, l.cx.i32((arr.a_elems * p.elem_bytes) as i64), "")?,
        b_col0,
        "",
    )?;
    let regs = (p.n_inst / 2) as usize;
    let poison: BasicValueEnum<'ctx> = match l.ty(c.elem) {
        inkwell::types::BasicTypeEnum::IntType(t) => t.get_poison().into(),
        t => t.into_float_type().get_poison().into(),
    };
    let mut accs: Vec<Vec<BasicValueEnum<'ctx>>> = (0..p.reps_m as usize)
        .map(|r| {
            if zero_c {
                return vec![poison; regs];
            }
            c.regs[r * regs..(r + 1) * regs].to_vec()
        })
        .collect();
    let eb = p.elem_bytes;
    // One descriptor per operand; the k-steps and row tiles add their byte offset
    // (`step_descriptor`).
    let b_desc0 = if p.b_k_major {
        descriptor(l, b_base, 16, 8 * b_s, arr.b.mode())?
    } else {
        descriptor(l, b_base, p.k * b_s, 8 * b_s, arr.b.mode())?
    };
    let b_desc0 = slot_step(l, b_desc0)?;
    let mut a_desc0 = None;
    let site = l.new_site("wgmma.fence");
    l.arch.wgmma_fence(&l.cx, site)?;
    for ks in 0..p.k / p.k_inst {
        let k0 = ks * p.k_inst;
        // B N-major: rows k0.. of this warpgroup's first column block; K-major: as A,
        // columns k0.. of its first row.
        let b_off = if p.b_k_major {
            (k0 / arr.b.block) * p.n * b_s + (k0 % arr.b.block) * eb
        } else {
            k0 * b_s
        };
        let desc_b = step_descriptor(l, b_desc0, b_off)?;
        for (r, acc) in accs.iter_mut().enumerate() {
            let site = l.new_site("wgmma");
            let scale_d = !(zero_c && ks == 0);
            let a_regs;
            let a = match &a_in_regs {
                Some((t, frags)) => {
                    let vals: Vec<_> = frags[r][ks as usize].iter().map(|&i| t.regs[i]).collect();
                    a_regs = crate::lower::arch::pack_words(&l.cx, &vals)?;
                    WgmmaA::Regs(&a_regs)
                }
                None => {
                    let m0 = r as u32 * 64 * p.wg_m;
                    let a_off = (k0 / arr.a.block) * p.m * a_s + m0 * a_s + (k0 % arr.a.block) * eb;
                    let a0 = match a_desc0 {
                        Some(d) => d,
                        None => {
                            let d = descriptor(l, a_base, 16, 8 * a_s, arr.a.mode())?;
                            let d = slot_step(l, d)?;
                            a_desc0 = Some(d);
                            d
                        }
                    };
                    WgmmaA::Desc(step_descriptor(l, a0, a_off)?)
                }
            };
            *acc = l.arch.wgmma(
                &l.cx,
                p.input,
                p.n_inst,
                a,
                desc_b,
                !p.b_k_major,
                scale_d,
                acc,
                r as u32,
                site,
            )?;
        }
    }
    let site = l.new_site("wgmma.commit_group");
    l.arch.wgmma_commit(&l.cx, site)?;
    // A ring with an overlapped accumulator leaves this group in flight (the loop
    // waits for the previous iteration's, and for the last after the loop).
    let pending = u32::from(l.async_dot(op).is_some_and(|a| a.overlap.is_some()));
    if pending > 0 {
        l.note(|| "wgmma.wait_group 1: the group stays in flight into the next iteration".into());
    }
    let site = l.new_site("wgmma.wait_group");
    let accs = l.arch.wgmma_wait(&l.cx, pending, &accs, site)?;
    if !ring {
        l.barrier()?;
    }
    Ok(Tile {
        elem: c.elem,
        layout: clay,
        regs: accs.into_iter().flatten().collect(),
        uniform: false,
    })
}

/// Waits for the in-flight wgmma group of `dot` `d` whose accumulators `t` holds
/// (after a loop that overlapped it, see `AsyncDot::overlap`).
pub(in crate::lower) fn finish_in_flight<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    d: &Op,
    t: &Tile<'ctx>,
) -> LResult<Tile<'ctx>> {
    let Some(p) = plan(l, d) else {
        return Err(crate::lower::LowerError::Llvm(
            "an overlapped dot off wgmma".into(),
        ));
    };
    let regs = (p.n_inst / 2) as usize;
    if t.regs.len() != regs * p.reps_m as usize {
        return Err(crate::lower::LowerError::Llvm(
            "overlapped accumulator of another size".into(),
        ));
    }
    let accs: Vec<Vec<BasicValueEnum<'ctx>>> = t.regs.chunks(regs).map(|c| c.to_vec()).collect();
    let site = l.new_site("wgmma.wait_group");
    let done = l.arch.wgmma_wait(&l.cx, 0, &accs, site)?;
    Ok(Tile {
        regs: done.into_iter().flatten().collect(),
        ..t.clone()
    })
}

/// [`a_fragments_in_registers`] for a `wgmma` plan: per warp of a warpgroup, the A
/// register fragment of `wgmma.m64nNk16` is the `mma.m16n8k16` one of the warp's 16
/// rows; warps along M are the warpgroup's four then the warpgroups along M, and a
/// 64-row tile repeats every `64 wg_m` rows.
pub(in crate::lower) fn wgmma_a_fragments(p: &WgPlan, lay: &Layout) -> Option<AFrags> {
    let info = crate::lower::arch::Nvptx {
        sm: 80,
        arch_specific: false,
    }
    .mma(p.input)?;
    let plan = Plan {
        info,
        warps_m: 4 * p.wg_m,
        warps_n: p.wg_n,
        reps_m: p.reps_m,
        reps_n: 1,
        transposed: false,
        scale_lane: None,
    };
    // Rep `mr` starts at row `mr * warps_m * 16 = mr * 64 wg_m`, as the wgmma plan's;
    // the k steps are 16 wide, as wgmma's.
    a_fragments_in_registers(&plan, lay)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lowering's arrays against the hardware's definition of the swizzled
    /// canonical layouts, computed here from the PTX ISA's formulas on byte
    /// addresses (independently of [`Swizzle`]).
    #[test]
    fn arrays_match_the_canonical_layouts() {
        // (rows, cols): K-major A blocks and N-major B blocks of every mode.
        for (rows, cols) in [
            (64, 16),
            (64, 32),
            (128, 64),
            (128, 128),
            (16, 128),
            (32, 32),
        ] {
            let arr = Array::new(rows, cols, 2);
            let s = arr.row_bytes();
            let mut seen = std::collections::HashSet::new();
            for r in 0..rows {
                for c in 0..cols {
                    // Canonical: block-major, then rows of S bytes; then the address
                    // bits [4, 4 + log2(S/16)) XOR bits [7, ..).
                    let plain = (c / (s / 2)) * rows * s + r * s + (c % (s / 2)) * 2;
                    let bits = (s / 16).trailing_zeros();
                    let mask = (1 << bits) - 1;
                    let hw = plain ^ (((plain >> 7) & mask) << 4);
                    assert_eq!(arr.offset(r, c) * 2, hw, "({r}, {c}) of {rows}x{cols}");
                    assert!(seen.insert(hw));
                }
            }
        }
    }
}

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
//! `a` is stored row-major and, on NVIDIA, `b` too; elsewhere `b` is stored
//! transposed (`[N][K]`, so both operands' fragments are runs of consecutive `k`).
//! Each array is XOR-swizzled ([`Swizzle`]) for the width of its fragment reads, so
//! the rows one read touches hit distinct banks without padding, and the staging
//! stores (16 bytes, or one swizzle unit) stay whole. On NVIDIA the fragments are
//! read with `ldmatrix` (`.x4` per 16x16 A tile, `.x4`/`.x2` per pair of / single n8
//! B tile) from 16-byte units; elsewhere with one vector load per run of `k`, from
//! units of the run's length. Warps tile `M` first, then
//! `N`; each warp loops over its `reps_m × reps_n` instruction tiles for every
//! `k`-step. The accumulator layout ([`mma_layout`]) is the instruction's C fragment
//! repeated over tiles: register bits = fragment bits, then `N` repeats, then `M`
//! repeats; warp bits = `M` tiles, then `N` tiles (extra warps replicate).

use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue};
use std::collections::HashMap;

use tessera_ir::ir::{Op, OpKind};
use tessera_ir::{Elem, ScalarType, ValueId};

use crate::layout::Layout;
use crate::lower::arch::{Arch, FragInfo, MmaInfo};
use crate::lower::{LResult, Lowerer, Tile};

pub(super) mod wgmma;

/// An XOR-swizzled row-major shared-memory array `[rows][cols]` of one `dot` operand.
///
/// A row is cut into units of `vec` consecutive elements (the width one lane reads or
/// writes at once); unit `u` of row `r` is stored at unit `u ^ phase(r)` with
/// `phase(r) = (r / per_phase) % max_phase`. The phases are chosen so that the rows an
/// access touches at the same column (8 rows of 16 bytes for `ldmatrix`, 16 rows of 8
/// bytes for MFMA fragments: 128 bytes, all 32 banks) land in distinct banks, with no
/// padding: `per_phase` rows share a 128-byte line, and `max_phase` phases cycle
/// through the line's units. Units never cross rows, and a unit's elements stay
/// consecutive, so a store or load of at most `vec` aligned elements stays one access.
///
/// A transposed B is written by stores whose lanes step 8 rows apart (each lane holds
/// 8 consecutive `n`), and the rows of a line all sit at the same phase; for it
/// [`Self::mixed`] XORs a second, higher slice of the row bits into the unit index
/// within the 128-byte line, which spreads those stores over all the banks while the
/// fragment reads stay conflict-free. Every term takes row bits above the bits it
/// flips, so the map stays a bijection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Swizzle {
    /// Elements per row.
    pub cols: u32,
    /// Elements per unit.
    pub vec: u32,
    /// Consecutive rows with the same phase.
    pub per_phase: u32,
    /// Number of distinct phases.
    pub max_phase: u32,
    /// `(shift, mask)`: the units `(row >> shift) & mask` are XORed in as well (the
    /// shift is at least the lowest set bit of the mask, see [`Self::mixed`]).
    pub mix: Option<(u32, u32)>,
}

impl Swizzle {
    /// The swizzle of rows of `cols` elements of `elem_bytes` bytes each, accessed
    /// `vec` elements at a time (all powers of two).
    pub fn new(cols: u32, elem_bytes: u32, vec: u32) -> Swizzle {
        let vec = vec.min(cols);
        let row_bytes = cols * elem_bytes;
        let units_per_line = (128 / (vec * elem_bytes)).max(1);
        let per_phase = (128 / row_bytes).max(1);
        let max_phase = (cols / vec).min(units_per_line / per_phase).max(1);
        Swizzle {
            cols,
            vec,
            per_phase,
            max_phase,
            mix: None,
        }
    }

    /// The same, with row bits `row_shift..` XORed into the units of a 128-byte line
    /// from unit bit `unit_shift` up as well (see the type's docs).
    pub fn mixed(self, row_shift: u32, unit_shift: u32, elem_bytes: u32) -> Swizzle {
        let line_units = (128 / (self.vec * elem_bytes)).max(1);
        let mask = (line_units - 1) & !((1 << unit_shift) - 1);
        // A term must take row bits above every bit it flips: the unit bits above the
        // row's own units are the low row bits.
        let unit_bits = (self.cols / self.vec).trailing_zeros();
        if row_shift < unit_shift || mask == 0 || row_shift - unit_shift + unit_bits == 0 {
            return self;
        }
        Swizzle {
            mix: Some((row_shift - unit_shift, mask)),
            ..self
        }
    }

    /// The element offset of `(row, col)`.
    pub fn offset(&self, row: u32, col: u32) -> u32 {
        let mut phase = (row / self.per_phase) % self.max_phase;
        if let Some((shift, mask)) = self.mix {
            phase ^= (row >> shift) & mask;
        }
        (row * self.cols + col) ^ (phase * self.vec)
    }

    /// [`Self::offset`] in LLVM IR.
    pub(super) fn emit<'ctx>(
        &self,
        cx: &super::Cx<'ctx>,
        row: IntValue<'ctx>,
        col: IntValue<'ctx>,
    ) -> LResult<IntValue<'ctx>> {
        let b = &cx.b;
        let c = |x: u32| cx.i32(x as i64);
        let flat = b.build_int_add(b.build_int_mul(row, c(self.cols), "")?, col, "")?;
        let term = |shift: u32, mask: u32| -> LResult<IntValue<'ctx>> {
            let t = b.build_right_shift(row, c(shift), false, "")?;
            Ok(b.build_and(t, c(mask), "")?)
        };
        let mut phase = None;
        if self.max_phase > 1 {
            phase = Some(term(self.per_phase.trailing_zeros(), self.max_phase - 1)?);
        }
        if let Some((shift, mask)) = self.mix {
            let t = term(shift, mask)?;
            phase = Some(match phase {
                Some(p) => b.build_xor(p, t, "")?,
                None => t,
            });
        }
        let Some(phase) = phase else {
            return Ok(flat);
        };
        let sw = b.build_left_shift(phase, c(self.vec.trailing_zeros()), "")?;
        Ok(b.build_xor(flat, sw, "")?)
    }
}

struct Plan {
    info: MmaInfo,
    warps_m: u32,
    warps_n: u32,
    reps_m: u32,
    reps_n: u32,
    /// The instructions compute the transposed product ([`MmaInfo::transposable`]),
    /// so each lane holds elements of one row of the result (AMD's MFMA in a chain
    /// of dots, as Triton's transposed MFMA layout): row reductions stay within the
    /// lane's registers but for one lane step, and the C fragment of one dot is the A
    /// fragment of the next (see [`a_fragments_in_registers`]).
    transposed: bool,
}

/// The `mma.sync`/MFMA plan of `op` (`None` on the FMA path, and for a `dot` that
/// takes the `wgmma` path, [`wgmma::plan`]).
fn plan(l: &Lowerer<'_, '_>, op: &Op) -> Option<Plan> {
    if wgmma::plan(l, op).is_some() {
        return None;
    }
    let a = l.f.ty(op.operands[0]);
    let b = l.f.ty(op.operands[1]);
    let s = a.scalar_type()?;
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let info = l.arch.mma_for(s, m, n, k, l.nw)?;
    if m % info.m != 0 || n % info.n != 0 || k % info.k != 0 {
        return None;
    }
    let (tiles_m, tiles_n) = (m / info.m, n / info.n);
    // A chain of dots (one's result, elementwise, is the next one's A) puts every
    // warp along M, so the first's accumulators are the second's A fragments
    // ([`a_fragments_in_registers`]) and its row reductions stay inside warps.
    let chain = tiles_m >= l.nw && in_chain(l, op);
    let (warps_m, warps_n) = if chain {
        (l.nw, 1)
    } else {
        warp_grid(l.nw, tiles_m, tiles_n)
    };
    Some(Plan {
        reps_m: m / (info.m * warps_m),
        reps_n: n / (info.n * warps_n),
        transposed: chain && info.transposable(),
        info,
        warps_m,
        warps_n,
    })
}

/// The `dot` whose result `v` is computed from by elementwise ops of the same shape
/// (casts included), if any.
fn dot_source<'f>(l: &Lowerer<'f, '_>, v: ValueId, depth: u32) -> Option<&'f Op> {
    if depth > 8 {
        return None;
    }
    let d = *l.defs.get(&v)?;
    match d.kind {
        OpKind::Dot => Some(d),
        OpKind::Binary(_) | OpKind::Unary(_) | OpKind::Fma | OpKind::Select | OpKind::Cast => d
            .operands
            .iter()
            .filter(|&&o| l.f.ty(o).shape == l.f.ty(v).shape)
            .find_map(|&o| dot_source(l, o, depth + 1)),
        _ => None,
    }
}

/// Whether `op` is in a chain of `dot`s: its A operand is computed from a `dot`'s
/// result, or its result is another `dot`'s A (attention's `S = Q Kᵀ`, `O += P V`).
fn in_chain(l: &Lowerer<'_, '_>, op: &Op) -> bool {
    dot_source(l, op.operands[0], 0).is_some()
        || l.defs.values().any(|d| {
            d.kind == OpKind::Dot
                && dot_source(l, d.operands[0], 0).is_some_and(|s| std::ptr::eq(s, op))
        })
}

/// The registers of the A tile `a` (layout `lay`) that are the A fragments of `p`'s
/// instructions, `[m tile][k step][element]` in [`FragInfo::runs`] order, when `a`
/// already holds them: its lane bases are the fragment's, its warp bases the rows of
/// the plan's warps along M (none along N), and every fragment element of every tile
/// and step is in some register of the lane that reads it (a chained `dot`'s `P`,
/// computed in the previous `dot`'s accumulator layout: the `mma.m16n8` C fragments
/// of two n8 tiles are the A fragment of a k16 step).
fn a_fragments_in_registers(p: &Plan, lay: &Layout) -> Option<AFrags> {
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

/// Writes the operands of matrix-path `dot` `op` that are not in its arrays yet (not
/// staged by a loop, and A not read from registers when `a_in_regs`) with `stage`,
/// then waits at a barrier if it wrote any.
pub(super) fn stage_operands<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: &Op,
    a_in_regs: bool,
    mut stage: impl FnMut(&Lowerer<'_, 'ctx>, usize, &Tile<'ctx>) -> LResult<()>,
) -> LResult<()> {
    let mut wrote = false;
    for which in 0..2 {
        if (which == 0 && a_in_regs) || l.is_staged(op, which) {
            continue;
        }
        let t = l.val(op.operands[which])?;
        stage(l, which, &t)?;
        wrote = true;
    }
    if wrote {
        l.barrier()?;
    }
    Ok(())
}

/// Fragment register indices `[m tile][k step][element]` of an A operand.
pub(super) type AFrags = Vec<Vec<Vec<usize>>>;

/// The tile of `dot` `op`'s A and the registers of its A fragments (`frags` of its
/// layout) when A is in registers that already hold them (a chained dot's `P`), not
/// staged by a loop; `None` when A goes through shared memory.
pub(super) fn a_from_registers<'ctx>(
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

/// [`a_fragments_in_registers`] for a `wgmma` plan: per warp of a warpgroup, the A
/// register fragment of `wgmma.m64nNk16` is the `mma.m16n8k16` one of the warp's 16
/// rows; warps along M are the warpgroup's four then the warpgroups along M, and a
/// 64-row tile repeats every `64 wg_m` rows.
pub(super) fn wgmma_a_fragments(p: &wgmma::WgPlan, lay: &Layout) -> Option<AFrags> {
    let info = super::arch::Nvptx {
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
    };
    // Rep `mr` starts at row `mr * warps_m * 16 = mr * 64 wg_m`, as the wgmma plan's;
    // the k steps are 16 wide, as wgmma's.
    a_fragments_in_registers(&plan, lay)
}

/// The warp grid of a `dot` with `tiles_m x tiles_n` instruction tiles on `nw` warps:
/// the split of the warps (powers of two, each at most its tile count) that gives
/// each warp the squarest block, `tiles_m / warps_m + tiles_n / warps_n` smallest
/// (each warp reads the A fragments of its rows and the B fragments of its columns,
/// so that sum is its fragment reads per k-step), more warps along M on a tie; when
/// the tiles are fewer than the warps, M first and the rest replicate.
fn warp_grid(nw: u32, tiles_m: u32, tiles_n: u32) -> (u32, u32) {
    let mut best: Option<(u32, u32, u32)> = None;
    let mut wm = nw;
    while wm >= 1 {
        let wn = nw / wm;
        if wm <= tiles_m && wn <= tiles_n {
            let cost = tiles_m / wm + tiles_n / wn;
            if best.is_none_or(|b| cost < b.0) {
                best = Some((cost, wm, wn));
            }
        }
        wm /= 2;
    }
    match best {
        Some((_, wm, wn)) => (wm, wn),
        None => {
            let wm = nw.min(tiles_m);
            (wm, (nw / wm).min(tiles_n))
        }
    }
}

/// Whether `dot` stages its B operand transposed (`[N][K]`): on the matrix path of
/// targets without `ldmatrix`.
fn b_transposed(l: &Lowerer<'_, '_>, p: &Plan) -> bool {
    !(l.arch.has_ldmatrix() && ldmatrix_shape(&p.info))
}

/// Whether `ldmatrix` reads the fragments of `info`: NVIDIA `mma.m16n8k16` (16-bit)
/// and `mma.m16n8k32` (8-bit), whose A and B fragments are the 8x8 matrices of 16-byte
/// rows `ldmatrix` loads (four 8-bit elements in each of its 32-bit registers).
fn ldmatrix_shape(info: &MmaInfo) -> bool {
    matches!((info.m, info.n, info.k), (16, 8, 16) | (16, 8, 32))
}

/// Whether load `ld` feeds only B operands of `dot`s that stage B with consecutive
/// `k` together (`[n][k]`: K-major on `wgmma`, transposed on the matrix path without
/// `ldmatrix`) and reads 16-byte runs along `k` (dimension 0): it then loads in
/// [`Layout::blocked_columns`], and the staging stores take whole runs of `k`.
pub(super) fn k_major_operand(l: &Lowerer<'_, '_>, ld: &Op) -> bool {
    let uses = l.dot_uses(ld.results[0]);
    let k_major = |d: &Op| match wgmma::plan(l, d) {
        Some(p) => p.b_k_major,
        None => plan(l, d).is_some_and(|p| b_transposed(l, &p) || b_nk(l, d, &p)),
    };
    !uses.is_empty()
        && wgmma::dim0_contiguous(l, ld)
        && uses.iter().all(|&(d, i)| i == 1 && k_major(d))
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
    // The swizzle unit of each use's transposed B (`None` for another use).
    let units: Vec<Option<u32>> = uses
        .iter()
        .map(|&(op, i)| {
            let p = plan(l, op).filter(|p| i == 1 && b_staged_nk(l, op, p))?;
            if !b_transposed(l, &p) {
                // `ldmatrix` reads 16-byte units.
                return Some(16 / super::type_bytes(l.f.ty(op.operands[1]).elem));
            }
            let eb = super::type_bytes(l.f.ty(op.operands[1]).elem);
            Some(frag_unit(&p.info, &p.info.b, false, shape[0], eb))
        })
        .collect();
    let unit = (*units.first()?)?;
    if shape.len() != 2 || units.iter().any(|&u| u != Some(unit)) {
        return None;
    }
    Some(bt_load_layout(shape, vec, l.ws, l.nw, unit))
}

/// The elements of one swizzle unit of an operand array read by fragments `f`
/// without `ldmatrix`: the fragment's shortest run of `k`, twice that with paired
/// reads.
fn frag_unit(info: &MmaInfo, f: &FragInfo, ldm: bool, k: u32, elem_bytes: u32) -> u32 {
    let r = f.runs.iter().map(|r| r.2).min().unwrap_or(1);
    if paired_reads(info, ldm, k, elem_bytes) {
        2 * r
    } else {
        r
    }
}

/// The layout of [`operand_load_layout`] for a B operand staged transposed into an
/// array of `unit`-element swizzle units, `vec` the 16-byte vector width (16 / the
/// element's bytes): `vec` consecutive `n` and (where the threads still cover the
/// tile) the consecutive `k` of one 32-bit store per thread (2 of 16-bit elements, 4
/// of 8-bit); then lanes along `n`, one vector per unit of a 128-byte line, then
/// along `k` up to the 32 lanes of one 32-bit store group; then the rest of `n`,
/// then of `k`.
pub(super) fn bt_load_layout(shape: &[u32], vec: u32, ws: u32, nw: u32, unit: u32) -> Layout {
    let (kb, nb) = (shape[0].trailing_zeros(), shape[1].trailing_zeros());
    let threads = (ws * nw).trailing_zeros();
    let vb = vec.trailing_zeros().min(nb);
    let elem_bytes = (16 / vec.max(1)).max(1);
    // k bits in registers: those of one 32-bit store at most, and only as many as
    // leave the threads covering the tile with the rest.
    let word_k = (4 / elem_bytes).max(1).trailing_zeros();
    let rk = (0..=word_k.min(kb))
        .rev()
        .find(|&r| vb + r + threads <= kb + nb)
        .unwrap_or(0);
    // Flat index bits: n is bits 0..nb, k is bits nb..nb + kb.
    // Lanes take one n vector per unit of a line, then k bits up to 32 lanes, so that
    // the lanes of one 32-bit store can cover the 32 banks of the transposed array
    // (see `mix_for_stores`), then the rest.
    let n_lane_bits = (128 / (unit * elem_bytes).max(1)).trailing_zeros();
    let n_first = (vb + n_lane_bits).min(nb);
    let k_next = (nb + rk + 5u32.saturating_sub(n_lane_bits)).min(nb + kb);
    let mut order: Vec<u32> = (0..vb).collect(); // n vector
    order.extend((0..rk).map(|i| nb + i)); // k pairs
    order.extend(vb..n_first); // 16 n vectors
    order.extend(nb + rk..k_next); // one more k
    order.extend(n_first..nb); // the rest of n
    order.extend(k_next..nb + kb); // the rest of k
    let bits = |range: std::ops::Range<usize>| -> Vec<u32> {
        range.map(|i| order.get(i).map_or(0, |&b| 1 << b)).collect()
    };
    let (nreg0, nlane, nwarp) = (
        (vb + rk) as usize,
        ws.trailing_zeros() as usize,
        nw.trailing_zeros() as usize,
    );
    let mut reg = bits(0..nreg0);
    let lane = bits(nreg0..nreg0 + nlane);
    let warp = bits(nreg0 + nlane..nreg0 + nlane + nwarp);
    reg.extend(order.iter().skip(nreg0 + nlane + nwarp).map(|&b| 1u32 << b));
    Layout {
        shape: shape.to_vec(),
        reg,
        lane,
        warp,
    }
}

/// The accumulator layout of `dot` on the matrix units, if it uses them.
pub(super) fn mma_layout(l: &Lowerer<'_, '_>, op: &Op) -> Option<Layout> {
    if let Some(p) = wgmma::plan(l, op) {
        return Some(wgmma::c_layout(&p, l.nw));
    }
    let p = plan(l, op)?;
    let m = l.f.ty(op.operands[0]).shape[0];
    let n = l.f.ty(op.operands[1]).shape[1];
    Some(c_layout(&p, m, n, l.nw))
}

fn c_layout(p: &Plan, m: u32, n: u32, nw: u32) -> Layout {
    let i = &p.info;
    // Within an instruction's tile; a transposed product exchanges its coordinates.
    let at = |&(r, c): &(u32, u32)| if p.transposed { vec![c, r] } else { vec![r, c] };
    let mut reg: Vec<Vec<u32>> = i.c_reg.iter().map(at).collect();
    for j in 0..p.reps_n.trailing_zeros() {
        reg.push(vec![0, (i.n * p.warps_n) << j]);
    }
    for j in 0..p.reps_m.trailing_zeros() {
        reg.push(vec![(i.m * p.warps_m) << j, 0]);
    }
    let lane: Vec<Vec<u32>> = i.c_lane.iter().map(at).collect();
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
    if let Some(p) = wgmma::plan(l, op) {
        return wgmma::lower(l, op, p);
    }
    if let Some(s) =
        l.f.ty(op.operands[0])
            .scalar_type()
            .filter(|s| s.is_fp8() && l.arch.mma(*s).is_none())
    {
        // Only `wgmma` and NVIDIA's `mma.sync` m16n8k32 fragments (`Arch::mma`)
        // multiply 8-bit floats as they are; `crate::fp8` casts the operands of the
        // others to f16 before lowering.
        return Err(super::LowerError::Unsupported {
            span: op.span.clone(),
            message: format!(
                "`dot` on {s} takes wgmma (both operands K-major), mma.sync (sm_80 to sm_90) or f16 operands"
            ),
        });
    }
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
pub(super) fn write_tile<'ctx>(
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
/// from the `[outer][k]` array `swz` at `base + first` (in elements).
#[allow(clippy::too_many_arguments)]
fn load_frag<'ctx>(
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
fn load_run<'ctx>(
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
fn unpack_words<'ctx>(
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
fn row_elems(ety: BasicTypeEnum<'_>) -> u32 {
    match ety {
        BasicTypeEnum::IntType(t) => 128 / t.get_bit_width().max(1),
        _ => 8,
    }
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
/// the `a[m][k]` array `swz` at `base`, with one `ldmatrix.x4`: the four 8x8 matrices are (rows
/// 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15), which are
/// the fragment's registers `a0a1`, `a2a3`, `a4a5`, `a6a7` (PTX ISA, "Matrix
/// Fragments for mma.m16n8k16"); lane `i` gives row `i % 16` at k `8 * (i / 16)`.
/// With 8-bit elements (`mma.m16n8k32`) a matrix row is 16 of `k`: the matrices are
/// the registers `a0..a3` (rows 0-7, k 0-15), `a4..a7` (rows 8-15), `a8..a11` (rows
/// 0-7, k 16-31) and `a12..a15`, lane `i` giving row `i % 16` at k `16 * (i / 16)`.
fn ldmatrix_a<'ctx>(
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
fn ldmatrix_b<'ctx>(
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

/// Whether the fragment reads of two consecutive k-steps are one 16-byte run per
/// lane: on the matrix path without `ldmatrix`, when each lane's fragment is one run
/// of `r` consecutive `k` of 8 bytes (4 halves: the f16 MFMA; 8 bytes: gfx942's i8
/// MFMA) and `K` holds whole pairs of steps. The pair's `2 * info.k` columns are
/// then dealt out so that a lane's run `2 * lane_k .. + 2r` holds its `r` for the
/// first step and its `r` for the second: the k order inside the pair is permuted,
/// the same way for A and B (whose lanes map to `k` alike), which leaves the product
/// unchanged and makes every read 16 bytes.
pub(super) fn paired_reads(info: &MmaInfo, ldm: bool, k: u32, elem_bytes: u32) -> bool {
    let lane_k = |f: &FragInfo| f.lane.iter().map(|l| l.1).collect::<Vec<_>>();
    let r = pair_run(info);
    !ldm && r * elem_bytes == 8
        && info.b.runs == info.a.runs
        && lane_k(&info.a) == lane_k(&info.b)
        && k.is_multiple_of(2 * info.k)
}

/// The length of the one run of `k` each lane's A fragment is (0 if it is more than
/// one run): what [`paired_reads`] pairs.
fn pair_run(info: &MmaInfo) -> u32 {
    match info.a.runs[..] {
        [(0, 0, r)] => r,
        _ => 0,
    }
}

/// The shared arrays of `dot`'s operands on the matrix path (`a[m][k]`, and `b[k][n]`
/// when read with `ldmatrix`, else `b[n][k]`), swizzled for the width each fragment
/// read takes: 16-byte rows of 8x8 matrices for `ldmatrix`, else the fragment's
/// shortest run of consecutive `k`. `ws` and `nw` give the staging stores' layout
/// ([`bt_load_layout`] for a transposed B).
pub(super) fn operand_swizzles(
    info: &MmaInfo,
    ldm: bool,
    (n, k): (u32, u32),
    elem_bytes: u32,
    (ws, nw): (u32, u32),
) -> (Swizzle, Swizzle) {
    if ldm {
        let v = 16 / elem_bytes;
        (
            Swizzle::new(k, elem_bytes, v),
            Swizzle::new(n, elem_bytes, v),
        )
    } else {
        let (au, bu) = (
            frag_unit(info, &info.a, ldm, k, elem_bytes),
            frag_unit(info, &info.b, ldm, k, elem_bytes),
        );
        let bt = Swizzle::new(k, elem_bytes, bu);
        (
            Swizzle::new(k, elem_bytes, au),
            mix_for_stores(
                bt,
                &bt_load_layout(&[k, n], 16 / elem_bytes, ws, nw, bu),
                elem_bytes,
                ws,
            ),
        )
    }
}

/// `swz` (the transposed B, `[n][k]`) mixed so that the stores of `lay` (the `[k][n]`
/// registers) spread over the banks too: the lanes of one store walk rows `n` 8
/// apart, which the plain phases map to few units. Tries each row slice and unit
/// offset of [`Swizzle::mixed`] and keeps the first that minimises (the passes of one
/// fragment read, then of one staging store: reads are the more frequent); the swizzle is XOR
/// linear in the row and column bits, so one aligned read group and one store
/// register stand for all of them.
fn mix_for_stores(swz: Swizzle, lay: &Layout, elem_bytes: u32, ws: u32) -> Swizzle {
    let n = lay.shape[1];
    let unit_bytes = swz.vec * elem_bytes;
    // A fragment read: rows 0.. (one per lane of a 128-byte group) at unit 0.
    let read_rows = (128 / unit_bytes).min(n);
    let read = |z: &Swizzle| {
        let units = (0..read_rows).map(|r| z.offset(r, 0) / z.vec);
        max_share(units.map(|u| (u % (128 / unit_bytes), u)))
    };
    // A staging store: register 0 of the lanes of one 128-byte group, with the
    // consecutive `k` the registers hold (up to 32 bits).
    let k_regs = (0..2).take_while(|&j| lay.reg.contains(&(n << j))).count() as u32;
    let store_bytes = (elem_bytes << k_regs).min(4);
    let group = (128 / store_bytes).min(ws);
    let store = |z: &Swizzle| {
        let words = (0..group).map(|t| {
            let e = lay.elem_index(0, t, 0);
            let word = z.offset(e % n, e / n) * elem_bytes / 4;
            (word % 32, word)
        });
        max_share(words)
    };
    let line_bits = (128 / unit_bytes).trailing_zeros();
    let mut best = (swz, (read(&swz), store(&swz)));
    for row_shift in 1..8 {
        for unit_shift in 0..line_bits {
            let z = swz.mixed(row_shift, unit_shift, elem_bytes);
            let (r, st) = (read(&z), store(&z));
            let score = (r, st);
            if score < best.1 {
                best = (z, score);
            }
        }
    }
    best.0
}

/// The largest number of distinct values sharing a key, over `(key, value)` pairs.
pub(super) fn max_share(pairs: impl Iterator<Item = (u32, u32)>) -> u32 {
    let mut by_key: HashMap<u32, Vec<u32>> = HashMap::new();
    for (k, v) in pairs {
        let vs = by_key.entry(k).or_default();
        if !vs.contains(&v) {
            vs.push(v);
        }
    }
    by_key.values().map(|v| v.len() as u32).max().unwrap_or(1)
}

/// The shared arrays of a `dot` on the matrix path: `a[m][k]` then `b` (`[k][n]`
/// read with `ldmatrix`, else `[n][k]`), swizzled ([`operand_swizzles`]).
struct Arrays {
    ldm: bool,
    /// With `ldmatrix`: B staged `[n][k]` (a B contiguous along `k`, see
    /// [`b_nk`]) and read without `.trans`.
    b_nk: bool,
    a_swz: Swizzle,
    b_swz: Swizzle,
    m: u32,
    n: u32,
    k: u32,
    /// Bytes of one operand element.
    elem_bytes: u32,
}

impl Arrays {
    fn new(l: &Lowerer<'_, '_>, op: &Op, p: &Plan) -> Arrays {
        let a = &l.f.ty(op.operands[0]).shape;
        let (m, k, n) = (a[0], a[1], l.f.ty(op.operands[1]).shape[1]);
        let elem_bytes = super::type_bytes(l.f.ty(op.operands[0]).elem);
        // `ldmatrix` reads the NVIDIA m16n8k16 fragments; B is then row-major (16-byte
        // stores, read with `.trans`). Elsewhere B is staged transposed (`[n][k]`).
        let ldm = !b_transposed(l, p);
        let b_nk = b_nk(l, op, p);
        let (a_swz, mut b_swz) = operand_swizzles(&p.info, ldm, (n, k), elem_bytes, (l.ws, l.nw));
        if b_nk {
            // Rows of `k`, read 16 bytes at a time, as A's.
            b_swz = Swizzle::new(k, elem_bytes, 16 / elem_bytes);
        }
        Arrays {
            ldm,
            b_nk,
            a_swz,
            b_swz,
            m,
            n,
            k,
            elem_bytes,
        }
    }

    /// Elements of A (B follows).
    fn a_elems(&self) -> u32 {
        self.m * self.k
    }

    /// Bytes of both arrays.
    fn bytes(&self) -> u32 {
        (self.a_elems() + self.k * self.n) * self.elem_bytes
    }
}

/// Whether the `ldmatrix` path stages B `[n][k]` (read with plain `ldmatrix`, whose
/// 8x8 matrices of `[n][k]` rows are the B fragments): when B arrives contiguous
/// along `k` ([`wgmma::k_contiguous`], attention's `Kᵀ`), so that its loads and
/// staging stores are 16 bytes; and always for 8-bit inputs (m16n8k32).
fn b_nk(l: &Lowerer<'_, '_>, op: &Op, p: &Plan) -> bool {
    !b_transposed(l, p) && (wgmma::k_contiguous(l, op.operands[1]) || p.info.k == 32)
}

/// Whether `dot` `op` stages B `[n][k]`: transposed ([`b_transposed`]) or read with
/// plain `ldmatrix` ([`b_nk`]; always for 8-bit inputs, whose `ldmatrix` has no
/// transposing form).
fn b_staged_nk(l: &Lowerer<'_, '_>, op: &Op, p: &Plan) -> bool {
    b_transposed(l, p) || b_nk(l, op, p)
}

/// The bytes of shared memory in which `dot` stages its operands on the matrix path
/// (`None`: the FMA path).
pub(super) fn matrix_staging_bytes(l: &Lowerer<'_, '_>, op: &Op) -> Option<u32> {
    if let Some(p) = wgmma::plan(l, op) {
        return Some(wgmma::Arrays::new(&p).bytes());
    }
    plan(l, op).map(|p| Arrays::new(l, op, &p).bytes())
}

/// The dimension of operand `which`'s tile that runs along the rows of its array in
/// the matrix-path `dot` `op` (consecutive elements there, as a 16-byte asynchronous
/// copy of a load contiguous along that dimension needs): 1 (`k`) for A; for B 1
/// (`n`) when staged `[k][n]`, 0 (`k`) when staged `[n][k]` (K-major on `wgmma`,
/// transposed or plain-`ldmatrix` on the matrix path, as for `i8`).
pub(super) fn array_row_dim(l: &Lowerer<'_, '_>, op: &Op, which: usize) -> usize {
    if which == 0 {
        return 1;
    }
    let nk = match wgmma::plan(l, op) {
        Some(p) => p.b_k_major,
        None => plan(l, op).is_some_and(|p| b_staged_nk(l, op, &p)),
    };
    if nk { 0 } else { 1 }
}

/// Writes operand `which` (0: A, 1: B) of the matrix-path `dot` `op`, the tile `t`,
/// into its array at `base` (no barrier).
pub(super) fn stage_operand<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: &Op,
    which: usize,
    t: &Tile<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
) -> LResult<()> {
    if let Some(p) = wgmma::plan(l, op) {
        let arr = wgmma::Arrays::new(&p);
        return write_tile(l, t, base, &wgmma::store_runs(&p, which), |e| {
            wgmma::elem_offset(l, &p, &arr, which, e)
        });
    }
    let Some(p) = plan(l, op) else {
        return Err(super::LowerError::Llvm("staging an FMA-path dot".into()));
    };
    stage(l, &Arrays::new(l, op, &p), which, t, base)
}

/// Where (in elements from the arrays' base) operand `which`'s element `e` (its flat
/// index in the operand tile) goes: `a[m][k]` at `a_swz(m, k)`; `b[k][n]` at
/// `a_elems + b_swz(k, n)` with `ldmatrix`, else transposed at `a_elems + b_swz(n, k)`.
fn elem_offset<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    arr: &Arrays,
    which: usize,
    e: IntValue<'ctx>,
) -> LResult<IntValue<'ctx>> {
    let bd = &l.cx.b;
    if which == 0 {
        let k = arr.k;
        let r = bd.build_right_shift(e, l.cx.i32(k.trailing_zeros() as i64), false, "")?;
        let cc = bd.build_and(e, l.cx.i32(k as i64 - 1), "")?;
        return arr.a_swz.emit(&l.cx, r, cc);
    }
    let n = arr.n;
    let kk = bd.build_right_shift(e, l.cx.i32(n.trailing_zeros() as i64), false, "")?;
    let nn = bd.build_and(e, l.cx.i32(n as i64 - 1), "")?;
    let o = if arr.ldm && !arr.b_nk {
        arr.b_swz.emit(&l.cx, kk, nn)?
    } else {
        arr.b_swz.emit(&l.cx, nn, kk)?
    };
    Ok(bd.build_int_add(o, l.cx.i32(arr.a_elems() as i64), "")?)
}

/// [`elem_offset`] for the matrix-path `dot` `op` (an asynchronous copy's target).
pub(super) fn operand_offset<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: &Op,
    which: usize,
    e: IntValue<'ctx>,
) -> LResult<IntValue<'ctx>> {
    if let Some(p) = wgmma::plan(l, op) {
        return wgmma::elem_offset(l, &p, &wgmma::Arrays::new(&p), which, e);
    }
    let Some(p) = plan(l, op) else {
        return Err(super::LowerError::Llvm(
            "an FMA-path dot has no arrays".into(),
        ));
    };
    elem_offset(l, &Arrays::new(l, op, &p), which, e)
}

fn stage<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    arr: &Arrays,
    which: usize,
    t: &Tile<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
) -> LResult<()> {
    // A: runs along k of at most one unit stay consecutive. B: with ldmatrix runs
    // along n; transposed, a run goes down a column of the tile, steps of `n` elements
    // (pairs of k, which `operand_load_layout` puts in registers, or up to a unit of
    // consecutive k from a load walked down the columns).
    let runs = if which == 0 {
        row_runs(arr.a_swz.vec)
    } else if arr.ldm && !arr.b_nk {
        row_runs(arr.b_swz.vec)
    } else {
        row_runs(arr.b_swz.vec).iter().map(|s| s * arr.n).collect()
    };
    write_tile(l, t, base, &runs, |e| elem_offset(l, arr, which, e))
}

/// Where the shared arrays (`bytes` of them) of matrix-path `dot` `op` are: this
/// iteration's slot of its `cp.async` ring, the arrays a loop stages its operands
/// in, or scratch.
pub(super) fn arrays_base<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    bytes: u32,
) -> LResult<inkwell::values::PointerValue<'ctx>> {
    if l.async_dot(op).is_some() {
        return l.async_base(op, None);
    }
    Ok(match l.pipe_base(op) {
        Some(b) => b,
        None => l.scratch(bytes, &op.span),
    })
}

fn lower_mma<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op, p: Plan) -> LResult<Tile<'ctx>> {
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
    let a_in_regs = a_from_registers(l, op, |lay| a_fragments_in_registers(&p, lay))?;
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
        for (afs, bfs) in afr.iter().zip(&bfr) {
            for (mr, af) in afs.iter().enumerate() {
                for (nr, bf) in bfs.iter().enumerate() {
                    let at = (mr * p.reps_n as usize + nr) * fr;
                    let site = l.new_site("mma");
                    // Transposed: B's fragment in A's place and A's in B's (`Dᵀ = Bᵀ Aᵀ`).
                    let (x, y) = if p.transposed { (bf, af) } else { (af, bf) };
                    let d = l.arch.emit_mma(&l.cx, s, x, y, &acc[at..at + fr], site)?;
                    acc[at..at + fr].copy_from_slice(&d);
                }
            }
        }
    }
    if !ring {
        l.barrier()?;
    }
    Ok(Tile {
        elem: c.elem,
        layout: clay,
        regs: acc,
        uniform: false,
    })
}

//! `dot`: matrix units where the target has them, an FMA loop everywhere else.
//!
//! One strategy per file, chosen here ([`lower`]) from the operand types, the
//! shapes and the target, over one shared-memory module:
//!
//! | file | strategy | where |
//! |---|---|---|
//! | `fma.rs` | an FMA loop over `k` per accumulator element, bit-exact with the interpreter | every target and type |
//! | `mma.rs` | `mma.sync` fragments (`ldmatrix` reads) / MFMA fragments (vector reads) | sm_80+, gfx90a/gfx942, f16/bf16 (and the 8-bit types where the target has them) |
//! | `wgmma.rs` | warpgroup `wgmma.mma_async` with both operands read by descriptors | sm_90a |
//! | `smem.rs` | the operands' shared arrays: XOR swizzles ([`Swizzle`]), staging stores, the arrays a loop keeps or a ring fills | all three |
//!
//! This file holds what the strategies share: the choice of instruction and warp
//! grid ([`Plan`]), the accumulator layout each produces ([`mma_layout`], which the
//! [layout plan](super::plan) gives loop-carried accumulators), and the layouts in
//! which an operand's load is best made ([`operand_load_layout`]).
//!
//! **Matrix path** (f16/bf16 inputs, f32 accumulator, `M`, `N`, `K` multiples of the
//! instruction shape; `mma.sync` m16n8k16 on sm_80+; on gfx90a/gfx942 MFMA 32x32x8
//! where the tile is a multiple of 32x32, else 16x16x16, [`Arch::mma_for`](super::arch::Arch::mma_for)).
//! Warps tile `M` first, then `N`; each warp loops over its `reps_m × reps_n`
//! instruction tiles for every `k`-step. The accumulator layout ([`mma_layout`]) is
//! the instruction's C fragment repeated over tiles: register bits = fragment bits,
//! then `N` repeats, then `M` repeats; warp bits = `M` tiles, then `N` tiles (extra
//! warps replicate).

use inkwell::values::IntValue;

use tessera_ir::ir::{Function, Op, OpKind, Region, ScaledFormat};
use tessera_ir::{ScalarType, ValueId};

use crate::layout::Layout;
use crate::lower::arch::MmaInfo;
use crate::lower::{LResult, Lowerer, Tile};

mod fma;
mod mma;
mod smem;
pub(super) mod wgmma;

use fma::lower_fma;
use mma::{ldmatrix_shape, lower_mma};
use smem::{Arrays, elem_offset, frag_unit, stage};
#[cfg(test)]
pub(in crate::lower) use smem::{Swizzle, operand_swizzles, paired_reads};
pub(in crate::lower) use smem::{max_share, write_tile};

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
    /// A block-scaled `dot` ([`scales`]): which scale each lane holds
    /// ([`ScaledMma::scale_lane`](crate::lower::arch::ScaledMma::scale_lane)).
    scale_lane: Option<Vec<(u32, u32)>>,
}

/// The scales of a block-scaled `dot`: the lowering's own form of `dot_scaled` where
/// the target multiplies it as it is ([`with_native_scales`]), a `dot` with the
/// operands `a, b, acc, a_scale, b_scale`.
pub(super) fn scales(op: &Op) -> Option<(ValueId, ValueId)> {
    match op.operands[..] {
        [_, _, _, sa, sb] if op.kind == OpKind::Dot => Some((sa, sb)),
        _ => None,
    }
}

/// `f` with each `dot_scaled` on MXFP8 (E4M3 or E5M2 elements, E8M0 scales over
/// blocks of 32) as a block-scaled `dot` ([`scales`]), for a target with
/// [`Arch::scaled_mma_for`](crate::lower::arch::Arch::scaled_mma_for); `None` when
/// there is none. (The other formats, and a `dot` its instructions do not tile, are
/// left to `tessera_ir::passes::expand_dot_scaled`: the caller lowers that form
/// when this one fails.)
pub(super) fn with_native_scales(f: &Function) -> Option<Function> {
    fn region(f: &Function, r: &mut Region) -> bool {
        let mut any = false;
        for op in &mut r.ops {
            for sub in &mut op.regions {
                any |= region(f, sub);
            }
            let OpKind::DotScaled { format } = op.kind else {
                continue;
            };
            let [a, sa, b, sb, acc] = op.operands[..] else {
                continue;
            };
            let e8m0 = |v: ValueId| f.ty(v).scalar_type() == Some(ScalarType::U8);
            if matches!(format, ScaledFormat::E4M3 | ScaledFormat::E5M2) && e8m0(sa) && e8m0(sb) {
                op.kind = OpKind::Dot;
                op.operands = vec![a, b, acc, sa, sb];
                any = true;
            }
        }
        any
    }
    let mut g = f.clone();
    let mut body = std::mem::take(&mut g.body);
    let any = region(&g, &mut body);
    g.body = body;
    any.then_some(g)
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
    let (info, scale_lane) = match scales(op) {
        Some(_) => {
            let sc = l.arch.scaled_mma_for(s, m, n, k, l.nw)?;
            // The scales' layout repeats the instruction's over powers of two.
            if !(k / sc.info.k).is_power_of_two() {
                return None;
            }
            (sc.info, Some(sc.scale_lane))
        }
        None => (l.arch.mma_for(s, m, n, k, l.nw)?, None),
    };
    if m % info.m != 0 || n % info.n != 0 || k % info.k != 0 {
        return None;
    }
    let (tiles_m, tiles_n) = (m / info.m, n / info.n);
    // A chain of dots (one's result, elementwise, is the next one's A) puts every
    // warp along M, so the first's accumulators are the second's A fragments
    // ([`a_fragments_in_registers`]) and its row reductions stay inside warps.
    // (Not a block-scaled one: its fragments are in the instruction's own `k`.)
    let chain = scale_lane.is_none() && tiles_m >= l.nw && in_chain(l, op);
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
        scale_lane,
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

/// The layout in which the block-scaled `dot` `op` takes its operand `which` (3:
/// A's scales, 4: B's), if it is one on the matrix path ([`scale_layout_of`]): a
/// load of the scales made in it needs no conversion.
pub(super) fn scale_layout(l: &Lowerer<'_, '_>, op: &Op, which: usize) -> Option<Layout> {
    scales(op)?;
    let p = plan(l, op)?;
    let lanes = p.scale_lane.as_ref()?;
    let (a, b) = (l.f.ty(op.operands[0]), l.f.ty(op.operands[1]));
    let mnk = (a.shape[0], b.shape[1], a.shape[1]);
    Some(scale_layout_of(&p, lanes, which == 3, mnk, l.nw))
}

/// The layout that gives every lane of plan `p` exactly the scales its instructions
/// take (A's `m x k/32` when `a`, else B's `k/32 x n`): within an instruction
/// `lanes` ([`ScaledMma::scale_lane`](crate::lower::arch::ScaledMma::scale_lane)),
/// then registers over the k-steps, then over the warp's tiles, the warps as the
/// accumulator's (the other operand's warps replicate). Register `ks + steps * r`
/// holds the scale of k-step `ks` of the warp's tile `r`.
fn scale_layout_of(
    p: &Plan,
    lanes: &[(u32, u32)],
    a: bool,
    (m, n, k): (u32, u32, u32),
    nw: u32,
) -> Layout {
    let i = &p.info;
    let (steps, block) = (k / i.k, i.k / 32);
    let bits = |x: u32| 0..x.trailing_zeros();
    // (along M or N, along the blocks) as A's (row, block) or B's (block, column).
    let at = |mn: u32, blk: u32| if a { vec![mn, blk] } else { vec![blk, mn] };
    let (tile, warps, reps) = if a {
        (i.m, p.warps_m, p.reps_m)
    } else {
        (i.n, p.warps_n, p.reps_n)
    };
    let mut reg: Vec<Vec<u32>> = bits(steps).map(|j| at(0, block << j)).collect();
    reg.extend(bits(reps).map(|j| at((tile * warps) << j, 0)));
    let lane: Vec<Vec<u32>> = lanes.iter().map(|&(mn, blk)| at(mn, blk)).collect();
    // Warp bits: M's first, then N's, as `c_layout`'s.
    let mine = |j: u32| at(tile << j, 0);
    let mut warp: Vec<Vec<u32>> = Vec::new();
    warp.extend(bits(p.warps_m).map(|j| if a { mine(j) } else { at(0, 0) }));
    warp.extend(bits(p.warps_n).map(|j| if a { at(0, 0) } else { mine(j) }));
    warp.resize((nw.trailing_zeros() as usize).max(warp.len()), at(0, 0));
    let shape = if a { [m, k / 32] } else { [k / 32, n] };
    Layout::from_coords(&shape, &reg, &lane, &warp)
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
        None if scales(op).is_some() => Err(super::LowerError::Unsupported {
            span: op.span.clone(),
            message: "`dot_scaled`: no block-scaled instruction tiles this shape".into(),
        }),
        None => lower_fma(l, op),
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

/// Whether `dot` `op` reads its operands as fragments (`mma.sync`, MFMA, WMMA), not
/// by `wgmma` descriptors.
pub(in crate::lower) fn on_fragments(l: &Lowerer<'_, '_>, op: &Op) -> bool {
    wgmma::plan(l, op).is_none() && plan(l, op).is_some()
}

/// The bytes of shared memory in which `dot` stages its operands on the matrix path
/// (`None`: the FMA path).
pub(in crate::lower) fn matrix_staging_bytes(l: &Lowerer<'_, '_>, op: &Op) -> Option<u32> {
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
pub(in crate::lower) fn array_row_dim(l: &Lowerer<'_, '_>, op: &Op, which: usize) -> usize {
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
pub(in crate::lower) fn stage_operand<'ctx>(
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
        return Err(crate::lower::LowerError::Llvm(
            "staging an FMA-path dot".into(),
        ));
    };
    stage(l, &Arrays::new(l, op, &p), which, t, base)
}

/// [`elem_offset`] for the matrix-path `dot` `op` (an asynchronous copy's target).
pub(in crate::lower) fn operand_offset<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: &Op,
    which: usize,
    e: IntValue<'ctx>,
) -> LResult<IntValue<'ctx>> {
    if let Some(p) = wgmma::plan(l, op) {
        return wgmma::elem_offset(l, &p, &wgmma::Arrays::new(&p), which, e);
    }
    let Some(p) = plan(l, op) else {
        return Err(crate::lower::LowerError::Llvm(
            "an FMA-path dot has no arrays".into(),
        ));
    };
    elem_offset(l, &Arrays::new(l, op, &p), which, e)
}

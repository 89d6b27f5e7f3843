//! Layout conversions: by warp shuffles where the data stays in a warp, else through
//! XOR-swizzled shared memory.
//!
//! **Shuffles** are the cheaper path between a register renaming and a round trip
//! through shared memory.
//! A conversion between two bit layouts with the same warp bases, no replication, and
//! the same element bits held by each warp moves data only between a warp's lanes.
//! Where the target's lane bits are the source's lane and register bits exchanged in
//! pairs (register bit `i` of one holds the element bit lane bit `j` of the other
//! does), each exchange is a 2x2 transpose between lane pairs: per pair of registers,
//! one `shuffle_xor(1 << j)` and three selects; a lane bit that only moves to another
//! lane position takes two exchanges through a register bit. What is left is a
//! register renaming. Other conversions (warps exchanging data, replication) go
//! through shared memory.

use tessera_ir::Elem;

use std::collections::HashMap;

use inkwell::values::IntValue;
use tessera_ir::Span;

use super::{LResult, Lowerer, Tile, is_dup_reg, type_bytes};
use crate::layout::Layout;

/// The XOR swizzle of a conversion's scratch array: index bits `s .. s + w` are XORed
/// into bits `v .. v + w` (`s >= v + w`, so the map is a bijection), chosen so that
/// the warp's stores (in the source layout) and loads (in the target layout) spread
/// over the 32 banks; `None` when the plain row-major array is as good.
///
/// **Shared memory**: a conversion that is not a renaming or shuffles stores each
/// register at its element's place and loads the target's registers back; without a
/// swizzle a transpose's stores hit one bank per column (4-way on a 16x32 f32 tile).
/// The search tries every such slice and keeps the one with the fewest passes of the
/// worse of the two accesses (then of their sum), the bank counted the way the
/// hardware does (32 banks of 4 bytes, one pass per distinct word on a bank).
pub(crate) fn conversion_swizzle(
    from: &Layout,
    to: &Layout,
    elem_bytes: u32,
    ws: u32,
) -> Option<(u32, u32, u32)> {
    let n = from.numel().trailing_zeros();
    let cost = |sw: Option<(u32, u32, u32)>| {
        let mut worst = [1u32; 2];
        for (k, lay) in [from, to].into_iter().enumerate() {
            for r in 0..lay.num_regs() as u32 {
                let words = (0..ws.min(32)).map(|lane| {
                    let word = swizzled(lay.elem_index(r, lane, 0), sw) * elem_bytes / 4;
                    (word % 32, word)
                });
                worst[k] = worst[k].max(super::dot::max_share(words));
            }
        }
        (worst[0].max(worst[1]), worst[0] + worst[1])
    };
    let mut best = (None, cost(None));
    for s in 1..n {
        for v in 0..s {
            for w in 1..=(s - v).min(n - s).min(5) {
                let c = cost(Some((s, v, w)));
                if c < best.1 {
                    best = (Some((s, v, w)), c);
                }
            }
        }
    }
    best.0
}

/// `idx` with `sw`'s bits XORed in (see [`conversion_swizzle`]).
pub(crate) fn swizzled(idx: u32, sw: Option<(u32, u32, u32)>) -> u32 {
    match sw {
        Some((s, v, w)) => idx ^ (((idx >> s) & ((1 << w) - 1)) << v),
        None => idx,
    }
}

impl<'ctx> Lowerer<'_, 'ctx> {
    /// `t` in layout `to` by warp shuffles (see the module docs), if this conversion
    /// is one of that kind.
    pub(super) fn convert_by_shuffles(
        &self,
        t: &Tile<'ctx>,
        to: &Layout,
    ) -> LResult<Option<Tile<'ctx>>> {
        let from = &t.layout;
        let scalar = matches!(t.elem, Elem::Scalar(_));
        let no_zero = |v: &[u32]| v.iter().all(|&b| b != 0);
        if t.uniform
            || !scalar
            || from.shape != to.shape
            || from.warp != to.warp
            || from.reg.len() != to.reg.len()
            || from.lane.len() != to.lane.len()
            || !from.is_bit_layout()
            || !to.is_bit_layout()
            || !(no_zero(&from.reg) && no_zero(&from.lane) && no_zero(&to.reg) && no_zero(&to.lane))
        {
            return Ok(None);
        }
        let held = |l: &Layout| {
            let mut v: Vec<u32> = l.reg.iter().chain(&l.lane).copied().collect();
            v.sort_unstable();
            v
        };
        if held(from) != held(to) {
            return Ok(None);
        }
        // Plan the exchanges first: emit nothing unless the whole conversion is one.
        let mut cur = from.clone();
        let mut swaps = Vec::new();
        for j in 0..to.lane.len() {
            let want = to.lane[j];
            if cur.lane[j] == want {
                continue;
            }
            let mut swap = |cur: &mut Layout, i: usize, j: usize| {
                swaps.push((i, j));
                std::mem::swap(&mut cur.reg[i], &mut cur.lane[j]);
            };
            if let Some(i) = cur.reg.iter().position(|&x| x == want) {
                swap(&mut cur, i, j);
            } else if let Some(k) = cur.lane.iter().position(|&x| x == want)
                && !cur.reg.is_empty()
            {
                // A lane bit in another lane position: through register bit 0.
                swap(&mut cur, 0, k);
                swap(&mut cur, 0, j);
            } else {
                return Ok(None);
            }
        }
        let mut regs = t.regs.clone();
        for &(i, j) in &swaps {
            regs = self.exchange_reg_lane_bit(&regs, i, j)?;
        }
        let done = Tile {
            elem: t.elem,
            layout: cur,
            regs,
            uniform: false,
        };
        Ok(self.convert_cheap(&done, to))
    }

    /// Exchanges register bit `i` with lane bit `j`: afterwards register bit `i`
    /// selects what lane bit `j` did and the reverse. With `lb` this lane's bit `j`,
    /// register `r` (bit `i` clear) and `r1 = r | 1 << i`: lane `lb = 0` keeps `r` and
    /// takes its partner's `r` as `r1`; lane `lb = 1` keeps `r1` and takes its
    /// partner's `r1` as `r`. Each lane sends the register its partner takes.
    fn exchange_reg_lane_bit(
        &self,
        regs: &[inkwell::values::BasicValueEnum<'ctx>],
        i: usize,
        j: usize,
    ) -> LResult<Vec<inkwell::values::BasicValueEnum<'ctx>>> {
        let b = &self.cx.b;
        let bit = b.build_and(
            b.build_right_shift(self.lane, self.cx.i32(j as i64), false, "")?,
            self.cx.i32(1),
            "",
        )?;
        let lb = b.build_int_compare(inkwell::IntPredicate::NE, bit, self.cx.i32(0), "")?;
        let mut out = regs.to_vec();
        for r in 0..regs.len() {
            if r >> i & 1 == 1 {
                continue;
            }
            let r1 = r | 1 << i;
            let send = b.build_select(lb, regs[r], regs[r1], "")?;
            let recv = super::reduce::shuffle(self, send, 1 << j)?;
            out[r] = b.build_select(lb, recv, regs[r], "")?;
            out[r1] = b.build_select(lb, regs[r1], recv, "")?;
        }
        Ok(out)
    }
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// `t` in layout `to` without moving data between threads (the same layout, a
    /// uniform value, or a register renaming where every thread already holds what
    /// it needs), if possible.
    pub fn convert_cheap(&self, t: &Tile<'ctx>, to: &Layout) -> Option<Tile<'ctx>> {
        if t.layout == *to {
            return Some(t.clone());
        }
        if t.uniform {
            return Some(self.uniform_tile(t.elem, to.clone(), t.regs[0]));
        }
        if t.layout.lane == to.lane && t.layout.warp == to.warp {
            let mut by_off = HashMap::new();
            for r in 0..t.layout.num_regs() as u32 {
                by_off.entry(t.layout.reg_offset(r)).or_insert(r);
            }
            let regs: Option<Vec<_>> = (0..to.num_regs() as u32)
                .map(|r| by_off.get(&to.reg_offset(r)).map(|&s| t.regs[s as usize]))
                .collect();
            if let Some(regs) = regs {
                return Some(Tile {
                    elem: t.elem,
                    layout: to.clone(),
                    regs,
                    uniform: false,
                });
            }
        }
        None
    }

    /// `t` in layout `to` (same shape); through shared memory unless
    /// [`Self::convert_cheap`] applies. Prefer [`Self::relayout`] where the value's id
    /// is known: it recomputes cheap values instead.
    pub fn convert(&mut self, t: &Tile<'ctx>, to: &Layout, span: &Span) -> LResult<Tile<'ctx>> {
        if let Some(r) = self.convert_cheap(t, to) {
            if r.layout != t.layout && !t.uniform {
                self.note(|| format!("convert by register renaming: {} -> {}", t.layout, to));
            }
            return Ok(r);
        }
        if let Some(r) = self.convert_by_shuffles(t, to)? {
            self.note(|| format!("convert by warp shuffles: {} -> {}", t.layout, to));
            return Ok(r);
        }
        let mt = self.mem_ty(t.elem);
        let size = type_bytes(t.elem);
        let sw = conversion_swizzle(&t.layout, to, size, self.ws);
        self.note(|| {
            format!(
                "convert through shared memory (swizzle {sw:?}): {} -> {}",
                t.layout, to
            )
        });
        let base = self.scratch(t.layout.numel() * size, span);
        let place = |idx: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
            let Some((s, v, w)) = sw else {
                return Ok(idx);
            };
            let b = &self.cx.b;
            let hi = b.build_and(
                b.build_right_shift(idx, self.cx.i32(s as i64), false, "")?,
                self.cx.i32((1 << w) - 1),
                "",
            )?;
            let x = b.build_left_shift(hi, self.cx.i32(v as i64), "")?;
            Ok(b.build_xor(idx, x, "")?)
        };
        let src_idx = self.elem_indices(&t.layout)?;
        for (r, idx) in src_idx.iter().enumerate() {
            if is_dup_reg(&t.layout, r) {
                continue;
            }
            let p = self.smem_ptr(base, mt, place(*idx)?)?;
            let v = self.store_to_mem(t.elem, t.regs[r])?;
            self.smem_store(p, v)?;
        }
        self.barrier()?;
        let dst_idx = self.elem_indices(to)?;
        let mut regs = Vec::with_capacity(dst_idx.len());
        for idx in dst_idx {
            let p = self.smem_ptr(base, mt, place(idx)?)?;
            let v = self.smem_load(mt, p)?;
            regs.push(self.reg_from_mem(t.elem, v)?);
        }
        self.barrier()?;
        Ok(Tile {
            elem: t.elem,
            layout: to.clone(),
            regs,
            uniform: false,
        })
    }
}

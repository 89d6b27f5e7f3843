//! Layout conversions inside a warp by shuffles: the cheaper path between a register
//! renaming and a round trip through shared memory.
//!
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

use super::{LResult, Lowerer, Tile};
use crate::layout::Layout;

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

//! Tensor-descriptor accesses on TMA (sm_90a): loads as copies into a `wgmma` dot's
//! ring, stores through a staging box ([`lower_desc_store`]).
//!
//! A `desc_load` that [`tma_candidate`] keeps (the target has `wgmma`, the launch
//! built the descriptor's tensor map, its blocks have a [`TmaBox`], and it feeds only
//! `dot` operands) is pipelined like a `load` ([`crate::pipeline`]); the ring of its
//! `dot` ([`super::Lowerer`]'s `plan_staging`) then takes it when [`ring_ok`] holds.
//! Each ring slot has an mbarrier (initialized with one arrival per TMA operand,
//! before the prologue, by thread 0):
//!
//! - a copy into slot `s` is thread 0's `mbarrier.arrive.expect_tx` of the block's
//!   bytes on `bar[s]`, then one `cp.async.bulk.tensor` per box (the boxes of a block
//!   side by side along its columns, [`TmaBox::copies`]), skipped entirely when the
//!   pipeliner's predicate is false (iterations past the end);
//! - iteration `i` reads slot `i % slots` after waiting for phase parity
//!   `(i / slots) % 2` of its mbarrier, then the block barrier that was already there
//!   (every thread is done with the slot the iteration refills).
//!
//! The box lands in exactly the layout of the `wgmma` operand arrays
//! (`super::wgmma::Array`: column blocks of `S` bytes, rows of a block consecutive,
//! the hardware's `S`-byte swizzle), so the matrix instructions read it as they read
//! staged operands. A kept load that no ring takes makes the lowering fail, and
//! `lower_staged` lowers the kernel again with every descriptor access expanded.

use inkwell::values::{IntValue, PointerValue};
use tessera_ir::ir::{DescOperands, Function, Op, OpKind};
use tessera_ir::tensor_desc::TmaBox;
use tessera_ir::{Elem, Type};

use super::{AsyncSlot, LResult, LowerError, Lowerer, Tile, wgmma};
use crate::Target;

/// Bytes of one mbarrier.
pub(super) const MBAR_BYTES: u32 = 8;

/// Whether `desc_load` `op` of `f` may stay a TMA load on `target` (see the module
/// docs): the ring decides later.
pub(crate) fn tma_candidate(target: Target, f: &Function, op: &Op) -> bool {
    if !target.has_wgmma() {
        return false;
    }
    let tmap = op.operands[DescOperands::TMAP];
    if !f
        .params
        .iter()
        .any(|p| p.value == tmap && p.attrs.tensor_map)
    {
        return false;
    }
    if let OpKind::DescStore { rank } = op.kind {
        // Every TMA store: through a swizzled staging box in shared memory.
        let Ok(d) = DescOperands::new(rank) else {
            return false;
        };
        return block_box(f.ty(op.operands[d.extra()])).is_some();
    }
    let OpKind::DescLoad {
        rank: 2,
        has_pred: false,
    } = op.kind
    else {
        return false;
    };
    let t = f.ty(op.results[0]);
    let Some(s) = t.scalar_type() else {
        return false;
    };
    if TmaBox::for_block(s.size_bytes() as u32, &t.shape).is_none() {
        return false;
    }
    let v = op.results[0];
    let mut uses = 0;
    let mut ok = true;
    f.walk(&mut |o| {
        for (i, &x) in o.operands.iter().enumerate() {
            if x == v {
                uses += 1;
                ok &= o.kind == OpKind::Dot && i < 2;
            }
        }
    });
    ok && uses > 0
}

/// Whether TMA load `ld` can fill operand `which` of `dot` `d`'s ring: `d` takes
/// `wgmma`, the operand is stored as the block is (A `[m][k]`, B `[k][n]`), and every
/// box starts on a 1024-byte boundary of the arrays.
pub(super) fn ring_ok(l: &Lowerer<'_, '_>, ld: &Op, d: &Op, which: usize) -> bool {
    if !matches!(ld.kind, OpKind::DescLoad { rank: 2, .. }) {
        return false;
    }
    let Some(p) = wgmma::plan(l, d) else {
        return false;
    };
    if which == 1 && p.b_k_major {
        return false;
    }
    let t = l.f.ty(ld.results[0]);
    let Some(bx) = block_box(t) else {
        return false;
    };
    let arr = wgmma::Arrays::new(&p);
    let rows = t.shape[0];
    // The arrays' column blocks are the boxes.
    let a = if which == 0 { arr.a } else { arr.b };
    let e = p.elem_bytes;
    a.block * e == bx.swizzle_bytes
        && (rows * bx.swizzle_bytes).is_multiple_of(wgmma::ARRAY_ALIGN)
        && (arr.a_elems * e).is_multiple_of(wgmma::ARRAY_ALIGN)
}

fn block_box(t: &Type) -> Option<TmaBox> {
    TmaBox::for_block(t.scalar_type()?.size_bytes() as u32, &t.shape)
}

impl<'ctx> Lowerer<'_, 'ctx> {
    /// The mbarrier of `d`'s ring slot `slot` (`None`: the slot read this iteration).
    pub(super) fn ring_bar(&self, d: &Op, slot: Option<AsyncSlot>) -> LResult<PointerValue<'ctx>> {
        let a = self
            .async_dot(d)
            .ok_or_else(|| LowerError::Llvm("no ring for this dot".into()))?;
        if let Some(AsyncSlot::Fixed(s)) = slot {
            return Ok(self.smem_at(a.bars + s * MBAR_BYTES));
        }
        let slots = self.async_slots.borrow();
        let (rd, wr) = slots
            .get(&(d as *const Op))
            .copied()
            .ok_or_else(|| LowerError::Llvm("a ring slot outside its loop".into()))?;
        let off = if slot.is_some() { wr } else { rd };
        self.bar_at(&a, off)
    }

    /// The mbarrier of the slot at byte offset `off` of ring `a`.
    pub(super) fn bar_at(
        &self,
        a: &super::AsyncDot,
        off: IntValue<'ctx>,
    ) -> LResult<PointerValue<'ctx>> {
        let b = &self.cx.b;
        let idx = b.build_int_unsigned_div(off, self.cx.i32(a.slot_bytes as i64), "")?;
        let byte = b.build_int_mul(idx, self.cx.i32(MBAR_BYTES as i64), "")?;
        let base = self.smem_at(a.bars);
        // SAFETY: a byte offset inside the ring's mbarriers, which `finish_shared` sizes.
        Ok(unsafe { b.build_in_bounds_gep(self.cx.ctx.i8_type(), base, &[byte], "")? })
    }
}

/// Lowers `desc_load` `op`: TMA copies into its ring slot (see the module docs). The
/// value lives in the ring, so the tile has no registers.
pub(super) fn lower_desc_load<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let Some(&(d, which, slot)) = l.async_loads.get(&op.results[0]) else {
        return Err(LowerError::Unsupported {
            span: op.span.clone(),
            message: "a tensor-descriptor load kept for TMA outside a pipelined dot loop".into(),
        });
    };
    let OpKind::DescLoad { rank, has_pred } = op.kind else {
        unreachable!("a desc_load")
    };
    let dops = DescOperands::new(rank).map_err(LowerError::Llvm)?;
    let t = l.f.ty(op.results[0]).clone();
    let elem = t
        .scalar_type()
        .ok_or_else(|| LowerError::Llvm("desc_load of pointers".into()))?;
    let e = elem.size_bytes() as u32;
    let bx = block_box(&t).ok_or_else(|| LowerError::Llvm("a block TMA cannot copy".into()))?;
    let ring = l
        .async_dot(d)
        .ok_or_else(|| LowerError::Llvm("no ring for this dot".into()))?;
    if matches!(slot, AsyncSlot::Fixed(0)) && l.tma_inited.borrow_mut().insert(d as *const Op) {
        // Before the ring's first copy: every thread is done with the mbarriers of an
        // earlier run of the loop; thread 0 initializes them.
        l.barrier()?;
        let site = l.new_site("mbarrier.init");
        l.in_thread0(|l| {
            for s in 0..ring.slots {
                let bar = l.smem_at(ring.bars + s * MBAR_BYTES);
                l.arch.mbarrier_init(&l.cx, bar, ring.tma, site)?;
            }
            l.arch.fence_mbarrier_init(&l.cx)
        })?;
        l.barrier()?;
    }
    let base = l.async_base(d, Some(slot))?;
    let arr_off = if which == 0 {
        0
    } else {
        let p =
            wgmma::plan(l, d).ok_or_else(|| LowerError::Llvm("a TMA ring without wgmma".into()))?;
        wgmma::Arrays::new(&p).a_elems * e
    };
    let bar = l.ring_bar(d, Some(slot))?;
    let tmap = l.val(op.operands[DescOperands::TMAP])?.regs[0].into_int_value();
    let coords: Vec<IntValue<'ctx>> = (0..dops.rank)
        .map(|i| Ok(l.val(op.operands[dops.coord(i)])?.regs[0].into_int_value()))
        .collect::<LResult<_>>()?;
    let pred = if has_pred {
        Some(l.val(op.operands[dops.extra()])?.regs[0].into_int_value())
    } else {
        None
    };
    let box_bytes = bx.box_bytes(e);
    let inner = bx.box_dims[bx.box_dims.len() - 1];
    let site = l.new_site("cp.async.bulk.tensor");
    l.in_thread0(|l| {
        let issue = |l: &mut Lowerer<'_, 'ctx>| -> LResult<()> {
            l.arch
                .mbarrier_arrive_expect_tx(&l.cx, bar, box_bytes * bx.copies, site)?;
            for c in 0..bx.copies {
                let off = l.cx.i32((arr_off + c * box_bytes) as i64);
                // SAFETY: inside the ring slot (`ring_ok`: the arrays hold the boxes).
                let dst = unsafe {
                    l.cx.b
                        .build_in_bounds_gep(l.cx.ctx.i8_type(), base, &[off], "")?
                };
                // Innermost first; box `c` starts `c * inner` columns on.
                let mut cs: Vec<IntValue<'ctx>> = coords.iter().rev().copied().collect();
                if c > 0 {
                    cs[0] =
                        l.cx.b
                            .build_int_add(cs[0], l.cx.i32((c * inner) as i64), "")?;
                }
                l.arch.tma_load(&l.cx, dst, tmap, &cs, bar, site)?;
            }
            Ok(())
        };
        match pred {
            Some(p) => l.when(p, issue),
            None => issue(l),
        }
    })?;
    l.async_issued(d, slot)?;
    l.note(|| {
        format!(
            "TMA: {} box(es) of {:?} ({}-byte swizzle) of operand {} into the dot's ring ({}), completing on the slot's mbarrier",
            bx.copies,
            bx.box_dims,
            bx.swizzle_bytes,
            ["A", "B"][which],
            match slot {
                AsyncSlot::Fixed(s) => format!("slot {s}"),
                AsyncSlot::Next => "the slot being filled".to_string(),
            }
        )
    });
    Ok(Tile {
        elem: Elem::Scalar(elem),
        layout: crate::layout::Layout::blocked(&t.shape, 1, l.ws, l.nw),
        regs: Vec::new(),
        uniform: false,
    })
}

/// Lowers `desc_store` `op` as TMA stores: every thread writes its elements into a
/// staging box in shared memory laid out as the tensor map's boxes are (rows of `S`
/// bytes, the boxes side by side along the columns, the `S`-byte swizzle, 1024-byte
/// aligned), then `fence.proxy.async` and a block barrier; thread 0 issues one
/// `cp.async.bulk.tensor` store per box and waits until they have read the staging
/// memory; a barrier before and after keeps other uses of the scratch apart.
pub(super) fn lower_desc_store<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<()> {
    let OpKind::DescStore { rank } = op.kind else {
        unreachable!("a desc_store")
    };
    let d = DescOperands::new(rank).map_err(LowerError::Llvm)?;
    let vt = l.f.ty(op.operands[d.extra()]).clone();
    let bx = block_box(&vt).ok_or_else(|| LowerError::Llvm("a block TMA cannot copy".into()))?;
    let elem = vt
        .scalar_type()
        .ok_or_else(|| LowerError::Llvm("desc_store of pointers".into()))?;
    let e = elem.size_bytes() as u32;
    let box_bytes = bx.box_bytes(e);
    if bx.copies > 1 && !box_bytes.is_multiple_of(wgmma::ARRAY_ALIGN) {
        // Each box on a 1024-byte boundary, where the swizzle pattern starts.
        return Err(LowerError::Unsupported {
            span: op.span.clone(),
            message: "TMA store boxes that are not whole 1024-byte swizzle periods".into(),
        });
    }
    let v = l.val(op.operands[d.extra()])?;
    let tmap = l.val(op.operands[DescOperands::TMAP])?.regs[0].into_int_value();
    let coords: Vec<IntValue<'ctx>> = (0..d.rank)
        .map(|i| Ok(l.val(op.operands[d.coord(i)])?.regs[0].into_int_value()))
        .collect::<LResult<_>>()?;
    let total = box_bytes * bx.copies;
    // The scratch starts after the rings, on a 1024-byte boundary on wgmma targets.
    let base = l.scratch(total, &op.span);
    l.barrier()?;
    let cols = *vt.shape.last().expect("rank >= 1");
    let w = bx.swizzle_bytes / e; // elements of one box row
    let mask = match bx.swizzle_bytes {
        128 => 7,
        64 => 3,
        _ => 1,
    };
    let runs: Vec<u32> = (0..(16 / e).min(w).trailing_zeros())
        .map(|i| 1 << i)
        .collect();
    super::dot::write_tile(l, &v, base, &runs, |ix| {
        let b = &l.cx.b;
        let c = |x: u32| l.cx.i32(x as i64);
        let inner = b.build_and(ix, c(cols - 1), "")?;
        let row = b.build_right_shift(ix, c(cols.trailing_zeros()), false, "")?;
        let bxi = b.build_right_shift(inner, c(w.trailing_zeros()), false, "")?;
        let within = b.build_and(inner, c(w - 1), "")?;
        let byte = b.build_int_add(
            b.build_int_add(
                b.build_int_mul(bxi, c(box_bytes), "")?,
                b.build_int_mul(row, c(bx.swizzle_bytes), "")?,
                "",
            )?,
            b.build_int_mul(within, c(e), "")?,
            "",
        )?;
        let hi = b.build_and(b.build_right_shift(byte, c(7), false, "")?, c(mask), "")?;
        let swz = b.build_xor(byte, b.build_left_shift(hi, c(4), "")?, "")?;
        Ok(b.build_right_shift(swz, c(e.trailing_zeros()), false, "")?)
    })?;
    l.arch.fence_async_shared(&l.cx)?;
    l.barrier()?;
    let inner_w = bx.box_dims[bx.box_dims.len() - 1];
    let site = l.new_site("cp.async.bulk.tensor");
    l.in_thread0(|l| {
        for cpy in 0..bx.copies {
            let off = l.cx.i32((cpy * box_bytes) as i64);
            // SAFETY: inside the staging box (`total` bytes of scratch).
            let src = unsafe {
                l.cx.b
                    .build_in_bounds_gep(l.cx.ctx.i8_type(), base, &[off], "")?
            };
            let mut cs: Vec<IntValue<'ctx>> = coords.iter().rev().copied().collect();
            if cpy > 0 {
                cs[0] =
                    l.cx.b
                        .build_int_add(cs[0], l.cx.i32((cpy * inner_w) as i64), "")?;
            }
            l.arch.tma_store(&l.cx, src, tmap, &cs, site)?;
        }
        l.arch.tma_store_wait(&l.cx, site)
    })?;
    l.barrier()?;
    l.note(|| {
        format!(
            "TMA store: {} box(es) of {:?} ({}-byte swizzle) staged in shared memory",
            bx.copies, bx.box_dims, bx.swizzle_bytes
        )
    });
    Ok(())
}

//! Tensor-descriptor accesses on TMA (sm_90a): loads as copies into a `wgmma` dot's
//! ring or, when they feed no `dot`, into a staging box read into registers
//! ([`lower_standalone_load`]); stores through a staging box ([`lower_desc_store`]).
//!
//! A `desc_load` that [`tma_candidate`] keeps (the target has `wgmma`, the launch
//! built the descriptor's tensor map, its blocks have a [`TmaBox`], and it feeds only
//! `dot` operands) is pipelined like a `load` ([`crate::pipeline`]); the ring of its
//! `dot` (the plan's `staging.rs`) then takes it when [`ring_ok`] holds.
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

use super::dot::wgmma;
use super::{AsyncSlot, LResult, LowerError, Lowerer, SpecRole, Tile};
use crate::Target;

/// Bytes of one mbarrier.
pub(super) const MBAR_BYTES: u32 = 8;

/// Whether `desc_load` or `desc_store` `op` of `f` may stay a TMA access on `target`
/// (see the module docs) when the kernel is lowered with `stages` pipeline stages: a
/// load feeding only `dot` operands when pipelining (the ring decides later), a load
/// feeding no `dot` always ([`lower_desc_load`] stages it itself), stores when
/// pipelining.
pub(crate) fn tma_candidate(target: Target, f: &Function, op: &Op, stages: u32) -> bool {
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
        return stages >= 2 && block_box(f.ty(op.operands[d.extra()])).is_some();
    }
    let OpKind::DescLoad {
        rank,
        has_pred: false,
    } = op.kind
    else {
        return false;
    };
    if block_box(f.ty(op.results[0])).is_none() {
        return false;
    }
    let (uses, dot_operand) = uses_of(f, op.results[0]);
    if dot_operand == 0 {
        return uses > 0;
    }
    rank == 2 && stages >= 2 && dot_operand == uses
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

/// The uses of `v` in `f`, and how many of them are `dot` operands A or B.
fn uses_of(f: &Function, v: tessera_ir::ValueId) -> (u32, u32) {
    let (mut uses, mut dot_operand) = (0, 0);
    f.walk(&mut |o| {
        for (i, &x) in o.operands.iter().enumerate() {
            if x == v {
                uses += 1;
                if o.kind == OpKind::Dot && i < 2 {
                    dot_operand += 1;
                }
            }
        }
    });
    (uses, dot_operand)
}

fn block_box(t: &Type) -> Option<TmaBox> {
    TmaBox::for_block(t.scalar_type()?.size_bytes() as u32, &t.shape)
}

/// What every TMA access of a block needs, read from its op: the block's type, its
/// element type and bytes, its boxes, the tensor map and the block's coordinates
/// (outermost first).
struct Block<'ctx> {
    ty: Type,
    elem: tessera_ir::ScalarType,
    e: u32,
    bx: TmaBox,
    box_bytes: u32,
    tmap: IntValue<'ctx>,
    coords: Vec<IntValue<'ctx>>,
}

impl<'ctx> Block<'ctx> {
    /// The block of `desc_load`/`desc_store` `op` with operands `d`, of type `ty`.
    fn of(l: &Lowerer<'_, 'ctx>, op: &Op, d: &DescOperands, ty: &Type) -> LResult<Block<'ctx>> {
        let elem = ty
            .scalar_type()
            .ok_or_else(|| LowerError::Llvm("a tensor-descriptor block of pointers".into()))?;
        let e = elem.size_bytes() as u32;
        let bx = block_box(ty).ok_or_else(|| LowerError::Llvm("a block TMA cannot copy".into()))?;
        let coords = (0..d.rank)
            .map(|i| Ok(l.val(op.operands[d.coord(i)])?.regs[0].into_int_value()))
            .collect::<LResult<_>>()?;
        Ok(Block {
            ty: ty.clone(),
            elem,
            e,
            box_bytes: bx.box_bytes(e),
            bx,
            tmap: l.val(op.operands[DescOperands::TMAP])?.regs[0].into_int_value(),
            coords,
        })
    }

    /// Every box of a staging box on a 1024-byte boundary, where the swizzle pattern
    /// starts (an error at `op` otherwise).
    fn whole_periods(&self, op: &Op, what: &str) -> LResult<()> {
        if self.bx.copies > 1 && !self.box_bytes.is_multiple_of(wgmma::ARRAY_ALIGN) {
            return Err(LowerError::Unsupported {
                span: op.span.clone(),
                message: format!("TMA {what} boxes that are not whole 1024-byte swizzle periods"),
            });
        }
        Ok(())
    }

    /// Bytes of the whole block.
    fn bytes(&self) -> u32 {
        self.box_bytes * self.bx.copies
    }
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
        self.slot_bar(a, a.bars, off)
    }

    /// The mbarrier of the slot at byte offset `off` of ring `a` among the mbarriers
    /// (one per slot) starting at shared byte `bars`: the ring's own (full), or a
    /// warp-specialized ring's empty ones.
    pub(super) fn slot_bar(
        &self,
        a: &super::AsyncDot,
        bars: u32,
        off: IntValue<'ctx>,
    ) -> LResult<PointerValue<'ctx>> {
        let b = &self.cx.b;
        let idx = b.build_int_unsigned_div(off, self.cx.i32(a.slot_bytes as i64), "")?;
        let byte = b.build_int_mul(idx, self.cx.i32(MBAR_BYTES as i64), "")?;
        let base = self.smem_at(bars);
        // SAFETY: a byte offset inside the slots' mbarriers (`slots` of them from
        // `bars`), which the plan sized.
        Ok(unsafe { b.build_in_bounds_gep(self.cx.ctx.i8_type(), base, &[byte], "")? })
    }
}

/// Lowers `desc_load` `op`: TMA copies into its ring slot (see the module docs), the
/// value then living in the ring (the tile has no registers); or, for a load that
/// feeds no `dot`, into a staging box read into registers ([`lower_standalone_load`]).
pub(super) fn lower_desc_load<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let Some(&(d, which, slot)) = l.plan.async_loads.get(&op.results[0]) else {
        if uses_of(l.f, op.results[0]).1 == 0 {
            return lower_standalone_load(l, op);
        }
        return Err(LowerError::Unsupported {
            span: op.span.clone(),
            message: "a tensor-descriptor load kept for TMA outside a pipelined dot loop".into(),
        });
    };
    let OpKind::DescLoad { rank, has_pred } = op.kind else {
        unreachable!("a desc_load")
    };
    let dops = DescOperands::new(rank).map_err(LowerError::Llvm)?;
    let blk = Block::of(l, op, &dops, l.f.ty(op.results[0]))?;
    let ring = l
        .async_dot(d)
        .ok_or_else(|| LowerError::Llvm("no ring for this dot".into()))?;
    // A warp-specialized ring's empty mbarriers, and how it multicasts.
    let spec = l.plan.warp_spec.as_ref().filter(|w| std::ptr::eq(w.dot, d));
    let empty = spec.map(|w| w.empty);
    let multicast = spec.map(|w| w.multicast[which]).filter(|&a| a != 0);
    if spec.is_some_and(|w| w.outer.is_some()) && matches!(slot, AsyncSlot::Fixed(_)) {
        // A persistent kernel's producer issues every fill in its loop.
        l.note(|| {
            "persistent, warp-specialized: not lowered (the producer's loop issues this fill with the others)".to_string()
        });
        return Ok(Tile {
            elem: Elem::Scalar(blk.elem),
            layout: crate::layout::Layout::blocked(&blk.ty.shape, 1, l.ws, l.nw),
            regs: Vec::new(),
            uniform: false,
        });
    }
    if matches!(slot, AsyncSlot::Fixed(0)) && l.tma_inited.borrow_mut().insert(d as *const Op) {
        l.init_ring_bars(&ring)?;
    }
    let base = l.async_base(d, Some(slot))?;
    let arr_off = if which == 0 {
        0
    } else {
        let p =
            wgmma::plan(l, d).ok_or_else(|| LowerError::Llvm("a TMA ring without wgmma".into()))?;
        wgmma::Arrays::new(&p).a_elems * blk.e
    };
    let bar = l.ring_bar(d, Some(slot))?;
    let pred = if has_pred {
        Some(l.val(op.operands[dops.extra()])?.regs[0].into_int_value())
    } else {
        None
    };
    let site = l.new_site("cp.async.bulk.tensor");
    // Inside the ring slot (`ring_ok`: the arrays hold the boxes).
    let issue = |l: &mut Lowerer<'_, 'ctx>| {
        let copy = |l: &mut Lowerer<'_, 'ctx>| match multicast {
            Some(axes) => issue_multicast_copies(l, &blk, base, arr_off, bar, axes, site),
            None => issue_box_copies(l, &blk, base, arr_off, bar, site),
        };
        match pred {
            Some(p) => l.when(p, copy),
            None => copy(l),
        }
    };
    match (l.spec_role, slot) {
        // A warp-specialized loop's copies are the producer's.
        (SpecRole::Consumers, AsyncSlot::Next) => {}
        // (Only the producer thread runs the producer's loop.)
        (SpecRole::Producer, _) => issue(l)?,
        // The prologue's, before the block splits: the producer thread's too.
        _ if empty.is_some() => {
            let producer = l.cx.i32((l.nw * l.ws) as i64);
            let is_p =
                l.cx.b
                    .build_int_compare(inkwell::IntPredicate::EQ, l.tid, producer, "")?;
            l.when(is_p, issue)?
        }
        _ => l.in_thread0(issue)?,
    }
    l.async_issued(d, slot)?;
    let bx = &blk.bx;
    if let Some(axes) = multicast {
        let cluster = l.cluster;
        l.note(|| {
            format!(
                "TMA multicast: operand {} is the same for the blocks of a {}x{}x{} cluster along grid axis {}; its boxes are shared out among them, each copied once into all",
                ["A", "B"][which],
                cluster[0],
                cluster[1],
                cluster[2],
                (0..3)
                    .filter(|a| axes >> a & 1 == 1)
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
            )
        });
    }
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
        elem: Elem::Scalar(blk.elem),
        layout: crate::layout::Layout::blocked(&blk.ty.shape, 1, l.ws, l.nw),
        regs: Vec::new(),
        uniform: false,
    })
}

/// Box `c` of `blk`: its place in shared memory, byte `first + c * box bytes` of
/// `base` (the caller promises it is inside the boxes' memory), and its coordinates,
/// innermost first, `c * box width` columns on from the block's.
fn box_place<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    blk: &Block<'ctx>,
    base: PointerValue<'ctx>,
    first: u32,
    c: u32,
) -> LResult<(PointerValue<'ctx>, Vec<IntValue<'ctx>>)> {
    let off = l.cx.i32((first + c * blk.box_bytes) as i64);
    // SAFETY: inside the boxes' shared memory, as the caller promises.
    let at = unsafe {
        l.cx.b
            .build_in_bounds_gep(l.cx.ctx.i8_type(), base, &[off], "")?
    };
    let mut cs: Vec<IntValue<'ctx>> = blk.coords.iter().rev().copied().collect();
    if c > 0 {
        let inner = blk.bx.box_dims[blk.bx.box_dims.len() - 1];
        cs[0] =
            l.cx.b
                .build_int_add(cs[0], l.cx.i32((c * inner) as i64), "")?;
    }
    Ok((at, cs))
}

/// Thread 0's side of a TMA load of `blk`: `mbarrier.arrive.expect_tx` of the block's
/// bytes on `bar`, then one `cp.async.bulk.tensor` per box ([`box_place`] from byte
/// `first` of shared `base`). The caller promises the boxes lie in shared memory.
fn issue_box_copies<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    blk: &Block<'ctx>,
    base: PointerValue<'ctx>,
    first: u32,
    bar: PointerValue<'ctx>,
    site: u32,
) -> LResult<()> {
    l.arch
        .mbarrier_arrive_expect_tx(&l.cx, bar, blk.bytes(), site)?;
    for c in 0..blk.bx.copies {
        let (dst, cs) = box_place(l, blk, base, first, c)?;
        l.arch
            .tma_load(&l.cx, dst, blk.tmap, &cs, bar, None, site)?;
    }
    Ok(())
}

/// The multicast side of [`issue_box_copies`] for an operand shared along cluster
/// axes `axes` (the plan's `cluster.rs`): the producer announces the whole block's
/// bytes on its own `bar` (every block of the group receives all of them), then
/// issues box `c` when its rank in the group is `c % group size`, multicast to the
/// group (`mask`: the group's ranks), landing at the same offsets in each.
fn issue_multicast_copies<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    blk: &Block<'ctx>,
    base: PointerValue<'ctx>,
    first: u32,
    bar: PointerValue<'ctx>,
    axes: u8,
    site: u32,
) -> LResult<()> {
    let cluster = l.cluster;
    let group = |r: u32| tessera_ir::cluster::group(cluster, axes, r);
    let size = group(0).count_ones();
    l.arch
        .mbarrier_arrive_expect_tx(&l.cx, bar, blk.bytes(), site)?;
    let rank = l.arch.cluster_ctarank(&l.cx)?;
    let mask = l.cluster_table(rank, 8, group)?;
    let mask =
        l.cx.b
            .build_int_truncate(mask, l.cx.ctx.i16_type(), "mc.mask")?;
    let index = l.cluster_table(rank, 4, |r| (group(r) & ((1 << r) - 1)).count_ones())?;
    for c in 0..blk.bx.copies {
        let mine = l.cx.b.build_int_compare(
            inkwell::IntPredicate::EQ,
            index,
            l.cx.i32((c % size) as i64),
            "",
        )?;
        l.when(mine, |l| {
            let (dst, cs) = box_place(l, blk, base, first, c)?;
            l.arch
                .tma_load(&l.cx, dst, blk.tmap, &cs, bar, Some(mask), site)
        })?;
    }
    Ok(())
}

impl<'ctx> Lowerer<'_, 'ctx> {
    /// Initializes the mbarriers of ring `r` before its first copy: every thread is
    /// done with the mbarriers of an earlier run of the loop; thread 0 initializes
    /// them (a warp-specialized ring's empty ones with one arrival per consumer warp
    /// of each block that releases the slot); with multicasts, the cluster's blocks
    /// see each other's mbarriers initialized before any copy lands in them.
    pub(super) fn init_ring_bars(&mut self, r: &super::AsyncDot) -> LResult<()> {
        let spec = self.plan.warp_spec.as_ref().filter(|w| {
            self.plan
                .async_dots
                .get(&w.dot)
                .is_some_and(|a| a.bars == r.bars)
        });
        let empty = spec.map(|w| w.empty);
        let clustered = spec.is_some_and(|w| w.multicasts());
        let releasers = spec.map_or(1, |w| w.neighbours(self.cluster, 0).count_ones());
        self.barrier()?;
        let site = self.new_site("mbarrier.init");
        let consumer_warps = self.nw * releasers;
        let (slots, bars, tma) = (r.slots, r.bars, r.tma);
        self.in_thread0(|l| {
            for s in 0..slots {
                let bar = l.smem_at(bars + s * MBAR_BYTES);
                l.arch.mbarrier_init(&l.cx, bar, tma, site)?;
                if let Some(e) = empty {
                    let bar = l.smem_at(e + s * MBAR_BYTES);
                    l.arch.mbarrier_init(&l.cx, bar, consumer_warps, site)?;
                }
            }
            l.arch.fence_mbarrier_init(&l.cx)
        })?;
        if clustered {
            let site = self.new_site("barrier.cluster");
            self.arch.cluster_sync(&self.cx, site)
        } else {
            self.barrier()
        }
    }

    /// `f(rank)` for the cluster rank `rank` (an `i32`), read from a table of
    /// `bits`-bit entries packed into one 64-bit constant (`f`'s values fit them; a
    /// cluster has at most 8 blocks).
    pub(super) fn cluster_table(
        &self,
        rank: IntValue<'ctx>,
        bits: u32,
        f: impl Fn(u32) -> u32,
    ) -> LResult<IntValue<'ctx>> {
        let size = self.cluster.iter().product::<u32>();
        let table = (0..size).fold(0u64, |t, r| {
            t | (f(r) as u64 & ((1 << bits) - 1)) << (r * bits)
        });
        let b = &self.cx.b;
        let i64t = self.cx.ctx.i64_type();
        let r = b.build_int_z_extend(rank, i64t, "")?;
        let shift = b.build_int_mul(r, i64t.const_int(bits as u64, false), "")?;
        let v = b.build_right_shift(i64t.const_int(table, false), shift, false, "")?;
        let v = b.build_and(v, i64t.const_int((1 << bits) - 1, false), "")?;
        Ok(b.build_int_truncate(v, self.cx.ctx.i32_type(), "")?)
    }
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
    let blk = Block::of(l, op, &d, l.f.ty(op.operands[d.extra()]))?;
    blk.whole_periods(op, "store")?;
    let v = l.val(op.operands[d.extra()])?;
    // The staging box: a kernel that stores in a loop has its own (the plan's),
    // whose last stores thread 0 waits for only now, before it is written again;
    // else the scratch, which starts after the rings, on a 1024-byte boundary on
    // wgmma targets.
    let deferred = l.plan.store_staging;
    let base = match deferred {
        Some(off) => {
            let site = l.new_site("cp.async.bulk.wait_group.read");
            l.in_thread0(|l| l.arch.tma_store_wait(&l.cx, site))?;
            l.private_at(off)
        }
        None => l.scratch(blk.bytes(), &op.span),
    };
    l.barrier()?;
    let runs: Vec<u32> = (0..staging_vec(&blk).trailing_zeros())
        .map(|i| 1 << i)
        .collect();
    super::dot::write_tile(l, &v, base, &runs, |ix| staged_at(l, &blk, ix))?;
    l.arch.fence_async_shared(&l.cx)?;
    l.barrier()?;
    let site = l.new_site("cp.async.bulk.tensor");
    l.in_thread0(|l| {
        for c in 0..blk.bx.copies {
            // Inside the staging box (the block's bytes of scratch).
            let (src, cs) = box_place(l, &blk, base, 0, c)?;
            l.arch.tma_store(&l.cx, src, blk.tmap, &cs, site)?;
        }
        match deferred {
            Some(_) => Ok(()),
            None => l.arch.tma_store_wait(&l.cx, site),
        }
    })?;
    if deferred.is_none() {
        l.barrier()?;
    }
    let bx = &blk.bx;
    l.note(|| {
        format!(
            "TMA store: {} box(es) of {:?} ({}-byte swizzle) staged in shared memory{}",
            bx.copies,
            bx.box_dims,
            bx.swizzle_bytes,
            if deferred.is_some() {
                " of its own; thread 0 waits for them to read it at the next store (or the kernel's end), so they drain while the next tile computes"
            } else {
                ""
            }
        )
    });
    Ok(())
}

/// Elements per vector access of `blk`'s staging box: 16 bytes, or a box row if
/// shorter. A run of them stays inside one 16-byte chunk, which the swizzle moves
/// whole.
fn staging_vec(blk: &Block<'_>) -> u32 {
    16.min(blk.bx.swizzle_bytes) / blk.e
}

/// The place (in elements from the staging box's start) of flat element `ix` of
/// `blk`, as TMA lays out its boxes: rows of `S = swizzle_bytes` bytes (the outer
/// dimensions flattened), the boxes one after the other along the columns, and the
/// `S`-byte swizzle (byte-address bits 7.. XORed into bits 4..).
fn staged_at<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    blk: &Block<'ctx>,
    ix: IntValue<'ctx>,
) -> LResult<IntValue<'ctx>> {
    let b = &l.cx.b;
    let c = |x: u32| l.cx.i32(x as i64);
    let (bx, e) = (&blk.bx, blk.e);
    let cols = *blk.ty.shape.last().expect("rank >= 1");
    let w = bx.swizzle_bytes / e; // elements of one box row
    let mask = match bx.swizzle_bytes {
        128 => 7,
        64 => 3,
        _ => 1,
    };
    let inner = b.build_and(ix, c(cols - 1), "")?;
    let row = b.build_right_shift(ix, c(cols.trailing_zeros()), false, "")?;
    let bxi = b.build_right_shift(inner, c(w.trailing_zeros()), false, "")?;
    let within = b.build_and(inner, c(w - 1), "")?;
    let byte = b.build_int_add(
        b.build_int_add(
            b.build_int_mul(bxi, c(blk.box_bytes), "")?,
            b.build_int_mul(row, c(bx.swizzle_bytes), "")?,
            "",
        )?,
        b.build_int_mul(within, c(e), "")?,
        "",
    )?;
    let hi = b.build_and(b.build_right_shift(byte, c(7), false, "")?, c(mask), "")?;
    let swz = b.build_xor(byte, b.build_left_shift(hi, c(4), "")?, "")?;
    Ok(b.build_right_shift(swz, c(e.trailing_zeros()), false, "")?)
}

/// Lowers a `desc_load` that feeds no `dot` as TMA into a staging box in shared memory
/// (laid out as the tensor map's boxes, see [`staged_at`], 1024-byte aligned) with an
/// mbarrier after it: a barrier (others are done with the scratch); thread 0
/// initializes the mbarrier (one arrival), a barrier; thread 0 announces the block's
/// bytes and issues one `cp.async.bulk.tensor` per box; every thread waits for phase
/// 0, then reads its elements (a blocked layout, 16-byte vectors) from the box; a
/// barrier, thread 0 invalidates the mbarrier, and a barrier before the scratch is
/// used again. Elements outside the tensor read as zero (TMA's fill), as the masked
/// load of the other targets gives.
fn lower_standalone_load<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let OpKind::DescLoad { rank, .. } = op.kind else {
        unreachable!("a desc_load")
    };
    let dops = DescOperands::new(rank).map_err(LowerError::Llvm)?;
    let blk = Block::of(l, op, &dops, l.f.ty(op.results[0]))?;
    blk.whole_periods(op, "load")?;
    let total = blk.bytes();
    // The staging box (the scratch starts 1024-aligned on wgmma targets), then the
    // mbarrier (8-byte aligned: `total` is a multiple of 32).
    let base = l.scratch(total + MBAR_BYTES, &op.span);
    // SAFETY: `total` bytes into the scratch just sized to hold the mbarrier after them.
    let bar = unsafe {
        l.cx.b
            .build_in_bounds_gep(l.cx.ctx.i8_type(), base, &[l.cx.i32(total as i64)], "")?
    };
    l.barrier()?;
    let init = l.new_site("mbarrier.init");
    l.in_thread0(|l| {
        l.arch.mbarrier_init(&l.cx, bar, 1, init)?;
        l.arch.fence_mbarrier_init(&l.cx)
    })?;
    l.barrier()?;
    let site = l.new_site("cp.async.bulk.tensor");
    // Inside the staging box (`total` bytes of scratch).
    l.in_thread0(|l| issue_box_copies(l, &blk, base, 0, bar, site))?;
    let wait = l.new_site("mbarrier.try_wait");
    l.arch.mbarrier_wait(&l.cx, bar, l.cx.i32(0), wait)?;
    // Every thread reads its elements, `run` consecutive ones at a time: the blocked
    // layout's first register bits are the steps 1, 2, 4, ... of a run.
    let vec = staging_vec(&blk);
    let lay = crate::layout::Layout::blocked(&blk.ty.shape, vec, l.ws, l.nw);
    let run = vec.min(lay.numel()) as usize;
    let el = Elem::Scalar(blk.elem);
    let mt = l.mem_ty(el);
    let vt = match mt {
        inkwell::types::BasicTypeEnum::FloatType(f) => f.vec_type(run as u32),
        inkwell::types::BasicTypeEnum::IntType(i) => i.vec_type(run as u32),
        _ => return Err(LowerError::Llvm("a staging box of non-scalars".into())),
    };
    let idx = l.elem_indices(&lay)?;
    let mut regs = vec![None; idx.len()];
    for r in (0..idx.len()).step_by(run) {
        let p = l.smem_ptr(base, mt, staged_at(l, &blk, idx[r])?)?;
        let v = l.smem_load(vt.into(), p)?;
        if let Some(ld) = inkwell::values::BasicValue::as_instruction_value(&v) {
            ld.set_alignment(run as u32 * blk.e)
                .map_err(|m| LowerError::Llvm(format!("{m:?}")))?;
        }
        for (i, reg) in regs[r..r + run].iter_mut().enumerate() {
            let x =
                l.cx.b
                    .build_extract_element(v.into_vector_value(), l.cx.i32(i as i64), "")?;
            *reg = Some(l.reg_from_mem(el, x)?);
        }
    }
    l.barrier()?;
    let inval = l.new_site("mbarrier.inval");
    l.in_thread0(|l| l.arch.mbarrier_inval(&l.cx, bar, inval))?;
    l.barrier()?;
    l.note(|| {
        format!(
            "TMA load: {} box(es) of {:?} ({}-byte swizzle) staged in shared memory, completing on an mbarrier, read in {}-element vectors",
            blk.bx.copies, blk.bx.box_dims, blk.bx.swizzle_bytes, run
        )
    });
    Ok(Tile {
        elem: el,
        layout: lay,
        regs: regs
            .into_iter()
            .map(|r| r.expect("every register read"))
            .collect(),
        uniform: false,
    })
}

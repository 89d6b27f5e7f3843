//! Warp specialization of a TMA ring loop (sm_90a; see [`super::plan::WarpSpec`]):
//! where the block splits into the producer warpgroup and the consumer warps, the
//! producer's loop of copies, and the consumers' release of a ring slot.
//!
//! The ring's slots each have two mbarriers: *full* (the ring's own, completed by
//! the copies' bytes: `super::tma`) and *empty* (one arrival per consumer warp).
//! Fill `j` of the ring (the copies for iteration `j`) goes into slot `j % slots`;
//! the producer issues it once the consumers released that slot's previous use,
//! fill `j - slots`: it waits for the empty mbarrier's phase of parity
//! `(j / slots + 1) % 2` (for the first use of a slot, parity 1: the phase before
//! the first, complete from the start). The prologue's fills (before the loop, by
//! thread 0 while every thread still runs the same code) are first uses.
//!
//! The consumers release the slot read by iteration `i` once its `wgmma` groups
//! retired: at the end of iteration `i`, or of iteration `i + 1` when the ring
//! leaves the accumulator's group in flight (`wait_group 1`). Lane 0 of each warp
//! arrives, after its warp's wait and a `bar.warp.sync`.
//!
//! Ping-pong (two consumer groups, [`super::plan::WarpSpec::groups`]): group `g`
//! walks tiles `g, g + 2, ...` of the block's tiles. The producer fills the ring
//! for every tile in order, so before each of its tiles a group moves its ring
//! position past the other group's previous tile (its ring loop's trip count,
//! from the same scalars the producer computes). Named barriers 3 and 4 hand the
//! matrix units over: group `g` waits at `3 + g` before its main loop (but group
//! 0 on its first tile) and, when the other group has a next tile, arrives at
//! `4 - g` after it; each group's own barrier is `1 + g`.

use inkwell::IntPredicate;
use inkwell::values::{BasicValue, IntValue};
use tessera_ir::ir::Op;

use super::{AsyncDot, LResult, LowerError, Lowerer, SpecRole};

/// Registers per thread the producer warpgroup keeps (`setmaxnreg.dec`).
const PRODUCER_REGS: u32 = 40;

/// Registers in an SM's register file (per block, at most).
const REGISTER_FILE: u32 = 65536;

/// The placeholder global whose load stands for a ping-pong group's stride of
/// private shared memory until `smem.rs` knows it.
pub(super) const GROUP_STRIDE: &str = "__tessera_group_stride";

/// The first of the two named barriers on which ping-pong groups take turns.
const TURN_BARRIER: u32 = 3;

/// A ping-pong consumer group, from the split on.
#[derive(Clone, Copy)]
pub(crate) struct Group<'ctx> {
    /// Its number (0 or 1), an `i32`.
    pub index: IntValue<'ctx>,
    /// The byte offset of its private shared memory (its store staging box and
    /// scratch) from group 0's: `index` times the stride, which is known once the
    /// kernel is lowered; `stride` is the placeholder `smem.rs` replaces then.
    pub offset: IntValue<'ctx>,
    pub stride: IntValue<'ctx>,
}

/// The loop over tiles of a ping-pong group: the tile it computes now, and the
/// bounds and step of the block's whole walk (both groups' tiles).
#[derive(Clone, Copy)]
pub(crate) struct Walk<'ctx> {
    pub tile: IntValue<'ctx>,
    pub lb: IntValue<'ctx>,
    pub ub: IntValue<'ctx>,
    pub step: IntValue<'ctx>,
}

impl<'ctx> Lowerer<'_, 'ctx> {
    /// The registers per thread of the producer and of the consumers (`setmaxnreg`),
    /// when the block is large enough (3 warpgroups or more) that the compiler's
    /// allocation at launch is at most the consumers' share; `None`: no `setmaxnreg`.
    fn spec_registers(&self) -> Option<(u32, u32)> {
        let consumers = self.nw * self.ws * self.spec_groups();
        if consumers < 2 * 4 * self.ws {
            return None;
        }
        let share = (REGISTER_FILE - 4 * self.ws * PRODUCER_REGS) / consumers;
        Some((PRODUCER_REGS, (share - share % 8).min(240)))
    }

    /// Splits the block at warp-specialized loop `op` (its ring `r` of `dot` `d`,
    /// empty mbarriers at byte `empty`; bounds `lb`, `ub`, `step`): the producer
    /// warpgroup gives registers back, its first thread runs the loop's copies
    /// ([`Self::producer_loop`]) and the warpgroup returns; the consumers take
    /// registers and go on (the builder is left in their block, the role
    /// [`SpecRole::Consumers`] from now on).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_for_producer(
        &mut self,
        op: &Op,
        d: &Op,
        r: AsyncDot,
        empty: u32,
        lb: IntValue<'ctx>,
        ub: IntValue<'ctx>,
        step: IntValue<'ctx>,
    ) -> LResult<()> {
        self.split(|l| {
            let start = (l.cx.i32((r.ahead * r.slot_bytes) as i64), l.cx.i32(1));
            let (fill, parity) = l.producer_loop(op, d, r, empty, (lb, ub, step), start)?;
            if l.plan.warp_spec.as_ref().is_some_and(|w| w.multicasts()) {
                // (Its loop waited for every position up to `ahead` past the last
                // fill.)
                l.producer_tail(&r, empty, fill, parity, r.slots - r.ahead)?;
            }
            Ok(())
        })
    }

    /// Splits the block before the top-level loop `outer` of a persistent kernel
    /// whose body holds the warp-specialized ring loop `inner` (ring `r` of `dot`
    /// `d`, empty mbarriers at byte `empty`; the outer bounds `lb`, `ub`, `step`):
    /// the producer thread walks the same tiles, lowering the plan's outer slice of
    /// each (the scalars the ring loop needs) and issuing every fill of the ring
    /// loop ([`Self::producer_loop`] from `ahead` iterations before its start, so
    /// the fills the prologue would have issued come first), its ring position
    /// carried from tile to tile; the consumers go on as after
    /// [`Self::split_for_producer`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_persistent(
        &mut self,
        outer: &Op,
        inner: &Op,
        d: &Op,
        r: AsyncDot,
        empty: u32,
        (lb, ub, step): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    ) -> LResult<()> {
        self.split(|l| {
            let ctx = l.cx.ctx;
            let i32t = ctx.i32_type();
            let pre = l.cx.cur_block();
            let header = ctx.append_basic_block(l.kernel, "producer.tiles");
            let bb_body = ctx.append_basic_block(l.kernel, "producer.tile");
            let exit = ctx.append_basic_block(l.kernel, "producer.tiles.exit");
            l.cx.b.build_unconditional_branch(header)?;
            l.cx.b.position_at_end(header);
            let iv = l.cx.b.build_phi(lb.get_type(), "t.iv")?;
            let fill = l.cx.b.build_phi(i32t, "t.fill")?;
            let parity = l.cx.b.build_phi(i32t, "t.parity")?;
            iv.add_incoming(&[(&lb, pre)]);
            // Fill 0 is a first use: parity 1.
            fill.add_incoming(&[(&l.cx.i32(0), pre)]);
            parity.add_incoming(&[(&l.cx.i32(1), pre)]);
            let ivv = iv.as_basic_value().into_int_value();
            let more = l.cx.b.build_int_compare(IntPredicate::SLT, ivv, ub, "")?;
            let site = l.new_site("for");
            let more = l.arch.loop_continue(&l.cx, more, site)?;
            l.cx.b.build_conditional_branch(more, bb_body, exit)?;
            l.cx.b.position_at_end(bb_body);
            let (ilb, iub, istep) = l.ring_bounds(outer, inner, ivv)?;
            // Iterations `ahead` earlier: iteration `i`'s copies are those the
            // body issues for `i + ahead`.
            let b = &l.cx.b;
            let back = b.build_int_mul(istep, istep.get_type().const_int(r.ahead as u64, false), "")?;
            let plb = b.build_int_sub(ilb, back, "")?;
            let pub_ = b.build_int_sub(iub, back, "")?;
            let start = (
                fill.as_basic_value().into_int_value(),
                parity.as_basic_value().into_int_value(),
            );
            let (f2, p2) = l.producer_loop(inner, d, r, empty, (plb, pub_, istep), start)?;
            l.restore_op(outer);
            let next = l.cx.b.build_int_add(ivv, step, "t.iv.next")?;
            l.arch.loop_backedge(&l.cx)?;
            let latch = l.cx.cur_block();
            iv.add_incoming(&[(&next, latch)]);
            fill.add_incoming(&[(&f2 as &dyn BasicValue, latch)]);
            parity.add_incoming(&[(&p2 as &dyn BasicValue, latch)]);
            l.cx.b.build_unconditional_branch(header)?;
            l.cx.b.position_at_end(exit);
            if l.plan.warp_spec.as_ref().is_some_and(|w| w.multicasts()) {
                let (f, p) = start;
                l.producer_tail(&r, empty, f, p, r.slots)?;
            }
            l.note(|| {
                "persistent, warp-specialized: the producer walks the same tiles, issuing every fill of each tile's ring loop, its ring position carried across tiles".to_string()
            });
            Ok(())
        })
    }

    /// The bounds and step of ring loop `inner` in the tile `tile` of the loop over
    /// tiles `outer`: the plan's outer slice of `outer`'s body (pure scalars)
    /// lowered for it.
    fn ring_bounds(
        &mut self,
        outer: &Op,
        inner: &Op,
        tile: IntValue<'ctx>,
    ) -> LResult<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let slice = self
            .plan
            .warp_spec
            .as_ref()
            .map(|w| w.outer_slice.clone())
            .ok_or_else(|| LowerError::Llvm("a persistent walk without a plan".into()))?;
        let body = &outer.regions[0];
        let ive = self.f.ty(outer.operands[0]).elem;
        if let Some(&a) = body.args.first() {
            let t = self.scalar_tile(ive, tile.into());
            self.set(a, t);
        }
        for o in &body.ops {
            if std::ptr::eq(o, inner) {
                break;
            }
            if slice.contains(&(o as *const Op)) {
                self.lower_op(o)?;
            }
        }
        self.restore_op(outer);
        let ilb = self.val(inner.operands[0])?.regs[0].into_int_value();
        let iub = self.val(inner.operands[1])?.regs[0].into_int_value();
        let istep = self.val(inner.operands[2])?.regs[0].into_int_value();
        Ok((ilb, iub, istep))
    }

    /// Splits the block: the producer warpgroup gives registers back, its first
    /// thread runs `producer` (role [`SpecRole::Producer`]) and the warpgroup
    /// returns; the consumers take registers and go on (the builder is left in
    /// their block, the role [`SpecRole::Consumers`] from now on; ping-pong
    /// consumers numbered within their group, [`Self::group`] set).
    fn split(&mut self, producer: impl FnOnce(&mut Self) -> LResult<()>) -> LResult<()> {
        let consumers = self.nw * self.ws * self.spec_groups();
        let regs = self.spec_registers();
        let ctx = self.cx.ctx;
        let cons_bb = ctx.append_basic_block(self.kernel, "spec.consumers");
        let prod_bb = ctx.append_basic_block(self.kernel, "spec.producer");
        let thread_bb = ctx.append_basic_block(self.kernel, "spec.producer.thread");
        let done_bb = ctx.append_basic_block(self.kernel, "spec.producer.done");
        let c = self.cx.i32(consumers as i64);
        let is_cons = self
            .cx
            .b
            .build_int_compare(IntPredicate::ULT, self.tid, c, "consumer")?;
        self.cx
            .b
            .build_conditional_branch(is_cons, cons_bb, prod_bb)?;
        self.cx.b.position_at_end(prod_bb);
        if let Some((dec, _)) = regs {
            let site = self.new_site("setmaxnreg.dec");
            self.arch.setmaxnreg(&self.cx, false, dec, site)?;
        }
        let first = self
            .cx
            .b
            .build_int_compare(IntPredicate::EQ, self.tid, c, "producer")?;
        self.cx
            .b
            .build_conditional_branch(first, thread_bb, done_bb)?;
        self.cx.b.position_at_end(thread_bb);
        self.spec_role = SpecRole::Producer;
        self.note(|| {
            format!(
                "warp-specialized: thread {consumers} (a producer warpgroup past the {} consumer warps) issues the loop's copies, waiting for each slot's empty mbarrier",
                self.nw * self.spec_groups()
            )
        });
        producer(self)?;
        self.cx.b.build_unconditional_branch(done_bb)?;
        self.cx.b.position_at_end(done_bb);
        self.cx.b.build_return(None)?;
        self.cx.b.position_at_end(cons_bb);
        if let Some((_, inc)) = regs {
            let site = self.new_site("setmaxnreg.inc");
            self.arch.setmaxnreg(&self.cx, true, inc, site)?;
        }
        self.spec_role = SpecRole::Consumers;
        if self.spec_groups() > 1 {
            self.enter_group()?;
        }
        Ok(())
    }

    /// In the ping-pong consumers, after the split: the group of this thread, its
    /// thread and warp numbers within the group (the kernel's layouts are one
    /// group's), and the offset of its private shared memory.
    fn enter_group(&mut self) -> LResult<()> {
        let per = self.nw * self.ws;
        let b = &self.cx.b;
        let index = b.build_int_unsigned_div(self.tid, self.cx.i32(per as i64), "group")?;
        self.tid = b.build_int_unsigned_rem(self.tid, self.cx.i32(per as i64), "group.tid")?;
        self.warp =
            b.build_int_unsigned_rem(self.warp, self.cx.i32(self.nw as i64), "group.warp")?;
        let i32t = self.cx.ctx.i32_type();
        let g = self.cx.module.add_global(i32t, None, GROUP_STRIDE);
        g.set_linkage(inkwell::module::Linkage::Internal);
        g.set_initializer(&i32t.const_zero());
        let stride = b
            .build_load(i32t, g.as_pointer_value(), "group.stride")?
            .into_int_value();
        let offset = b.build_int_mul(index, stride, "group.offset")?;
        self.group = Some(Group {
            index,
            offset,
            stride,
        });
        self.note(|| {
            format!(
                "ping-pong: {} consumer groups of {} warps, each with its own named barrier, scratch and staging box",
                self.spec_groups(),
                self.nw
            )
        });
        Ok(())
    }

    /// The consumers' loop over tiles of a ping-pong kernel (block walk from `lb`
    /// by `step`): their group's tiles, from `lb + group * step` by `groups * step`.
    pub(super) fn group_tiles(
        &self,
        lb: IntValue<'ctx>,
        step: IntValue<'ctx>,
    ) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        let g = self
            .group
            .ok_or_else(|| LowerError::Llvm("group tiles outside a consumer group".into()))?;
        let b = &self.cx.b;
        let ty = lb.get_type();
        let gi = b.build_int_s_extend_or_bit_cast(g.index, ty, "")?;
        let first = b.build_int_add(lb, b.build_int_mul(gi, step, "")?, "group.lb")?;
        let n = ty.const_int(u64::from(self.spec_groups()), false);
        Ok((first, b.build_int_mul(step, n, "group.step")?))
    }

    /// At the top of a ping-pong group's tile (`walk`): the ring position moves past
    /// the fills of the other group's previous tile, if any (the trip count of ring
    /// loop `inner` there, lowered from the producer's scalars of `outer`).
    pub(super) fn skip_other_tile(
        &mut self,
        outer: &Op,
        inner: &Op,
        walk: Walk<'ctx>,
    ) -> LResult<()> {
        let r = self
            .plan
            .warp_spec
            .as_ref()
            .and_then(|w| self.plan.async_dots.get(&w.dot).copied())
            .ok_or_else(|| LowerError::Llvm("a ping-pong walk without its ring".into()))?;
        let (rd, ph) = self
            .ring_cursor
            .ok_or_else(|| LowerError::Llvm("a ping-pong walk without its ring position".into()))?;
        let ctx = self.cx.ctx;
        let b = &self.cx.b;
        let prev = b.build_int_sub(walk.tile, walk.step, "other.tile")?;
        let some = b.build_int_compare(IntPredicate::SGE, prev, walk.lb, "")?;
        let pre = self.cx.cur_block();
        let skip = ctx.append_basic_block(self.kernel, "pingpong.skip");
        let join = ctx.append_basic_block(self.kernel, "pingpong.join");
        b.build_conditional_branch(some, skip, join)?;
        self.cx.b.position_at_end(skip);
        let (ilb, iub, istep) = self.ring_bounds(outer, inner, prev)?;
        let b = &self.cx.b;
        // Trips of `for i in (ilb..iub).step_by(istep)`.
        let span = b.build_int_sub(iub, ilb, "")?;
        let one = istep.get_type().const_int(1, false);
        let up = b.build_int_add(span, b.build_int_sub(istep, one, "")?, "")?;
        let trips = b.build_int_signed_div(up, istep, "")?;
        let ran = b.build_int_compare(IntPredicate::SGT, iub, ilb, "")?;
        let zero = istep.get_type().const_zero();
        let trips = b.build_select(ran, trips, zero, "")?.into_int_value();
        let trips = b.build_int_truncate_or_bit_cast(trips, ctx.i32_type(), "other.trips")?;
        // Position `rd / slot_bytes + trips` of the ring; each wrap flips the parity.
        let slot = b.build_int_unsigned_div(rd, self.cx.i32(r.slot_bytes as i64), "")?;
        let pos = b.build_int_add(slot, trips, "")?;
        let slots = self.cx.i32(r.slots as i64);
        let at = b.build_int_mul(
            b.build_int_unsigned_rem(pos, slots, "")?,
            self.cx.i32(r.slot_bytes as i64),
            "",
        )?;
        let wraps = b.build_int_unsigned_div(pos, slots, "")?;
        let flip = b.build_and(wraps, self.cx.i32(1), "")?;
        let ph2 = b.build_xor(ph, flip, "")?;
        let end = self.cx.cur_block();
        b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(join);
        let i32t = ctx.i32_type();
        let (nrd, nph) = (
            self.cx.b.build_phi(i32t, "cursor.read.skipped")?,
            self.cx.b.build_phi(i32t, "cursor.phase.skipped")?,
        );
        nrd.add_incoming(&[(&rd, pre), (&at, end)]);
        nph.add_incoming(&[(&ph, pre), (&ph2, end)]);
        self.ring_cursor = Some((
            nrd.as_basic_value().into_int_value(),
            nph.as_basic_value().into_int_value(),
        ));
        self.note(|| {
            "ping-pong: the ring position moves past the other group's previous tile (its ring loop's trip count)".to_string()
        });
        Ok(())
    }

    /// Before a ping-pong group's main loop: its turn, once the other group's
    /// main loop of the previous tile was issued (none before group 0's first).
    pub(super) fn await_turn(&mut self) -> LResult<()> {
        let (Some(g), Some(w)) = (self.group, self.pingpong) else {
            return Ok(());
        };
        let b = &self.cx.b;
        let is0 = b.build_int_compare(IntPredicate::EQ, g.index, self.cx.i32(0), "")?;
        let first = b.build_int_compare(IntPredicate::EQ, w.tile, w.lb, "")?;
        let none = b.build_and(is0, first, "")?;
        let wait = b.build_not(none, "")?;
        let threads = 2 * self.nw * self.ws;
        let site = self.new_site("bar.sync");
        self.note(|| {
            "ping-pong: the group waits for its turn on named barrier 3 + group before its main loop".to_string()
        });
        self.when(wait, |l| {
            l.per_group(|l, g| l.arch.named_barrier(&l.cx, TURN_BARRIER + g, threads, site))
        })
    }

    /// `emit(self, g)` in the threads of consumer group `g`, for each group (a
    /// branch per group, so that named barrier ids stay constants, which ptxas
    /// counts); just `emit(self, 0)` without groups.
    pub(super) fn per_group(&self, emit: impl Fn(&Self, u32) -> LResult<()>) -> LResult<()> {
        let Some(grp) = self.group else {
            return emit(self, 0);
        };
        for g in 0..self.spec_groups() {
            let b = &self.cx.b;
            let mine =
                b.build_int_compare(IntPredicate::EQ, grp.index, self.cx.i32(g as i64), "")?;
            let then = self.cx.ctx.append_basic_block(self.kernel, "group");
            let join = self.cx.ctx.append_basic_block(self.kernel, "group.join");
            b.build_conditional_branch(mine, then, join)?;
            b.position_at_end(then);
            emit(self, g)?;
            self.cx.b.build_unconditional_branch(join)?;
            self.cx.b.position_at_end(join);
        }
        Ok(())
    }

    /// After a ping-pong group's main loop: the turn passes to the other group,
    /// when it has a next tile.
    pub(super) fn pass_turn(&mut self) -> LResult<()> {
        let (Some(_), Some(w)) = (self.group, self.pingpong) else {
            return Ok(());
        };
        let b = &self.cx.b;
        let next = b.build_int_add(w.tile, w.step, "")?;
        let more = b.build_int_compare(IntPredicate::SLT, next, w.ub, "")?;
        let threads = 2 * self.nw * self.ws;
        let site = self.new_site("bar.arrive");
        self.note(|| {
            "ping-pong: the turn passes to the other group (bar.arrive on its named barrier) after the main loop".to_string()
        });
        // Group `g` arrives at the barrier of group `1 - g`.
        self.when(more, |l| {
            l.per_group(|l, g| {
                l.arch
                    .named_barrier_arrive(&l.cx, TURN_BARRIER + 1 - g, threads, site)
            })
        })
    }

    /// The producer thread's loop: the iterations `(lb, ub, step)` of `op`, each
    /// waiting for the empty mbarrier of the slot it fills, then lowering the
    /// plan's slice of the body (the copies for iteration `i + ahead` and what they
    /// need). The first fill goes to byte offset `start.0` of the ring with
    /// empty-mbarrier parity `start.1`; returns the position after the last.
    #[allow(clippy::type_complexity)]
    fn producer_loop(
        &mut self,
        op: &Op,
        d: &Op,
        r: AsyncDot,
        empty: u32,
        (lb, ub, step): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
        start: (IntValue<'ctx>, IntValue<'ctx>),
    ) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        let slice = self
            .plan
            .warp_spec
            .as_ref()
            .map(|w| w.slice.clone())
            .ok_or_else(|| LowerError::Llvm("a producer loop without a plan".into()))?;
        let body = &op.regions[0];
        let ctx = self.cx.ctx;
        let i32t = ctx.i32_type();
        let pre = self.cx.cur_block();
        let header = ctx.append_basic_block(self.kernel, "producer.header");
        let bb_body = ctx.append_basic_block(self.kernel, "producer.body");
        let exit = ctx.append_basic_block(self.kernel, "producer.exit");
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(header);
        let iv = self.cx.b.build_phi(lb.get_type(), "p.iv")?;
        let fill = self.cx.b.build_phi(i32t, "p.fill")?;
        let parity = self.cx.b.build_phi(i32t, "p.parity")?;
        iv.add_incoming(&[(&lb, pre)]);
        fill.add_incoming(&[(&start.0, pre)]);
        parity.add_incoming(&[(&start.1, pre)]);
        let ivv = iv.as_basic_value().into_int_value();
        let fv = fill.as_basic_value().into_int_value();
        let pv = parity.as_basic_value().into_int_value();
        let more = self
            .cx
            .b
            .build_int_compare(IntPredicate::SLT, ivv, ub, "")?;
        let site = self.new_site("for");
        let more = self.arch.loop_continue(&self.cx, more, site)?;
        self.cx.b.build_conditional_branch(more, bb_body, exit)?;
        self.cx.b.position_at_end(bb_body);
        let bar = self.slot_bar(&r, empty, fv)?;
        let site = self.new_site("mbarrier.try_wait");
        self.arch.mbarrier_wait(&self.cx, bar, pv, site)?;
        let ive = self.f.ty(op.operands[0]).elem;
        if let Some(&a) = body.args.first() {
            let t = self.scalar_tile(ive, ivv.into());
            self.set(a, t);
        }
        self.async_slots
            .borrow_mut()
            .insert(d as *const Op, (fv, fv));
        for o in &body.ops {
            if slice.contains(&(o as *const Op)) {
                self.lower_op(o)?;
            }
        }
        self.async_slots.borrow_mut().remove(&(d as *const Op));
        self.restore_op(op);
        let b = &self.cx.b;
        let n = b.build_int_add(fv, self.cx.i32(r.slot_bytes as i64), "")?;
        let size = self.cx.i32((r.slots * r.slot_bytes) as i64);
        let wrap = b.build_int_compare(IntPredicate::EQ, n, size, "")?;
        let next_fill = b
            .build_select(wrap, self.cx.i32(0), n, "")?
            .into_int_value();
        let flip = b.build_xor(pv, self.cx.i32(1), "")?;
        let next_parity = b.build_select(wrap, flip, pv, "")?.into_int_value();
        let next = b.build_int_add(ivv, step, "p.iv.next")?;
        self.arch.loop_backedge(&self.cx)?;
        let latch = self.cx.cur_block();
        iv.add_incoming(&[(&next, latch)]);
        fill.add_incoming(&[(&next_fill as &dyn BasicValue, latch)]);
        parity.add_incoming(&[(&next_parity as &dyn BasicValue, latch)]);
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(exit);
        Ok((fv, pv))
    }

    /// After the producer's loop of a multicasting ring (its next fill at byte
    /// offset `fill` with empty-mbarrier parity `parity`): the producer waits until
    /// the consumers of every block that releases its slots (its cluster
    /// neighbours) released the loop's last fills, continuing its sequence of waits
    /// for `count` more fills (those not waited for yet). Until then those blocks
    /// may still arrive on this block's mbarriers, so it must not exit.
    fn producer_tail(
        &mut self,
        r: &AsyncDot,
        empty: u32,
        fill: IntValue<'ctx>,
        parity: IntValue<'ctx>,
        count: u32,
    ) -> LResult<()> {
        let (mut f, mut p) = (fill, parity);
        let size = self.cx.i32((r.slots * r.slot_bytes) as i64);
        for _ in 0..count {
            let bar = self.slot_bar(r, empty, f)?;
            let site = self.new_site("mbarrier.try_wait");
            self.arch.mbarrier_wait(&self.cx, bar, p, site)?;
            let b = &self.cx.b;
            let n = b.build_int_add(f, self.cx.i32(r.slot_bytes as i64), "")?;
            let wrap = b.build_int_compare(IntPredicate::EQ, n, size, "")?;
            f = b
                .build_select(wrap, self.cx.i32(0), n, "")?
                .into_int_value();
            let flip = b.build_xor(p, self.cx.i32(1), "")?;
            p = b.build_select(wrap, flip, p, "")?.into_int_value();
        }
        self.note(|| {
            format!(
                "warp-specialized, multicast: the producer waits for the release of the last {count} fills before it exits (the cluster's consumers arrive on its mbarriers)"
            )
        });
        Ok(())
    }

    /// At the end of an iteration of the warp-specialized loop (iteration value
    /// `iv`, first `lb`; `rd` the byte offset of the slot it read): lane 0 of each
    /// consumer warp releases the slot whose `wgmma` groups retired, the one read
    /// now, or with a group left in flight the one read by the previous iteration
    /// (none in the first).
    pub(super) fn release_slot(
        &mut self,
        r: &AsyncDot,
        empty: u32,
        iv: IntValue<'ctx>,
        lb: IntValue<'ctx>,
        rd: IntValue<'ctx>,
    ) -> LResult<()> {
        let b = &self.cx.b;
        let lane0 = b.build_int_compare(IntPredicate::EQ, self.lane, self.cx.i32(0), "")?;
        let (slot, cond) = if r.overlap.is_some() {
            let is0 = b.build_int_compare(IntPredicate::EQ, rd, self.cx.i32(0), "")?;
            let back = b.build_int_sub(rd, self.cx.i32(r.slot_bytes as i64), "")?;
            let last = self.cx.i32(((r.slots - 1) * r.slot_bytes) as i64);
            let prev = b.build_select(is0, last, back, "")?.into_int_value();
            let later = b.build_int_compare(IntPredicate::NE, iv, lb, "")?;
            (prev, b.build_and(lane0, later, "")?)
        } else {
            (rd, lane0)
        };
        let multicasts = self.plan.warp_spec.as_ref().is_some_and(|w| w.multicasts());
        self.note(|| {
            format!(
                "warp-specialized: {} of each consumer warp releases {} on {}",
                if multicasts { "lane q" } else { "lane 0" },
                if r.overlap.is_some() {
                    "the previous iteration's slot (its wgmma group retired)"
                } else {
                    "the slot read"
                },
                if multicasts {
                    "the empty mbarrier of cluster rank q, for each block multicasting into this one"
                } else {
                    "its empty mbarrier"
                }
            )
        });
        let bar = self.slot_bar(r, empty, slot)?;
        // Every lane's reads are behind lane 0's arrival.
        let site = self.new_site("bar.warp.sync");
        self.arch.warp_sync(&self.cx, site)?;
        let site = self.new_site("mbarrier.arrive");
        let Some(w) = self.plan.warp_spec.as_ref().filter(|w| w.multicasts()) else {
            return self.when(cond, |l| l.arch.mbarrier_arrive(&l.cx, bar, site));
        };
        // Multicast: the slot is released to every block whose copies land in it,
        // lane `q` arriving on the mbarrier of cluster rank `q`.
        let (mc, cluster) = (w.multicast, self.cluster);
        let rank = self.arch.cluster_ctarank(&self.cx)?;
        let nb = self.cluster_table(rank, 8, |q| tessera_ir::cluster::groups(cluster, &mc, q))?;
        let b = &self.cx.b;
        let bit = b.build_and(
            b.build_right_shift(nb, self.lane, false, "")?,
            self.cx.i32(1),
            "",
        )?;
        let mine = b.build_int_compare(IntPredicate::NE, bit, self.cx.i32(0), "")?;
        let later = if r.overlap.is_some() {
            b.build_int_compare(IntPredicate::NE, iv, lb, "")?
        } else {
            self.cx.ctx.bool_type().const_int(1, false)
        };
        let cond = b.build_and(mine, later, "")?;
        let lane = self.lane;
        self.when(cond, |l| {
            l.arch.mbarrier_arrive_cluster(&l.cx, bar, lane, site)
        })
    }
}

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

use inkwell::IntPredicate;
use inkwell::values::{BasicValue, IntValue};
use tessera_ir::ir::Op;

use super::{AsyncDot, LResult, LowerError, Lowerer, SpecRole};

/// Registers per thread the producer warpgroup keeps (`setmaxnreg.dec`).
const PRODUCER_REGS: u32 = 40;

/// Registers in an SM's register file (per block, at most).
const REGISTER_FILE: u32 = 65536;

impl<'ctx> Lowerer<'_, 'ctx> {
    /// The registers per thread of the producer and of the consumers (`setmaxnreg`),
    /// when the block is large enough (3 warpgroups or more) that the compiler's
    /// allocation at launch is at most the consumers' share; `None`: no `setmaxnreg`.
    fn spec_registers(&self) -> Option<(u32, u32)> {
        let consumers = self.nw * self.ws;
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
        let slice = self
            .plan
            .warp_spec
            .as_ref()
            .map(|w| w.outer_slice.clone())
            .ok_or_else(|| LowerError::Llvm("a persistent producer without a plan".into()))?;
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
            let body = &outer.regions[0];
            let ive = l.f.ty(outer.operands[0]).elem;
            if let Some(&a) = body.args.first() {
                let t = l.scalar_tile(ive, ivv.into());
                l.set(a, t);
            }
            for o in &body.ops {
                if std::ptr::eq(o, inner) {
                    break;
                }
                if slice.contains(&(o as *const Op)) {
                    l.lower_op(o)?;
                }
            }
            l.restore_op(outer);
            let ilb = l.val(inner.operands[0])?.regs[0].into_int_value();
            let iub = l.val(inner.operands[1])?.regs[0].into_int_value();
            let istep = l.val(inner.operands[2])?.regs[0].into_int_value();
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

    /// Splits the block: the producer warpgroup gives registers back, its first
    /// thread runs `producer` (role [`SpecRole::Producer`]) and the warpgroup
    /// returns; the consumers take registers and go on (the builder is left in
    /// their block, the role [`SpecRole::Consumers`] from now on).
    fn split(&mut self, producer: impl FnOnce(&mut Self) -> LResult<()>) -> LResult<()> {
        let consumers = self.nw * self.ws;
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
                self.nw
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
        Ok(())
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
